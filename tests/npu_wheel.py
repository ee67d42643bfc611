"""The torch_npu 2.13.0 wheel's Python source, for the tests that check the workbook against it.

The wheel is read as a zip file and never imported (torch_npu needs CANN's libraries to import). Where it is:

1. ``$TORCH_NPU_WHEEL``: a wheel file, or a folder holding one;
2. ``.cache/npu-wheel/`` in the checkout (``make npu-wheel`` downloads it there);
3. otherwise it is downloaded there with this interpreter's pip (the same command as ``make npu-wheel``), with a
   short timeout; a test that needs it is skipped, saying so, only when that fails.
"""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

VERSION = "2.13.0"
ENV = "TORCH_NPU_WHEEL"
CACHE = Path(__file__).resolve().parents[1] / ".cache" / "npu-wheel"
PATTERN = f"torch_npu-{VERSION}-*.whl"
#: ``make npu-wheel``'s command; the platform is pinned so that every machine reads the same file.
DOWNLOAD = ["-m", "pip", "download", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:",
            "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", f"torch-npu=={VERSION}"]
FETCH_TIMEOUT_S = 120


def _in(folder: Path) -> Path | None:
    found = sorted(folder.glob(PATTERN)) if folder.is_dir() else []
    return found[-1] if found else None


def locate() -> Path | None:
    """The wheel file, from ``$TORCH_NPU_WHEEL`` or the cache folder; None when neither has it."""
    given = os.environ.get(ENV)
    if given:
        p = Path(given)
        return p if p.is_file() else _in(p)
    return _in(CACHE)


def fetch() -> tuple[Path | None, str]:
    """Download the wheel into the cache folder; (path, "") or (None, why not)."""
    try:
        done = subprocess.run([sys.executable, *DOWNLOAD, "-d", str(CACHE)], capture_output=True, text=True,
                              timeout=FETCH_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{type(exc).__name__}: {exc}"
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()
        return None, last[-1] if last else f"pip exited {done.returncode}"
    return _in(CACHE), ""


class WheelSource:
    """The ``.py`` files of one wheel, by path inside it (``torch_npu/profiler/profiler.py``)."""

    def __init__(self, path: Path):
        self.path = path
        self._zip = zipfile.ZipFile(path)
        self.files = {n for n in self._zip.namelist() if n.endswith(".py")}

    @functools.lru_cache(maxsize=None)
    def text(self, name: str) -> str:
        """The source of ``name``; KeyError when the wheel has no such file."""
        return self._zip.read(name).decode("utf-8-sig")

    @functools.lru_cache(maxsize=None)
    def tree(self, name: str) -> ast.Module:
        with warnings.catch_warnings():  # the wheel's own invalid escape sequences are not ours to report
            warnings.simplefilter("ignore")
            return ast.parse(self.text(name), filename=f"{self.path.name}:{name}")

    def class_attr(self, name: str, cls: str, attr: str):
        """The literal value of ``cls.attr`` in file ``name`` (a class-level assignment)."""
        for node in ast.walk(self.tree(name)):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for stmt in node.body:
                    if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == attr for t in stmt.targets):
                        return ast.literal_eval(stmt.value)
        raise KeyError(f"{cls}.{attr} not found in {name} of {self.path.name}")


@functools.lru_cache(maxsize=1)
def _wheel() -> tuple[WheelSource | None, str]:
    path, why = locate() or _in(CACHE), ""
    if path is None:
        path, why = fetch()
    if path is None:
        given = f"${ENV}={os.environ.get(ENV)!r}" if os.environ.get(ENV) else f"${ENV} (unset)"
        return None, (f"torch_npu {VERSION} wheel not in {given} nor {CACHE}, and downloading it failed ({why}); "
                      "run make npu-wheel where the package index is reachable")
    try:
        return WheelSource(path), ""
    except (OSError, zipfile.BadZipFile) as exc:
        return None, f"{path} is not a readable wheel ({exc}); delete it and run make npu-wheel"


def wheel_or_skip() -> WheelSource:
    """The wheel's source, or skip the test with the reason it could not be found nor fetched."""
    source, why = _wheel()
    if source is None:
        pytest.skip(why)
    return source


# --- which names the wheel defines ----------------------------------------------------------------------------


#: Prefix of the compiled extension (``torch_npu/_C*.so``): no Python source; its names count as defined where the
#: wheel's own Python code imports or uses them.
COMPILED = "torch_npu._C"


