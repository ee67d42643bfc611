"""The import contract of helpers (docs/architecture.md): layers point one way, siblings form no cycle.

Layers, top down: workbook -> (experiments, tune) -> jobs -> (pipeline, compute, comm, diagnose) -> foundation (the
modules directly in helpers/). Every import in every module is read, those inside functions included. A module
may import its own layer or a lower one; the packages of the mechanism layer may import each other but not in
a circle; no two modules import each other, directly or around a loop; matplotlib and ipywidgets are imported
only in workbook/ (plots and widgets are the workbook's concern).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parents[1] / "helpers"

#: Rank of each layer: a module may import only modules of the same or a lower rank.
LAYERS = {"foundation": 0, "pipeline": 1, "compute": 1, "comm": 1, "diagnose": 1, "traces": 1, "jobs": 2, "experiments": 3, "tune": 3,
          "workbook": 4, "entry": 5}
#: Libraries that belong to the workbook layer only.
PRESENTATION = ("matplotlib", "ipywidgets", "IPython.display")


def module_name(path: Path) -> str:
    parts = path.relative_to(HELPERS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    """The layer of ``helpers.x.y``: its subpackage, or "foundation" for a module directly in helpers/."""
    parts = module.split(".")
    if parts == ["helpers"] or len(parts) == 2 and parts[1] != "__main__" and parts[1] not in LAYERS:
        return "foundation"
    if parts[1] == "__main__":
        return "entry"
    return parts[1] if parts[1] in LAYERS else "foundation"


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def read_imports(root: Path = HELPERS) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> helpers modules it imports, module -> other top-level libraries it imports), at any depth."""
    internal: dict[str, set[str]] = defaultdict(set)
    external: dict[str, set[str]] = defaultdict(set)
    modules = {module_name(p) for p in root.rglob("*.py")}
    for path in sorted(root.rglob("*.py")):
        mod = module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(mod, path.name == "__init__.py", node)
                # "from helpers.pipeline import loader" imports the module helpers.pipeline.loader
                names = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
            else:
                continue
            for name in names:
                if name == "helpers" or name.startswith("helpers."):
                    while name not in modules and "." in name:
                        name = name.rsplit(".", 1)[0]
                    if name != mod:
                        internal[mod].add(name)
                else:
                    external[mod].add(name)
    return internal, external


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Imports of a higher layer than the importer's."""
    out = []
    for mod, targets in sorted(edges.items()):
        for t in sorted(targets):
            if t == "helpers":  # the package itself (its version); holds no code of any layer
                continue
            if LAYERS[layer_of(t)] > LAYERS[layer_of(mod)]:
                out.append(f"{mod} ({layer_of(mod)}) imports {t} ({layer_of(t)})")
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(set(edges) | {t for ts in edges.values() for t in ts}):
        if v not in index:
            visit(v)
    return found


