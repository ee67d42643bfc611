"""Tests for helpers.npu_probe.

Each failure mode of a broken torch_npu (huggingface/accelerate#3754) is simulated by a fake ``torch_npu`` package
put on the child's path (``extra_sys_path``): one whose import raises the
libhccl.so error, one that raises "Two accelerators ...", one that hangs,
fake dist-info metadata for a version mismatch, and fakes that import fine
with or without NPUs.  Some use the real torch in the child; the pure
error-parsing cases also put a fake empty ``torch`` first, so each child
starts in milliseconds.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers import npu_probe
from helpers.npu_probe import NpuProbe, prepare_torch_import, probe_npu
from helpers.errors import DeviceUnavailableError, ParameterError

REPO = Path(__file__).resolve().parents[1]

LIBHCCL = 'raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")\n'


def make_site(root: Path, torch_npu_init: str | None = None, *, fake_torch: bool = False,
              npu_version: str | None = None, torch_version: str | None = None,
              autoload_entry_point: bool = False) -> Path:
    """Build a folder to put on the child's path.

    Parameters
    ----------
    root : Path
        Folder to create it in.
    torch_npu_init : str, optional
        Source of ``torch_npu/__init__.py``; None: no package folder.
    fake_torch : bool
        Also put an empty ``torch`` package there (shadows the real one).
    npu_version, torch_version : str, optional
        Write ``*.dist-info/METADATA`` with these versions.
    autoload_entry_point : bool
        Give the fake torch_npu dist-info the real ``[torch.backends]`` entry point.
    """
    root.mkdir(parents=True, exist_ok=True)
    if torch_npu_init is not None:
        (root / "torch_npu").mkdir()
        (root / "torch_npu" / "__init__.py").write_text(torch_npu_init)
    if fake_torch:
        (root / "torch").mkdir()
        (root / "torch" / "__init__.py").write_text('__version__ = "0.0.fake"\n')
    for name, version in (("torch_npu", npu_version), ("torch", torch_version)):
        if version is None:
            continue
        dist = root / f"{name}-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        if name == "torch_npu" and autoload_entry_point:
            (dist / "entry_points.txt").write_text("[torch.backends]\ntorch_npu = torch_npu:_autoload\n")
    return root


def env_without_pythonpath() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop(npu_probe.AUTOLOAD_ENV, None)
    return env


# ---------------------------------------------------------------------------
# not installed (this machine) and the dataclass


def test_not_installed_is_fast_path_without_child(monkeypatch):
    def no_child(*args, **kwargs):
        raise AssertionError("probe_npu started a child process although torch_npu is absent")

    monkeypatch.setattr(npu_probe.subprocess, "run", no_child)
    probe = probe_npu(env=env_without_pythonpath())
    assert probe.status == "not installed"
    assert not probe.usable and not probe.installed
    assert probe.torch_npu_version is None
    assert probe.torch_version is not None  # torch metadata is read, torch is not imported
    assert "pip install -e '.[npu]'" in probe.fix
    assert "set_env.sh" in probe.fix


def test_probe_module_never_imports_torch():
    code = (
        "import sys; from helpers.npu_probe import probe_npu; "
        "p = probe_npu(); print(p.status, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60, env=env_without_pythonpath())
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "False"


def test_probe_dataclass_is_frozen_and_serialises():
    probe = NpuProbe(status="usable", device_count=2, device_name="Ascend910B3")
    assert probe.usable
    d = probe.as_dict()
    assert d["status"] == "usable" and d["usable"] is True and d["device_count"] == 2
    with pytest.raises(AttributeError):
        probe.status = "broken"  # type: ignore[misc]
    with pytest.raises(ParameterError, match="status"):
        NpuProbe(status="fine")


@pytest.mark.parametrize("bad", [0, -1, "10", True])
def test_timeout_must_be_positive_number(bad):
    with pytest.raises(ParameterError, match="timeout_s"):
        probe_npu(timeout_s=bad)


@pytest.mark.parametrize(
    "version, release",
    [("2.13.0+cpu", (2, 13, 0)), ("2.12.0.post3", (2, 12, 0)), ("2.13", (2, 13, 0)),
     ("2.1.0rc1", (2, 1, 0)), ("", None), (None, None), ("garbage", None)],
)
def test_release_parsing(version, release):
    assert npu_probe._release(version) == release


def test_post_release_of_same_base_is_not_a_mismatch():
    assert npu_probe._version_problem("2.13.0+cpu", "2.13.0.post2") is None


# ---------------------------------------------------------------------------
# failures, each from a fake torch_npu


def test_version_mismatch_found_from_metadata_before_any_child(tmp_path, monkeypatch):
    site = make_site(tmp_path / "site", "", npu_version="2.12.0", torch_version="2.13.0+cpu")

    def no_child(*args, **kwargs):
        raise AssertionError("a version mismatch must be found without a child process")

    monkeypatch.setattr(npu_probe.subprocess, "run", no_child)
    probe = probe_npu(extra_sys_path=[site], env=env_without_pythonpath())
    assert probe.status == "broken"
    assert probe.torch_version == "2.13.0+cpu" and probe.torch_npu_version == "2.12.0"
    assert "do not match" in probe.cause
    assert "pip install torch_npu==2.13.0" in probe.fix
    assert "pip install torch==2.12.0" in probe.fix


def test_metadata_only_counts_as_installed(tmp_path, monkeypatch):
    # dist-info without an importable package: installed (metadata) and mismatched
    site = make_site(tmp_path / "site", None, npu_version="2.11.0")
    monkeypatch.setattr(npu_probe.subprocess, "run",
                        lambda *a, **k: pytest.fail("no child expected"))
    probe = probe_npu(extra_sys_path=[site], env=env_without_pythonpath())
    assert probe.status == "broken" and probe.torch_npu_version == "2.11.0"


def test_missing_cann_library_real_torch(tmp_path):
    site = make_site(tmp_path / "site", LIBHCCL)
    probe = probe_npu(extra_sys_path=[site], env=env_without_pythonpath(), timeout_s=60)
    assert probe.status == "broken"
    assert probe.cause == (
        "CANN runtime libraries are not on the library path (libhccl.so not found)."
    )
    assert "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in probe.fix
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in probe.fix
    assert "libhccl.so" in probe.detail


def test_old_torch_npu_that_exits_zero_after_printing_error(tmp_path):
    # torch_npu 2.1 printed the traceback and called sys.exit() (status 0)
    init = textwrap.dedent("""
        import sys, traceback
        try:
            raise ImportError("libascendcl.so: cannot open shared object file: No such file or directory")
        except ImportError:
            traceback.print_exc()
            sys.exit()
    """)
    site = make_site(tmp_path / "site", init, fake_torch=True)
    probe = probe_npu(extra_sys_path=[site], env=env_without_pythonpath(), timeout_s=30)
    assert probe.status == "broken"
    assert "(libascendcl.so not found)" in probe.cause


def test_cuda_build_of_torch_two_accelerators(tmp_path):
    init = (
        'raise RuntimeError("Two accelerators cannot be used at the same time in PyTorch: '
        "npu and cuda. You can install the cpu version of PyTorch to use your npu device, "
        "or use the cuda device with 'export TORCH_DEVICE_BACKEND_AUTOLOAD=0'.\")\n"
    )
    site = make_site(tmp_path / "site", init, fake_torch=True)
    probe = probe_npu(extra_sys_path=[site], env=env_without_pythonpath(), timeout_s=30)
    assert probe.status == "broken"
    assert "cuda build" in probe.cause
    assert "https://download.pytorch.org/whl/cpu" in probe.fix
    assert "pip uninstall torch_npu" in probe.fix


def test_backend_registered_twice(tmp_path):
    init = 'raise RuntimeError("Two accelerators cannot be used at the same time in PyTorch: npu and npu.")\n'
    site = make_site(tmp_path / "site", init, fake_torch=True)
    probe = probe_npu(extra_sys_path=[site], env=env_without_pythonpath(), timeout_s=30)
    assert probe.status == "broken"
    assert "registered twice" in probe.cause
    assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in probe.fix


def test_hanging_import_times_out(tmp_path):
    site = make_site(tmp_path / "site", "import time\ntime.sleep(60)\n", fake_torch=True)
    probe = probe_npu(extra_sys_path=[site], env=env_without_pythonpath(), timeout_s=1.5)
    assert probe.status == "broken"
    assert "hung for 1.5 s" in probe.cause
    assert "timeout_s" in probe.fix


def test_other_error_reports_last_error_line(tmp_path):
    init = 'raise ImportError("/x/libtorch_npu.so: undefined symbol: _ZN3c1010TensorImpl")\n'
    site = make_site(tmp_path / "site", init, fake_torch=True)
    probe = probe_npu(extra_sys_path=[site], env=env_without_pythonpath(), timeout_s=30)
    assert probe.status == "broken"
    assert probe.cause.startswith("importing torch and torch_npu failed: ImportError:")
    assert "undefined symbol" in probe.cause


def test_imports_but_no_device_real_torch(tmp_path):
    site = make_site(tmp_path / "site", "__version__ = '2.13.0'\n")
    env = env_without_pythonpath()
    env["ASCEND_RT_VISIBLE_DEVICES"] = "7"
    probe = probe_npu(extra_sys_path=[site], env=env, timeout_s=60)
    assert probe.status == "no device"
    assert probe.device_count == 0
    assert "ASCEND_RT_VISIBLE_DEVICES='7'" in probe.cause
    assert probe.fix.startswith("npu-smi info")


USABLE = textwrap.dedent("""
    import sys, types
    import torch
    __version__ = "2.13.0"
    npu = types.ModuleType("torch_npu.npu")
    npu.is_available = lambda: True
    npu.device_count = lambda: 2
    npu.get_device_name = lambda index=0: "Ascend910B3"
    utils = types.ModuleType("torch_npu.utils")
    utils.get_cann_version = lambda module="CANN": "8.3.RC1"
    sys.modules["torch_npu.npu"] = npu
    sys.modules["torch_npu.utils"] = utils
    torch.npu = npu