class WheelNames:
    """Whether a dotted name (``torch_npu.profiler.profile``, ``torch.npu.synchronize``) exists in the wheel.

    Read from the source only, as an import of torch_npu would build it:

    - a module's names are its top-level definitions, assignments and imports (followed to where they come from,
      ``from .x import *`` included), its submodules, and attributes other modules assign onto it
      (``torch_npu.npu.x = ...``, ``setattr(torch.npu, "x", ...)``);
    - ``torch.npu`` is ``torch_npu.npu`` (``torch._register_device_module("npu", torch_npu.npu)``,
      ``torch_npu/_init/registry/backend.py``);
    - ``torch_npu.<op>`` for the custom operators ``_export_npu_ops`` exports (``utils/exposed_api.py``'s
      ``public_npu_functions``), and the names ``_export_public_apis`` puts on ``torch_npu``
      (``torch_npu/_init/core/_exports.py``);
    - a name under the compiled ``torch_npu._C`` (or an attribute of an object it provides, e.g. an enum member)
      counts where the wheel's own Python source spells that same name, e.g. ``ProfilerActivity.NPU``.
    """

    def __init__(self, source: WheelSource):
        self.source = source
        self.modules: dict[str, str] = {}
        for f in source.files:
            if f.startswith("torch_npu/"):
                parts = f[:-3].split("/")
                self.modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
        self._text = "\n".join(source.text(f) for f in sorted(source.files) if f.startswith("torch_npu/"))
        self._names: dict[str, dict[str, tuple]] = {}
        self._assigned: dict[str, set[str]] | None = None

    # names ------------------------------------------------------------------------------------------------

    def names(self, module: str) -> dict[str, tuple]:
        """name -> binding: ("def",) ("class", node) ("value",) ("module", m) ("from", m, attr) ("star", m)."""
        if module not in self._names:
            self._names[module] = {}  # cycles of star imports end here
            self._names[module] = self._read_names(module)
        return self._names[module]

    def _read_names(self, module: str) -> dict[str, tuple]:
        out: dict[str, tuple] = {}
        is_pkg = self.modules[module].endswith("__init__.py")
        for node in _top_level(self.source.tree(self.modules[module]).body):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[node.name] = ("def",)
            elif isinstance(node, ast.ClassDef):
                out[node.name] = ("class", node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            out.setdefault(n.id, ("value",))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    out[a.asname or a.name.split(".")[0]] = ("module", a.name if a.asname else a.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                src = _absolute(module, is_pkg, node)
                for a in node.names:
                    if a.name == "*":
                        for k, v in self._star(src).items():
                            out.setdefault(k, v)
                    else:
                        out[a.asname or a.name] = ("from", src, a.name)
        if module == "torch_npu":
            out.update({k: ("value",) for k in self._torch_npu_exports()})
        return out

    def _star(self, module: str) -> dict[str, tuple]:
        if module not in self.modules:
            return {}
        names = self.names(module)
        public = _dunder_all(self.source.tree(self.modules[module]))
        keep = public if public is not None else [k for k in names if not k.startswith("_")]
        return {k: ("from", module, k) for k in keep}

    def _torch_npu_exports(self) -> set[str]:
        ops = ast.literal_eval(self.source.tree("torch_npu/utils/exposed_api.py").body[0].value)
        exports = self.source.tree("torch_npu/_init/core/_exports.py")
        lazy = next(n.value for n in exports.body if isinstance(n, ast.Assign)
                    and getattr(n.targets[0], "id", "") == "_LAZY_PYTHON_SYMBOLS")
        legacy = {t.slice.value for n in ast.walk(exports) if isinstance(n, ast.Assign)
                  for t in n.targets if isinstance(t, ast.Subscript) and getattr(t.value, "id", "") == "globals_dict"
                  and isinstance(t.slice, ast.Constant)}
        return set(ops) | set(ast.literal_eval(lazy)) | legacy

    def _assigned_attributes(self) -> dict[str, set[str]]:
        """module -> names other code assigns onto it (``torch.npu.x = ...``, ``setattr(torch_npu.npu, "x", ..)``)."""
        out: dict[str, set[str]] = {}
        hint = re.compile(r"setattr\(\s*torch(?:_npu|\.npu)|\btorch(?:_npu|\.npu)[\w.]*[ \t]*=[^=]")
        for f in sorted(self.source.files):
            if not f.startswith("torch_npu/") or not hint.search(self.source.text(f)):
                continue
            for node in ast.walk(self.source.tree(f)):
                pairs = []
                if isinstance(node, ast.Assign):
                    pairs = [(t.value, t.attr) for t in node.targets if isinstance(t, ast.Attribute)]
                elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr" and len(node.args) == 3 \
                        and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                    pairs = [(node.args[0], node.args[1].value)]
                for target, attr in pairs:
                    dotted = _dotted(target)
                    if dotted:
                        out.setdefault(self.canonical(dotted), set()).add(attr)
        return out

    # resolution -------------------------------------------------------------------------------------------

    @staticmethod
    def canonical(dotted: str) -> str:
        return "torch_npu.npu" + dotted[len("torch.npu"):] if (dotted + ".").startswith("torch.npu.") else dotted

    @functools.lru_cache(maxsize=None)
    def spelled(self, chain: str) -> bool:
        """Whether the wheel's Python source spells ``chain`` as a name (not inside a longer identifier)."""
        text, at = self._text, self._text.find(chain)
        while at >= 0:
            end = at + len(chain)
            if (at == 0 or not _ident(text[at - 1])) and (end == len(text) or not _ident(text[end])):
                return True
            at = text.find(chain, at + 1)
        return False

    def exists(self, dotted: str) -> tuple[bool, str]:
        """(found, where or why not) for ``torch_npu.a.b`` or ``torch.npu.a``."""
        name = self.canonical(dotted)
        parts = name.split(".")
        if parts[0] != "torch_npu":
            return False, "not a torch_npu name"
        return self._in_module("torch_npu", parts[1:], name)

    def _in_module(self, module: str, rest: list[str], full: str) -> tuple[bool, str]:
        if not rest:
            return True, self.modules.get(module, module)
        head, tail = rest[0], rest[1:]
        if f"{module}.{head}" == COMPILED:
            return self._compiled(tail, full)
        if f"{module}.{head}" in self.modules:
            return self._in_module(f"{module}.{head}", tail, full)
        binding = self.names(module).get(head) if module in self.modules else None
        if binding is None:
            if self._assigned is None:
                self._assigned = self._assigned_attributes()
            if head in self._assigned.get(module, ()):
                return self._leaf(head, tail, full, f"assigned onto {module}")
            return False, f"{module} ({self.modules.get(module, 'no source')}) defines no {head!r}"
        kind = binding[0]
        if kind == "module":
            return self._external_or(binding[1], tail, full)
        if kind == "from":
            src, attr = binding[1], binding[2]
            if f"{src}.{attr}" in self.modules:
                return self._in_module(f"{src}.{attr}", tail, full)
            if src in self.modules and src != module:
                return self._in_module(src, [attr, *tail], full)
            if src == COMPILED or src.startswith(COMPILED + "."):
                return self._compiled([*src.split(".")[2:], attr, *tail], full)
            return self._leaf(attr, tail, full, f"imported from {src} in {self.modules[module]}")
        if kind == "class":
            return self._in_class(binding[1], tail, full, self.modules[module])
        return self._leaf(head, tail, full, self.modules[module])

    def _external_or(self, module: str, tail: list[str], full: str) -> tuple[bool, str]:
        if module in self.modules:
            return self._in_module(module, tail, full)
        return self._leaf(module.split(".")[-1], tail, full, f"module {module}")

    def _in_class(self, node: ast.ClassDef, tail: list[str], full: str, where: str) -> tuple[bool, str]:
        if not tail:
            return True, where
        body = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        body |= {t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        body |= {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        if tail[0] in body and len(tail) == 1:
            return True, where
        return self._leaf(node.name, tail, full, where)

    def _compiled(self, parts: list[str], full: str) -> tuple[bool, str]:
        """``torch_npu._C.<parts>``: found where the wheel's Python spells it whole, or imports its first names
        from the extension and spells the rest (``from torch_npu._C._profiler import ProfilerActivity`` and
        ``ProfilerActivity.NPU``)."""
        whole = ".".join([COMPILED, *parts])
        if not parts or self.spelled(whole):
            return True, f"compiled {whole}, spelled by the wheel's Python"
        for i in range(len(parts)):
            module, attr, rest = ".".join([COMPILED, *parts[:i]]), parts[i], parts[i + 1:]
            if re.search(rf"from {re.escape(module)} import[^\n]*\b{re.escape(attr)}\b", self._text):
                return self._leaf(attr, rest, full, f"compiled {module}.{attr}, imported by the wheel's Python")
        return False, f"{whole} is in the compiled extension and the wheel's Python never uses it"

    def _leaf(self, last: str, tail: list[str], full: str, where: str) -> tuple[bool, str]:
        """An object without source to look into: its attributes count where the wheel spells them."""
        if not tail:
            return True, where
        chain = ".".join([last, *tail])
        if self.spelled(chain):
            return True, f"{where}; the wheel spells {chain}"
        return False, f"{full}: {where} has no {'.'.join(tail)!r} that the wheel's source shows"


def _ident(c: str) -> bool:
    return c.isalnum() or c == "_"


def _top_level(body: list[ast.stmt]):
    """Module-level statements, those inside if/try/with blocks included (not inside functions or classes)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list) and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                 ast.ClassDef)):
                yield from _top_level([n for n in inner if isinstance(n, ast.stmt)] +
                                      [s for h in inner if isinstance(h, ast.ExceptHandler) for s in h.body])


def _absolute(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _dunder_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__" for t in node.targets):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:
                return None
    return None


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        dotted = ".".join([node.id, *reversed(parts)])
        return dotted if dotted.startswith(("torch_npu", "torch.npu")) else None
    return None


@functools.lru_cache(maxsize=1)
def wheel_names() -> WheelNames:
    return WheelNames(wheel_or_skip())
