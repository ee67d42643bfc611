"""Every torch_npu / torch.npu name the workbook writes exists in the torch_npu 2.13.0 wheel.

The workbook's names are read from helpers/**/*.py (code, docstrings, messages and the Python scripts held in
strings, e.g. npu_probe's child script) and from the notebooks' cells (code and prose): each spelled
``torch_npu.a.b`` or ``torch.npu.a``, each ``from torch_npu.x import y``, and the names reached through the device
abstraction, where the module is picked by kind (``getattr(torch, kind)``, ``torch.get_device_module(kind)``,
helpers.device's ``_memory_api``): with kind "npu" those are ``torch.npu``, so ``getattr(torch, kind).set_device``
is ``torch.npu.set_device``. The wheel's names are read from its source (tests/npu_wheel.py ``WheelNames``; the
wheel is found or downloaded as tests/npu_wheel.py says, and the test is skipped only when it cannot be).
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.npu_wheel import wheel_names

ROOT = Path(__file__).resolve().parents[1]
SPELLED = re.compile(r"(?<![\w.])(?:torch_npu|torch\.npu)(?:\.[A-Za-z_]\w*)+")
#: Names that stand for ``torch`` in the workbook's code (helpers.device passes it as ``torch_mod``).
TORCH_NAMES = {"torch", "torch_mod"}
#: helpers.device's function that returns ``torch.accelerator.memory`` or, failing that, ``torch.<kind>``.
DEVICE_MODULE_FUNCTIONS = {"_memory_api"}


@dataclass(frozen=True, order=True)
class Use:
    """One name the workbook writes or reaches; ``probe``: looked up with hasattr or getattr(..., default), so the
    code runs on where it is missing."""

    where: str
    line: int
    name: str
    probe: bool = False


#: Probes of names torch_npu lacks, each with the reason the workbook is right to probe (the test fails when one
#: appears or goes): compute/batch_finder.py asks the memory API for torch.accelerator.memory's get_memory_info and
#: falls back to the device module's mem_get_info, which torch.npu has.
EXPECTED_MISSING_PROBES = {"torch.npu.get_memory_info"}


def _is_npu(dotted: str | None) -> bool:
    return bool(dotted) and (dotted.startswith("torch_npu.") or dotted.startswith("torch.npu."))


class _Scope(ast.NodeVisitor):
    """The torch_npu / torch.npu names one function (or module) body reaches, with its local aliases."""

    def __init__(self, where: str, offset: int, aliases: dict[str, str], found: set[Use]):
        self.where, self.offset, self.aliases, self.found = where, offset, dict(aliases), found

    def run(self, body: list[ast.stmt]) -> None:
        own, nested = _split(body)
        for sub in sorted((n for n in own if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
            if len(sub.targets) == 1 and isinstance(sub.targets[0], ast.Name):  # aliases first, in line order
                value = self.resolve(sub.value)
                if value in ("torch_npu", "torch.npu") or _is_npu(value):
                    self.aliases[sub.targets[0].id] = value
        for sub in own:
            self.record(sub)
        for node in nested:
            _Scope(self.where, self.offset, self.aliases, self.found).run(node.body)

    def resolve(self, node: ast.AST) -> str | None:
        """The dotted name an expression stands for, where it is torch, torch_npu or a part of them."""
        if isinstance(node, ast.Name):
            if node.id in self.aliases:
                return self.aliases[node.id]
            return "torch" if node.id in TORCH_NAMES else "torch_npu" if node.id == "torch_npu" else None
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.BoolOp):
            values = [self.resolve(v) for v in node.values]
            return next((v for v in values if v and (v == "torch.npu" or _is_npu(v))), None)
        if isinstance(node, ast.Call):
            return self._call(node)
        return None

    def _call(self, node: ast.Call) -> str | None:
        func = node.func
        fname = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if fname == "getattr" and len(node.args) >= 2:
            base = self.resolve(node.args[0])
            key = node.args[1]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                return f"{base}.{key.value}" if base else None
            # getattr(torch, kind): the device module, when the key is the device kind (kind, acc.kind, ...)
            return "torch.npu" if base == "torch" and ast.unparse(key).endswith("kind") else None
        if fname == "get_device_module" and isinstance(func, ast.Attribute) and self.resolve(func.value) == "torch":
            return "torch.npu"
        if fname in DEVICE_MODULE_FUNCTIONS:
            return "torch.npu"
        if fname == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
            return node.args[0].value if str(node.args[0].value).startswith("torch_npu") else None
        return None

    def record(self, node: ast.AST) -> None:
        name, probe = None, False
        if isinstance(node, ast.Attribute):
            name = self.resolve(node)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "hasattr") \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            base = self.resolve(node.args[0])
            name = f"{base}.{node.args[1].value}" if base else None
            probe = node.func.id == "hasattr" or len(node.args) == 3
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch_npu"):
            for a in node.names:
                if a.name != "*":
                    self.found.add(Use(self.where, self.offset + node.lineno - 1, f"{node.module}.{a.name}"))
        if _is_npu(name):
            self.found.add(Use(self.where, self.offset + node.lineno - 1, name, probe))


def _split(body: list[ast.stmt]) -> tuple[list[ast.AST], list[ast.AST]]:
    """(the nodes of a scope's own statements, the functions and classes defined in it)."""
    own, nested, todo = [], [], list(body)
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            nested.append(n)
            continue
        own.append(n)
        todo.extend(ast.iter_child_nodes(n))
    return own, nested


def _embedded_scripts(tree: ast.Module):
    """Python programs held in string constants (a child process's script), as (line, source)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.count("\n") > 5 \
                and "import torch" in node.value:
            text = re.sub(r"%\(\w+\)[sr]", "None", node.value).replace("%%", "%")
            try:
                yield node.lineno, ast.parse(text)
            except SyntaxError:
                continue


def uses_in_source(text: str, where: str, first_line: int = 1) -> set[Use]:
    """Every torch_npu / torch.npu name a piece of Python source (or prose) writes or reaches."""
    found = {Use(where, first_line + text.count("\n", 0, m.start()), m.group(0)) for m in SPELLED.finditer(text)}
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return found
    _Scope(where, first_line, {}, found).run(tree.body)
    for line, script in _embedded_scripts(tree):
        _Scope(where, first_line + line - 1, {}, found).run(script.body)
    return found


def workbook_uses() -> list[Use]:
    found: set[Use] = set()
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        found |= uses_in_source(path.read_text(), str(path.relative_to(ROOT)))
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            src = "".join(cell.get("source", []))
            if cell.get("cell_type") == "code":
                src = "\n".join("" if ln.lstrip().startswith(("%", "!")) else ln for ln in src.split("\n"))
            found |= uses_in_source(src, f"{nb.relative_to(ROOT)} cell {i}")
    return sorted(found)


@pytest.fixture(scope="module")
def names():
    return wheel_names()


@pytest.fixture(scope="module")
def uses() -> list[Use]:
    return workbook_uses()


def test_every_name_the_workbook_uses_exists_in_the_wheel(names, uses):
    missing = []
    for use in uses:
        ok, why = names.exists(use.name)
        if not ok and not use.probe:
            missing.append(f"{use.where}:{use.line}: {use.name} -- {why}")
    assert not missing, "names not in torch_npu 2.13.0:\n" + "\n".join(missing)


def test_probes_of_missing_names_are_the_known_ones(names, uses):
    probes = {u.name for u in uses if u.probe and not names.exists(u.name)[0]}
    assert probes == EXPECTED_MISSING_PROBES


def test_the_scan_sees_the_device_abstraction(uses):
    """The names the workbook reaches by kind are found (so the test above checks them)."""
    by_name = {(u.name, u.where) for u in uses}
    for name, where in [
        ("torch.npu.set_device", "helpers/comm/rank.py"),  # getattr(torch, kind).set_device(device)
        ("torch.npu.synchronize", "helpers/comm/rank.py"),  # mod = getattr(torch, kind); mod.synchronize()
        ("torch.npu.is_bf16_supported", "helpers/device.py"),  # getattr(getattr(torch_mod, kind), "...")
        ("torch.npu.memory_allocated", "helpers/device.py"),  # _memory_api(torch, kind).memory_allocated
        ("torch.npu.get_device_name", "helpers/device.py"),  # torch.get_device_module(kind).get_device_name
        ("torch.npu.device_count", "helpers/npu_probe.py"),  # the child script: npu = getattr(torch, "npu")
        ("torch_npu.profiler.tensorboard_trace_handler", "helpers/diagnose/profiler.py"),  # npu_prof alias
        ("torch_npu.utils.get_cann_version", "helpers/npu_probe.py"),  # from torch_npu.utils import ...
        ("torch_npu.profiler.profiler.analyse", "helpers/traces/ascend_format.py"),  # a name in a message
    ]:
        assert (name, where) in by_name, (name, where)


def test_the_wheel_check_rejects_names_it_does_not_define(names):
    for bad in ("torch.npu.no_such_function", "torch_npu.profiler.analyse", "torch_npu._C._no_such_module",
                "torch_npu.profiler.ProfilerActivity.NO_SUCH", "torch_npu.npu.amp.NoSuchScaler"):
        assert not names.exists(bad)[0], bad
    for good in ("torch.npu.synchronize", "torch_npu.profiler.profiler.analyse", "torch_npu.npu_fusion_attention",
                 "torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options", "torch.npu.amp.GradScaler"):
        assert names.exists(good)[0], (good, names.exists(good)[1])


def test_scanner_on_small_sources():
    src = ("import torch\nmod = getattr(torch, kind)\nmod.synchronize()\n"
           "def f(torch_mod, kind):\n    m = torch_mod.get_device_module(kind)\n    return m.empty_cache\n"
           "x = 'see torch_npu.optim.NpuFusedAdamW'\n")
    got = {(u.line, u.name) for u in uses_in_source(src, "s.py")}
    assert got == {(3, "torch.npu.synchronize"), (6, "torch.npu.empty_cache"), (7, "torch_npu.optim.NpuFusedAdamW")}