""")


def test_usable_real_torch(tmp_path):
    site = make_site(tmp_path / "site", USABLE)
    probe = probe_npu(extra_sys_path=[site], env=env_without_pythonpath(), timeout_s=60)
    assert probe.status == "usable", probe
    assert probe.usable
    assert probe.device_count == 2
    assert probe.device_name == "Ascend910B3"
    assert probe.cann_version == "8.3.RC1"
    assert probe.torch_npu_version == "2.13.0"  # from torch_npu.__version__ (no dist-info)
    assert probe.fix == ""


def test_pythonpath_in_env_is_used_for_lookup_and_child(tmp_path):
    site = make_site(tmp_path / "site", LIBHCCL, fake_torch=True)
    env = env_without_pythonpath()
    env["PYTHONPATH"] = str(site)
    probe = probe_npu(env=env, timeout_s=30)
    assert probe.status == "broken" and "libhccl.so" in probe.cause


def test_other_interpreter_is_looked_up_in_a_child(tmp_path):
    # A link with another path counts as another interpreter: the lookup
    # runs in a child of that interpreter, not from this process's metadata.
    link = tmp_path / "bin" / "python"
    link.parent.mkdir()
    try:
        link.symlink_to(sys.executable)
    except OSError:
        pytest.skip("cannot create a symlink here")
    site = make_site(tmp_path / "site", LIBHCCL, fake_torch=True)
    probe = probe_npu(python=str(link), extra_sys_path=[site],
                      env=env_without_pythonpath(), timeout_s=30)
    assert probe.status == "broken" and "libhccl.so" in probe.cause


def test_missing_interpreter_is_reported(tmp_path):
    probe = probe_npu(python=str(tmp_path / "no-such-python"), timeout_s=10)
    assert probe.status == "broken"
    assert "could not run the interpreter" in probe.cause


# ---------------------------------------------------------------------------
# prepare_torch_import and the cache


BROKEN = NpuProbe(status="broken", cause="CANN runtime libraries are not on the library path "
                  "(libhccl.so not found).", fix="source /usr/local/Ascend/ascend-toolkit/set_env.sh")


@pytest.fixture
def torch_not_imported(monkeypatch):
    """Pretend torch is not imported yet, and restore the autoload variable after."""
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delenv(npu_probe.AUTOLOAD_ENV, raising=False)


def test_prepare_disables_autoload_for_broken_npu(torch_not_imported, caplog):
    with caplog.at_level(logging.WARNING, logger=npu_probe.__name__):
        out = prepare_torch_import(probe=BROKEN)
    assert out is BROKEN
    assert os.environ[npu_probe.AUTOLOAD_ENV] == "0"
    assert "libhccl.so not found" in caplog.text and "set_env.sh" in caplog.text


def test_prepare_without_fallback_raises_with_cause_and_fix(torch_not_imported):
    with pytest.raises(DeviceUnavailableError, match="libhccl.so not found.*set_env.sh"):
        prepare_torch_import(fallback_to_cpu=False, probe=BROKEN)
    assert npu_probe.AUTOLOAD_ENV not in os.environ


@pytest.mark.parametrize("status", ["usable", "not installed", "no device"])
def test_prepare_leaves_autoload_alone_otherwise(torch_not_imported, status):
    prepare_torch_import(probe=NpuProbe(status=status))
    assert npu_probe.AUTOLOAD_ENV not in os.environ


def test_prepare_after_torch_import_changes_nothing(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "torch", object())
    monkeypatch.delenv(npu_probe.AUTOLOAD_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger=npu_probe.__name__):
        out = prepare_torch_import(probe=BROKEN)
    assert out is BROKEN
    assert npu_probe.AUTOLOAD_ENV not in os.environ
    assert "already imported" in caplog.text


def test_get_probe_is_cached_per_process(monkeypatch):
    calls = []

    def fake_probe(**kwargs):
        calls.append(kwargs)
        return NpuProbe(status="not installed")

    monkeypatch.setattr(npu_probe, "_CACHE", None)
    monkeypatch.setattr(npu_probe, "probe_npu", fake_probe)
    first = npu_probe.get_probe()
    assert npu_probe.get_probe() is first
    assert len(calls) == 1
    npu_probe.get_probe(refresh=True)
    assert len(calls) == 2


def test_prepare_uses_the_cached_probe(torch_not_imported, monkeypatch):
    monkeypatch.setattr(npu_probe, "_CACHE", BROKEN)
    assert prepare_torch_import() is BROKEN
    assert os.environ[npu_probe.AUTOLOAD_ENV] == "0"


def test_end_to_end_autoloaded_broken_torch_npu(tmp_path):
    """Field case 18 for real: with the autoload entry point, ``import torch``
    fails; after prepare_torch_import() it succeeds on the CPU."""
    site = make_site(tmp_path / "site", LIBHCCL + "def _autoload():\n    pass\n",
                     npu_version="2.13.0", autoload_entry_point=True)
    env = env_without_pythonpath()
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])

    plain = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True,
                           text=True, timeout=60, env=env)
    if plain.returncode == 0:
        pytest.skip("this torch does not autoload device extensions")
    assert "libhccl.so" in plain.stderr

    code = textwrap.dedent("""
        import logging, os
        logging.basicConfig(level=logging.WARNING)
        from helpers.npu_probe import prepare_torch_import
        probe = prepare_torch_import()
        import torch
        print("STATUS", probe.status, os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"),
              torch.ones(2).sum().item())
    """)
    fixed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120, env=env)
    assert fixed.returncode == 0, fixed.stderr
    assert "STATUS broken 0 2.0" in fixed.stdout
    assert "libhccl.so not found" in fixed.stderr  # the logged warning
