"""Tests for ``python -m helpers env check`` (helpers.workbook.cli main(["env", "check", ...]))."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers.diagnose import envcatalog as ec
from helpers.workbook.cli import main

SEVERITY_WORDS = ("ERROR", "WARNING", "OK")


def finding_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.split(" ", 1)[0] in SEVERITY_WORDS]


@pytest.fixture
def clean_env(monkeypatch):
    """An environment with nothing the catalog watches."""
    import os

    for name in list(os.environ):
        if name.startswith(ec.WATCHED_PREFIXES) or name in ec.CATALOG or name in ec.INVENTED:
            monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_valid_proposed_settings_exit_0_one_line_each(capsys):
    rc = main(["env", "check", "--set", "HCCL_BUFFSIZE=400", "--set", "TASK_QUEUE_ENABLE=2"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = finding_lines(out)
    assert len(lines) == 2
    assert lines[0].startswith("OK") and "HCCL_BUFFSIZE=400" in lines[0]
    assert "0 invalid or invented" in out


@pytest.mark.parametrize("setting, name", [
    ("HCCL_OP_BLOCK_LIST=allreduce", "HCCL_OP_BLOCK_LIST"),
    ("PT_DEBUG=1", "PT_DEBUG"),
    ("ASCEND_COMPRESS_LEVEL=2", "ASCEND_COMPRESS_LEVEL"),
    ("HCCL_ALGO=tree", "HCCL_ALGO"),
    ("HCCL_CONNECT_TIMEOUT=30", "HCCL_CONNECT_TIMEOUT"),
])
def test_invented_or_invalid_setting_exits_1_with_the_fix_on_its_line(capsys, setting, name):
    rc = main(["env", "check", "--set", setting])
    out = capsys.readouterr().out
    assert rc == 1
    errors = [line for line in finding_lines(out) if line.startswith("ERROR")]
    assert len(errors) == 1 and name in errors[0]
    assert "| fix: " in errors[0]


def test_conflict_is_reported_as_an_error(capsys):
    rc = main(["env", "check", "--npu", "--set", "HCCL_INTRA_ROCE_ENABLE=1", "--set", "HCCL_INTRA_PCIE_ENABLE=1"])
    out = capsys.readouterr().out
    assert rc == 1
    assert any(line.startswith("ERROR") and "HCCL_INTRA_ROCE_ENABLE+HCCL_INTRA_PCIE_ENABLE" in line
               for line in finding_lines(out))


def test_warnings_alone_exit_0(capsys):
    rc = main(["env", "check", "--set", "TASK_QUEUE_ENABLE=0"])
    out = capsys.readouterr().out
    assert rc == 0 and finding_lines(out)[0].startswith("WARNING")


def test_file_is_read_and_set_overrides_it(tmp_path, capsys):
    proposed = tmp_path / "proposed.env"
    proposed.write_text('# proposal\nexport HCCL_BUFFSIZE=0\nTASK_QUEUE_ENABLE="2"\n')
    assert main(["env", "check", "--file", str(proposed)]) == 1
    capsys.readouterr()
    assert main(["env", "check", "--file", str(proposed), "--set", "HCCL_BUFFSIZE=300"]) == 0
    out = capsys.readouterr().out
    assert "HCCL_BUFFSIZE=300" in out and "TASK_QUEUE_ENABLE=2" in out


def test_current_environment_is_the_default(clean_env, capsys):
    clean_env.setenv("PT_DEBUG", "1")
    assert main(["env", "check"]) == 1
    assert "current environment" in capsys.readouterr().out
    clean_env.delenv("PT_DEBUG")
    clean_env.setenv("HCCL_EXEC_TIMEOUT", "0")
    assert main(["env", "check"]) == 0


def test_unreadable_file_is_bad_usage(tmp_path, capsys):
    assert main(["env", "check", "--file", str(tmp_path / "missing.env")]) == 2
    assert "cannot read env file" in capsys.readouterr().err


def test_malformed_file_and_set_are_bad_usage(tmp_path, capsys):
    bad = tmp_path / "bad.env"
    bad.write_text("HCCL_BUFFSIZE=200\nthis is not a setting\n")
    assert main(["env", "check", "--file", str(bad)]) == 2
    assert ":2:" in capsys.readouterr().err
    assert main(["env", "check", "--set", "HCCL_BUFFSIZE"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_unknown_option_is_bad_usage():
    with pytest.raises(SystemExit) as info:
        main(["env", "check", "--no-such-option"])
    assert info.value.code == 2


def test_catalog_is_printed(capsys):
    assert main(["env", "check", "--catalog"]) == 0
    out = capsys.readouterr().out
    for name in ("HCCL_BUFFSIZE", "NCCL_ALGO", "TASK_QUEUE_ENABLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING"):
        assert name in out


def test_write_produces_a_file_bash_can_source(tmp_path, capsys):
    out_file = tmp_path / "run.env"
    rc = main(["env", "check", "--set", "HCCL_ALGO=level0:NA;level1:ring", "--set", "HCCL_BUFFSIZE=400",
               "--write", str(out_file)])
    assert rc == 0 and out_file.is_file()
    assert ec.parse_env_file(out_file) == {"HCCL_ALGO": "level0:NA;level1:ring", "HCCL_BUFFSIZE": "400"}
    if shutil.which("bash"):
        shown = subprocess.run(["bash", "-c", f'set -e; source "{out_file}"; printf %s "$HCCL_ALGO"'],
                               capture_output=True, text=True, check=True).stdout
        assert shown == "level0:NA;level1:ring"


def test_write_writes_the_valid_part_lists_the_rest_and_exits_1(tmp_path, capsys):
    out_file = tmp_path / "run.env"
    args = ["env", "check", "--set", "PT_DEBUG=1", "--set", "HCCL_BUFFSIZE=400", "--set", "NCCL_DEBUG=warn",
            "--write", str(out_file)]
    assert main(args) == 1  # still an error, so `... && source run.env && torchrun` stops
    out = capsys.readouterr().out
    assert ec.parse_env_file(out_file) == {"HCCL_BUFFSIZE": "400", "NCCL_DEBUG": "warn"}
    assert "left out as invalid or invented: PT_DEBUG" in out
    assert "Left out as invalid or invented: PT_DEBUG" in out_file.read_text()
    out_file.unlink()
    assert main(args + ["--skip-invalid"]) == 1  # the old flag is still accepted and changes nothing
    assert ec.parse_env_file(out_file) == {"HCCL_BUFFSIZE": "400", "NCCL_DEBUG": "warn"}


def test_help_describes_the_write_behaviour(capsys):
    with pytest.raises(SystemExit):
        main(["env", "check", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "invalid or invented ones are left out and listed" in text
    assert "--skip-invalid" not in text


def test_nccl_debug_lower_case_is_valid(capsys):
    assert main(["env", "check", "--set", "NCCL_DEBUG=warn"]) == 0
    assert main(["env", "check", "--set", "NCCL_DEBUG=abort"]) == 0
    assert main(["env", "check", "--set", "NCCL_DEBUG=loud"]) == 1


def test_finding_line_prints_name_and_value_once(capsys):
    main(["env", "check", "--set", "HCCL_ALGO=tree"])
    (line,) = [ln for ln in finding_lines(capsys.readouterr().out) if ln.startswith("ERROR")]
    head, _, _ = line.partition(" | fix: ")
    assert head.count("HCCL_ALGO") == 1 and head.startswith("ERROR   HCCL_ALGO=tree: ")


def test_catalog_prints_every_entry_with_what_it_does_and_its_source(capsys):
    assert main(["env", "check", "--catalog"]) == 0
    out = capsys.readouterr().out
    assert "default: NaN" not in out and "default: None" not in out
    for var in ec.CATALOG.values():
        assert f"{var.name}  ({var.scope})" in out
    assert out.count("  source:") == len(ec.CATALOG) and out.count("  what:") == len(ec.CATALOG)
    assert "  default: unset" in out


def test_catalog_into_a_closed_pipe_has_no_traceback():
    import sys

    proc = subprocess.run(
        [sys.executable, "-c",
         "import os, sys\n"
         "r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"
         "from helpers.workbook.cli import main\n"
         "sys.exit(main(['env', 'check', '--catalog']))"],
        capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 1


def test_npu_switch_changes_the_verdict(capsys):
    both = ["--set", "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True",
            "--set", "PYTORCH_ALLOC_CONF=expandable_segments:True"]
    assert main(["env", "check", "--npu", *both]) == 1
    assert main(["env", "check", "--no-npu", *both]) == 0