def package_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Imports between the packages of the mechanism layer (pipeline, compute, comm, diagnose)."""
    out: dict[str, set[str]] = defaultdict(set)
    for mod, targets in edges.items():
        a = layer_of(mod)
        for t in targets:
            b = layer_of(t)
            if a != b and LAYERS.get(a) == LAYERS.get(b) == 1:
                out[a].add(b)
    return out


def presentation_imports(external: dict[str, set[str]]) -> list[str]:
    return [f"{mod} imports {lib}" for mod, libs in sorted(external.items()) for lib in sorted(libs)
            if layer_of(mod) != "workbook" and lib.startswith(PRESENTATION)]


# ------------------------------------------------------------------------------------------ the contract

EDGES, EXTERNAL = read_imports()


def test_the_reader_sees_every_module_and_function_level_imports():
    assert "helpers.jobs.ppo" in EDGES and "helpers.pipeline.fast" in EDGES["helpers.jobs.ppo"]
    # bench imports the experiments inside its function (after preparing the torch import): read too
    source = (HELPERS / "workbook" / "bench.py").read_text()
    assert "\n    from helpers.experiments.decode import" in source
    assert "helpers.experiments.decode" in EDGES["helpers.workbook.bench"]


def test_no_module_imports_a_layer_above_it():
    assert upward_imports(EDGES) == []


def test_no_import_cycle_between_modules():
    assert cycles(EDGES) == []


def test_no_cycle_between_the_mechanism_packages():
    assert cycles(package_edges(EDGES)) == []


def test_plots_and_widgets_only_in_the_workbook_layer():
    assert presentation_imports(EXTERNAL) == []


# ------------------------------------------------------------------------------------------ the checker fails


@pytest.mark.parametrize("importer, target", [
    ("helpers.pipeline.prefetch", "helpers.workbook.specs"),
    ("helpers.device", "helpers.diagnose.npu_probe"),
    ("helpers.compute.memory", "helpers.jobs.ppo"),
    ("helpers.jobs.ppo", "helpers.experiments.training"),
    ("helpers.experiments.endtoend", "helpers.workbook.report"),
])
def test_an_upward_import_is_caught(importer, target):
    assert upward_imports({importer: {target}}) == [
        f"{importer} ({layer_of(importer)}) imports {target} ({layer_of(target)})"]


def test_the_cycles_the_restructuring_removed_are_caught():
    # comm/allreduce.py with comm/worker.py, and pipeline/decode.py with pipeline/fast.py
    assert cycles({"helpers.comm.allreduce": {"helpers.comm.worker"},
                   "helpers.comm.worker": {"helpers.comm.allreduce"}}) == [
        ["helpers.comm.allreduce", "helpers.comm.worker"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    # pipeline and compute importing each other
    mixed = {"helpers.pipeline.fast": {"helpers.compute.train"}, "helpers.compute.memory": {"helpers.pipeline.fast"}}
    assert cycles(package_edges(mixed)) == [["compute", "pipeline"]]


def test_a_plot_below_the_workbook_is_caught():
    assert presentation_imports({"helpers.experiments.overlap": {"matplotlib.pyplot"}}) == [
        "helpers.experiments.overlap imports matplotlib.pyplot"]
    assert presentation_imports({"helpers.workbook.plots": {"matplotlib"}}) == []


def test_layers_of_names():
    assert layer_of("helpers.verdict") == layer_of("helpers.checklist") == "foundation"
    assert layer_of("helpers.experiments.overlap") == "experiments"
    assert layer_of("helpers.__main__") == "entry"


def test_the_command_line_and_runner_import_no_torch():
    """`env check`, `data` and `--help` never import torch (a broken torch_npu autoload would crash them);
    the runner and bench import it only after the torch_npu probe (helpers/workbook/cli.py, bench.py); tune's
    session only in the runs it starts and where it writes the side-stream prefetcher."""
    import subprocess
    import sys

    code = ("import sys; import helpers.workbook.cli, helpers.workbook.runner, helpers.workbook.bench; "
            "import helpers.tune.session; print('torch' in sys.modules)")  # tune refuses bad flags in a blink
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=HELPERS.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- one way into the results; thin notebooks

NOTEBOOKS = sorted((HELPERS.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
#: Writing to a results store from a notebook or an experiment, around ``ctx.record(result)``.
AROUND_RECORD = ("ctx.store", ".add_verdict(", "store.add", "store.verdict(", "store.write(", "ResultsStore(")


def code_cells(path: Path) -> list[str]:
    import json

    nb = json.loads(path.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def code_lines(source: str) -> int:
    return sum(1 for line in source.splitlines() if line.strip())


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_writes_results_only_through_ctx_record(path):
    found = [(i, s) for i, c in enumerate(code_cells(path)) for s in AROUND_RECORD if s in c]
    assert not found, f"{path.name} writes results around ctx.record(result): {found}"
    calls = sum(c.count("ctx.record(") for c in code_cells(path))
    assert calls == 1, f"{path.name} calls ctx.record {calls} times: one result per notebook, recorded once"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_notebook_cell_is_a_call_a_plot_or_a_print(path):
    """HTA's and numpy-tutorials' habit: the interpretation lives behind the call, so a cell stays short."""
    sizes = sorted(code_lines(c) for c in code_cells(path)[1:])  # the parameters cell aside
    assert max(sizes) <= 15, f"{path.name}: a code cell of {max(sizes)} lines (at most 15)"
    assert sizes[len(sizes) // 2] <= 4 or sizes[(len(sizes) - 1) // 2] <= 4, (
        f"{path.name}: median code cell of {sizes[len(sizes) // 2]} lines (at most 4): {sizes}")
    text = "\n".join(code_cells(path))
    assert "user_job" not in text and 'if P["job"]' not in text, f"{path.name} forks on the user's job"


def test_no_experiment_writes_to_a_store():
    offenders = []
    for path in sorted((HELPERS / "experiments").glob("*.py")):
        text = path.read_text()
        offenders += [(path.name, s) for s in AROUND_RECORD if s in text]
    assert not offenders, f"an experiment writes results itself (it should return them in records()): {offenders}"


def test_no_experiment_asks_which_class_a_job_is():
    import re

    offenders = []
    for path in sorted(HELPERS.rglob("*.py")):
        if "jobs" in path.relative_to(HELPERS).parts:
            continue
        offenders += [f"{path.relative_to(HELPERS)}:{m.group(0)}"
                      for m in re.finditer(r"isinstance\([^)]*(PPOJob|SupervisedJob)[^)]*\)", path.read_text())]
    assert not offenders, f"ask the Job what it can do (helpers/jobs/base.py), not its class: {offenders}"
