"""The workbook as a user installs it into their own environment: a wheel, run from an empty folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

INSTRUMENTED_LOOP = textwrap.dedent("""
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            time.sleep(0.003)
            return torch.randn(8), torch.tensor(i % 2)

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Slow(), batch_size=8)
    from helpers.workbook.instrument import instrument          # 1
    steps = instrument(loader, device="cpu")                    # 2
    for x, y in steps:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    steps.report()                                              # 3
""")


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.slow
def test_the_wheel_installs_and_runs_from_an_empty_folder(tmp_path):
    # the user's environment knows nothing of this checkout: no PYTHONPATH (it would show the checkout's
    # build metadata to pip as an installed copy) and none of the test session's WORKBOOK_* folders
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBOOK_") and k != "PYTHONPATH"}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), WORKBOOK_HEADLESS="1")
    # pip installs without compiling every module's bytecode (--no-compile: half of the install's minute on 2 cores)
    # and the venv's Pythons write it for the modules they import, once (a session may forbid that)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(ROOT)], check=True, timeout=600, env=env)
    wheel = next(wheels.glob("training_perf_workbook-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=env)
    py = venv / "bin" / "python"
    # A new environment holding the wheel alone, its dependencies taken from this checkout's environment (a path
    # line in a .pth file: that folder's own .pth files, among them this checkout's editable install, are not
    # read). Installing them all from the package indexes took 28 s of this test's 110 s, and importing them for the
    # first time compiled their bytecode again; that the wheel declares what the workbook imports is
    # test_the_wheel_declares_every_package_the_workbook_imports below.
    deps = Path(sysconfig.get_paths()["purelib"])  # this checkout's environment's site-packages
    own_site = next((venv / "lib").glob("python3*/site-packages"))
    (own_site / "workbook_test_dependencies.pth").write_text(f"{deps}\n")
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-compile", "--no-deps", str(wheel)], check=True,
                   timeout=600, env=env, cwd=tmp_path)
    site = Path(subprocess.run([str(py), "-c", "import helpers, pathlib; print(pathlib.Path(helpers.__file__).parent)"],
                               capture_output=True, text=True, check=True, env=env, cwd=tmp_path).stdout.strip())
    assert str(site).startswith(str(venv)), site  # the installed copy, not the checkout
    before = _files(site)
    work = tmp_path / "empty"
    work.mkdir()

    def call(*args, timeout=900):
        p = subprocess.run(list(args), cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, (args, p.stdout[-2000:], p.stderr[-3000:])
        return p.stdout

    out = call(str(venv / "bin" / "workbook"), "run", "--profile", "smoke", "--only", "00", "01", "--device", "cpu")
    runs = list((work / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "report.html").is_file() and f"Report: {runs[0]}" in out.replace("./", "")
    records = [json.loads(line) for line in (runs[0] / "results.jsonl").read_text().splitlines()]
    assert {r["notebook"] for r in records if r["experiment"] == "verdict"} >= {"00_environment_check",
                                                                               "01_baseline_profiling"}
    trace = next((runs[0] / "artifacts").rglob("*.pt.trace.json"))  # the trace notebook 01 wrote, read back
    traced = json.loads(call(str(py), "-m", "helpers", "trace", str(trace), "--json", "--out", str(work / "tr")))
    assert traced["verdict"] in ("host-bound", "balanced", "device-bound") and traced["next"]
    assert (work / "tr" / "report.html").is_file() and (work / "tr" / "results.jsonl").is_file()
    diag = json.loads(call(str(py), "-m", "helpers", "diagnose", "--job", "helpers.bundled.examples.image_classifier",
                           "--device", "cpu", "--steps", "4", "--warmup-steps", "1", "--json"))
    assert diag["measured_recommendation"] in ("host-bound", "balanced", "device-bound") and diag["next_notebook"]
    (work / "train.py").write_text(INSTRUMENTED_LOOP)
    report = call(str(py), "train.py")
    assert "your loop: 5 steps measured" in report and "host-bound" in report.lower()  # HOST-BOUND: ... first
    assert "next: notebook 03" in report or "next: notebook 02" in report  # 02 where no core is idle for workers
    copied = call(str(venv / "bin" / "workbook"), "notebooks", "mine")
    assert "11 notebooks in mine" in copied and (work / "mine" / "profiles" / "quick.yaml").is_file()
    assert _files(site) == before  # nothing written inside site-packages
    assert (tmp_path / "cache" / "training-perf-workbook" / "data").is_dir()  # the embedded photos: a user cache


#: Packages the workbook imports only where present, each said to the user when missing: the NPU build (an extra,
#: and it needs CANN), torchvision (batched GPU decode on CUDA, helpers.pipeline.decode) and HTA (timed beside the
#: trace reader by `bench trace`, a test extra; helpers.traces.readbench).
OPTIONAL_IMPORTS = {"torch_npu", "torchvision", "hta"}


def test_the_wheel_declares_every_package_the_workbook_imports():
    """Every package that a module of helpers/ imports (at its top or inside a function) is one that a ``pip install``
    of the wheel brings: a dependency of pyproject's ``[project] dependencies`` or one of theirs (their own
    requirements, without extras), read from this environment's installed metadata. A package that only the test
    extra installs (pytest-xdist, playwright) fails here; filelock passes, torch requires it."""
    import ast
    import importlib.metadata as md
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    declared = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    brought, todo = set(), [r.name for r in declared]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in brought:
            continue
        brought.add(name)
        try:
            requires = md.distribution(name).requires or []
        except md.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    imported: dict[str, set[str]] = {}
    for path in (ROOT / "helpers").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"helpers"}:
                imported.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    assert {"torch", "pandas", "libcst", "papermill"} <= set(imported)  # the scan sees the imports
    providers = md.packages_distributions()
    missing = {top: sorted(where)[:3] for top, where in imported.items() if top not in OPTIONAL_IMPORTS
               and not {canonicalize_name(d) for d in providers.get(top, [top])} & brought}
    assert missing == {}, f"imported by helpers/ but not brought by pyproject's dependencies: {missing}"
