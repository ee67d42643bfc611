"""The runner: failures are contained, runs resume, bad input fails before work starts."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from helpers.errors import OutputDirError, ParameterError
from helpers.workbook import profiles, rundir, runner
from helpers.workbook.profiles import select_notebooks
from helpers.workbook.rundir import drop_records
from helpers.workbook.runner import RunOptions, run
from helpers.experiments.registry import spec_for

ROOT = Path(__file__).resolve().parents[1]


def _fake_device(kind: str) -> str:
    return "cpu:test"


def _params_cell(nb_id: str) -> str:
    lines = []
    for p in spec_for(nb_id):
        lines.append(f"{p.name}: {p.kind.__name__} = {p.default!r}  # {p.help}")
    return "\n".join(lines)


def _write_nb(folder: Path, nb_id: str, body: str) -> Path:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = new_code_cell(_params_cell(nb_id))
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, new_code_cell(body)]
    path = folder / f"{nb_id}.ipynb"
    nbformat.write(nb, path)
    return path


RECORD_BODY = """
from helpers.results import ResultsStore
store = ResultsStore(results_path, notebook={nb!r})
store.verdict(metric="m", value=1.0, unit="x", recommendation="enable", reason="test")
"""


@pytest.fixture
def nb_folder(tmp_path):
    """A notebooks folder with the real ids: 00 raises in its second cell, 01 records a verdict."""
    folder = tmp_path / "notebooks"
    folder.mkdir()
    shutil.copytree(ROOT / "notebooks" / "profiles", folder / "profiles")
    _write_nb(folder, "00_environment_check", "raise RuntimeError('boom in the notebook')")
    _write_nb(folder, "01_baseline_profiling", RECORD_BODY.format(nb="01_baseline_profiling"))
    return folder


@pytest.mark.notebook
def test_failing_notebook_does_not_stop_the_others(nb_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # --out relative to where the user stands, not to where the kernels run
    out = tmp_path / "run"
    lines = []
    run_dir, state = run(RunOptions(profile="smoke", out=Path("run"), timeout_s=120), echo=lines.append,
                         device_checker=_fake_device, notebooks_folder=nb_folder)
    assert run_dir == out
    statuses = {n.id: n.status for n in state.notebooks}
    assert statuses == {"00_environment_check": "failed", "01_baseline_profiling": "ok"}
    assert state.status == "failed"
    err = next(n.error for n in state.notebooks if n.id == "00_environment_check")
    assert err["ename"] == "RuntimeError" and "boom in the notebook" in err["evalue"]
    assert err["cell_index"] is not None
    saved = json.loads((out / "run.json").read_text())
    assert saved["status"] == "failed"
    records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert [r["notebook"] for r in records] == ["01_baseline_profiling"]
    report = (out / "report.md").read_text()
    assert "boom in the notebook" in report and "01_baseline_profiling" in report
    assert (out / "report.html").is_file() and (out / "00_environment_check.ipynb").is_file()
    # each executed notebook as a web page beside it (a browser shows .ipynb as JSON), the failed one's traceback too
    page = (out / "00_environment_check.html").read_text()
    assert "boom in the notebook" in page and "<html" in page
    assert (out / "01_baseline_profiling.html").is_file()
    assert "01_baseline_profiling.html'>html</a>" in (out / "report.html").read_text()
    assert "[html](01_baseline_profiling.html)" in report


def test_interrupted_run_resumes_where_it_stopped(tmp_path):
    out = tmp_path / "run"
    calls = []

    def interrupting(nb, **kw):
        calls.append(nb.id)
        Path(nb.parameters["results_path"]).open("a").write(
            json.dumps({"notebook": nb.id, "experiment": "e", "variant": "v", "metric": "m", "value": 1,
                        "unit": "x"}) + "\n")
        if nb.id.startswith("01"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(RunOptions(profile="smoke", out=out), echo=lambda s: None, executor=interrupting,
            device_checker=_fake_device)
    state = json.loads((out / "run.json").read_text())
    assert state["status"] == "interrupted"
    assert [n["status"] for n in state["notebooks"]][:2] == ["ok", "interrupted"]

    resumed = []

    def recording(nb, **kw):
        resumed.append(nb.id)

    _, st = run(RunOptions(resume=True, out=out), echo=lambda s: None, executor=recording,
                device_checker=_fake_device)
    assert "00_environment_check" not in resumed and resumed[0] == "01_baseline_profiling"
    assert st.status == "ok"
    # the interrupted notebook's partial record was dropped before its rerun; 00's record kept
    notebooks = [json.loads(x)["notebook"] for x in (out / "results.jsonl").read_text().splitlines()]
    assert notebooks == ["00_environment_check"]


def test_bad_profile_value_fails_before_any_notebook(tmp_path, monkeypatch):
    folder = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", folder, ignore=shutil.ignore_patterns("*.ipynb"))
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        shutil.copy(nb, folder / nb.name)
    (folder / "profiles" / "smoke.yaml").write_text("01_baseline_profiling:\n  batch_size: -4\n  steps: lots\n")
    called = []
    with pytest.raises(ParameterError) as exc:
        run(RunOptions(profile="smoke", out=tmp_path / "run"), echo=lambda s: None,
            executor=lambda nb, **kw: called.append(nb.id), device_checker=_fake_device, notebooks_folder=folder)
    msg = str(exc.value)
    assert "batch_size" in msg and "-4" in msg and "steps" in msg and "'lots'" in msg
    assert called == []


def test_profile_with_unknown_parameter_is_rejected(tmp_path):
    folder = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", folder)
    (folder / "profiles" / "smoke.yaml").write_text("01_baseline_profiling:\n  batchsize: 4\n")
    with pytest.raises(ParameterError, match="batchsize"):
        run(RunOptions(profile="smoke", out=tmp_path / "run"), echo=lambda s: None,
            executor=lambda nb, **kw: None, device_checker=_fake_device, notebooks_folder=folder)


def test_unwritable_output_folder(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(OutputDirError, match="a-file"):
        run(RunOptions(profile="smoke", out=blocker / "run"), echo=lambda s: None,
            executor=lambda nb, **kw: None, device_checker=_fake_device)


def test_existing_run_folder_needs_resume(tmp_path):
    out = tmp_path / "run"
    run(RunOptions(profile="smoke", out=out, only=("00",)), echo=lambda s: None,
        executor=lambda nb, **kw: None, device_checker=_fake_device)
    with pytest.raises(ParameterError, match="--resume"):
        run(RunOptions(profile="smoke", out=out), echo=lambda s: None,
            executor=lambda nb, **kw: None, device_checker=_fake_device)


def test_select_notebooks_by_number_and_id():
    nbs = [Path("00_environment_check.ipynb"), Path("01_baseline_profiling.ipynb")]
    assert select_notebooks(nbs, ["1"]) == [nbs[1]]
    assert select_notebooks(nbs, ["01_baseline_profiling", "00"]) == nbs
    with pytest.raises(ParameterError, match="'07'.*available: 00_environment_check"):
        select_notebooks(nbs, ["07"])


def test_drop_records_removes_one_notebook_and_corrupt_lines(tmp_path):
    f = tmp_path / "results.jsonl"
    f.write_text('{"notebook": "a"}\n{"notebook": "b"}\n{"notebook": "a", "trunc')
    assert drop_records(f, "a") == 2
    assert f.read_text() == '{"notebook": "b"}\n'


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "helpers", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_cli_rejects_unknown_device_and_notebook():
    p = _cli("run", "--device", "gpu")
    assert p.returncode == 2 and "gpu" in p.stderr and "cuda" in p.stderr
    p = _cli("run", "--only", "99", "--out", "/tmp/never-created-run-folder")
    assert p.returncode == 2 and "99" in p.stderr and "available" in p.stderr
    assert not Path("/tmp/never-created-run-folder/run.json").exists()


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_cli_rejects_a_timeout_that_is_not_finite_before_work(tmp_path, value):
    p = _cli("run", "--timeout", value, "--only", "00", "--out", str(tmp_path / "run"))
    assert p.returncode == 2 and "--timeout must be a positive, finite number" in p.stderr
    assert not (tmp_path / "run" / "run.json").exists()


def test_cli_unusable_device_says_why(tmp_path):
    p = _cli("run", "--device", "npu", "--out", str(tmp_path / "run"))
    assert p.returncode == 2
    assert "npu" in p.stderr.lower() and "torch_npu" in p.stderr


def test_a_device_resolved_once_is_not_probed_again_and_a_failure_is(monkeypatch):
    from helpers.errors import DeviceUnavailableError
    from helpers.workbook import preflight

    answers = iter(['{"error": "RuntimeError: no device"}', '{"device": "cuda:H200"}', "never asked"])
    children = []

    def child(cmd, **kw):
        children.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=next(answers) + "\n", stderr="")

    monkeypatch.setattr(preflight, "_RESOLVED", {})
    monkeypatch.setattr(preflight.subprocess, "run", child)
    with pytest.raises(DeviceUnavailableError, match="no device"):
        preflight.check_device("cuda")
    assert preflight.check_device("cuda") == "cuda:H200"  # the failure was not kept: a second child asked
    assert preflight.check_device("cuda") == "cuda:H200" and len(children) == 2  # the success was


def test_resume_refuses_options_that_differ_from_the_run(tmp_path):
    out = tmp_path / "run"
    run(RunOptions(profile="smoke", out=out, only=("00",)), echo=lambda s: None,
        executor=lambda nb, **kw: None, device_checker=_fake_device)
    with pytest.raises(ParameterError, match="--profile 'full'.*'smoke'"):
        run(RunOptions(resume=True, out=out, profile="full"), echo=lambda s: None,
            executor=lambda nb, **kw: None, device_checker=_fake_device)
    with pytest.raises(ParameterError, match="--only"):
        run(RunOptions(resume=True, out=out, only=("01",)), echo=lambda s: None,
            executor=lambda nb, **kw: None, device_checker=_fake_device)
    # the same options as stored are fine
    run(RunOptions(resume=True, out=out, profile="smoke", only=("00",)), echo=lambda s: None,
        executor=lambda nb, **kw: None, device_checker=_fake_device)


@pytest.mark.parametrize("timeout", [0, -5, float("nan"), float("inf"), float("-inf")])
def test_timeout_must_be_positive(tmp_path, timeout):
    with pytest.raises(ParameterError, match="--timeout"):
        run(RunOptions(out=tmp_path / "run", timeout_s=timeout), echo=lambda s: None,
            executor=lambda nb, **kw: None, device_checker=_fake_device)


def _photos(folder, n, *, broken=0):
    """n small real JPEGs and `broken` files that only look like JPEGs."""
    from PIL import Image

    for i in range(n):
        Image.new("RGB", (40, 30), (i * 20 % 255, 80, 160)).save(folder / f"{i}.jpg", quality=90)
    for i in range(broken):
        (folder / f"bad{i}.jpg").write_bytes(b"not a JPEG at all" if i % 2 else b"")


def test_data_dir_reaches_the_notebooks_that_take_it(tmp_path):
    data = tmp_path / "photos"
    data.mkdir()
    _photos(data, 8)  # as many as the smoke profile's batch_size
    seen = {}
    run(RunOptions(profile="smoke", out=tmp_path / "run", data_dir=str(data)), echo=lambda s: None,
        executor=lambda nb, **kw: seen.update({nb.id: nb.parameters}), device_checker=_fake_device)
    assert seen["01_baseline_profiling"]["data_dir"] == str(data)
    assert "data_dir" not in seen["00_environment_check"]
    with pytest.raises(ParameterError, match="not a folder"):
        run(RunOptions(out=tmp_path / "run2", data_dir=str(tmp_path / "missing")), echo=lambda s: None,
            executor=lambda nb, **kw: None, device_checker=_fake_device)


def test_runner_indexes_the_data_dir_once_before_the_notebooks(tmp_path, monkeypatch):
    import helpers.pipeline.scan_cache as sc
    from helpers.pipeline.dataset import load_dataset

    monkeypatch.setenv(sc.CACHE_DIR_ENV, str(tmp_path / "cache"))
    data = tmp_path / "photos"
    data.mkdir()
    _photos(data, 40, broken=2)
    lines, decoded_in_notebooks = [], []

    def executor(nb, **kw):  # what a data notebook does: load the folder with its own max_images and seed
        if "data_dir" in nb.parameters:
            real = sc.check_image_file
            seen = []
            monkeypatch.setattr(sc, "check_image_file", lambda p: seen.append(p) or real(p))
            load_dataset(nb.parameters["data_dir"], max_images=int(nb.parameters.get("max_images") or 0),
                         sample_seed=int(nb.parameters.get("seed") or 0))
            monkeypatch.setattr(sc, "check_image_file", real)
            decoded_in_notebooks.extend(seen)

    run(RunOptions(profile="smoke", out=tmp_path / "run", data_dir=str(data), only=["01", "03"]),
        echo=lines.append, executor=executor, device_checker=_fake_device)
    assert decoded_in_notebooks == []  # the runner's index served them
    assert any(ln.startswith(f"Indexed {data}") and "40 usable of 42 image files, 2 skipped" in ln for ln in lines)


def test_data_dir_too_small_for_a_batch_fails_before_work(tmp_path):
    data = tmp_path / "few"
    data.mkdir()
    _photos(data, 3)
    called = []
    with pytest.raises(ParameterError, match=r"3 image file\(s\), of which 3 decode and 0 do not: fewer than one "
                                             r"batch of 01_baseline_profiling"):
        run(RunOptions(profile="quick", out=tmp_path / "run", data_dir=str(data)), echo=lambda s: None,
            executor=lambda nb, **kw: called.append(nb.id), device_checker=_fake_device)
    assert called == [] and not (tmp_path / "run").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ParameterError, match="no image files"):
        run(RunOptions(out=tmp_path / "run", data_dir=str(empty)), echo=lambda s: None,
            executor=lambda nb, **kw: None, device_checker=_fake_device)


def test_a_cell_timeout_names_the_cell_the_limit_and_the_option(tmp_path):
    """nbclient's CellTimeoutError ends in a line of dashes; the run records what a user needs (issue 11)."""
    import nbformat
    from nbclient.exceptions import CellTimeoutError

    from helpers.workbook.nbexec import error_info

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# t"),
                                         nbformat.v4.new_code_cell("x = 1"),
                                         nbformat.v4.new_code_cell("import time\ntime.sleep(100)")])
    path = tmp_path / "01_baseline_profiling.ipynb"
    nbformat.write(nb, path)
    exc = CellTimeoutError.error_from_timeout_and_cell("Cell execution timed out", 30, nb.cells[2])
    assert str(exc).strip().splitlines()[-1].startswith("-----")  # what the runner used to keep
    info = error_info(exc, str(path))
    assert info["type"] == "CellTimeoutError" and info["cell_index"] == 2 and info["limit_s"] == 30
    assert "cell 2 (`import time`)" in info["message"] and "--timeout" in info["message"]
    assert "-----" not in info["message"]
    # without the notebook file the first line still names the cell
    assert "the cell starting `import time`" in error_info(exc)["message"]


def test_a_run_folder_is_used_by_one_runner_at_a_time(tmp_path):
    """A second --resume of the same run stops at once, naming the other runner; a killed holder's lock is gone."""
    out = tmp_path / "run"
    run(RunOptions(profile="smoke", out=out, only=("00",)), echo=lambda s: None,
        executor=lambda nb, **kw: None, device_checker=_fake_device)
    # another live process holds the lock: a child that takes it and waits
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time; from pathlib import Path; "
                               "from helpers.workbook.rundir import lock_run_dir; "
                               f"h = lock_run_dir(Path({str(out)!r})); print('locked', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "locked"
        ran = []
        with pytest.raises(ParameterError, match=rf"in use by another runner \(pid {holder.pid}"):
            run(RunOptions(resume=True, out=out), echo=lambda s: None,
                executor=lambda nb, **kw: ran.append(nb.id), device_checker=_fake_device)
        assert ran == []  # nothing ran, nothing was written twice
    finally:
        holder.kill()  # like kill -9: the kernel drops its lock
        holder.wait()
    run(RunOptions(resume=True, out=out), echo=lambda s: None, executor=lambda nb, **kw: None,
        device_checker=_fake_device)


@pytest.mark.slow
def test_sigterm_stops_the_run_like_ctrl_c(tmp_path):
    """SIGTERM: the kernel is stopped, run.json says interrupted, the report is written, exit status 130."""
    import signal
    import time

    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "helpers", "run", "--profile", "smoke", "--device", "cpu",
                             "--only", "05", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            state = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
            if any(n.get("status") == "running" for n in state.get("notebooks", [])):
                break
            time.sleep(0.2)
        time.sleep(2.0)  # the kernel is executing cells
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    state = json.loads((out / "run.json").read_text())
    assert state["status"] == "interrupted" and state["notebooks"][0]["status"] == "interrupted"
    assert (out / "report.html").is_file()


def test_a_folder_of_broken_images_stops_before_work_with_the_reasons(tmp_path):
    """Enough files by name, none decodes: stopped in the pre-check, each reason named (issue 11)."""
    data = tmp_path / "broken"
    data.mkdir()
    _photos(data, 0, broken=8)
    called = []
    with pytest.raises(ParameterError, match=r"8 image file\(s\), of which 0 decode and 8 do not \(bad0.jpg: "):
        run(RunOptions(profile="smoke", out=tmp_path / "run", data_dir=str(data)), echo=lambda s: None,
            executor=lambda nb, **kw: called.append(nb.id), device_checker=_fake_device)
    assert called == [] and not (tmp_path / "run").exists()
    _photos(data, 8)  # now enough good ones beside the bad: the run goes ahead (the notebooks skip the bad)
    run(RunOptions(profile="smoke", out=tmp_path / "run", data_dir=str(data)), echo=lambda s: None,
        executor=lambda nb, **kw: called.append(nb.id), device_checker=_fake_device)
    assert "01_baseline_profiling" in called


def test_a_full_disk_stops_the_run_with_a_clear_error_and_keeps_what_was_written(tmp_path):
    import errno

    lines, ran = [], []

    def executor(nb, **kw):
        ran.append(nb.id)
        if len(ran) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / nb.id))

    run_dir, state = run(RunOptions(profile="smoke", out=tmp_path / "run", only=["00", "01", "02", "03"]),
                         echo=lines.append, executor=executor, device_checker=_fake_device)
    assert ran == ["00_environment_check", "01_baseline_profiling"]  # nothing started after the full disk
    assert state.status == "failed"
    by_id = {n.id: n for n in state.notebooks}
    assert by_id["00_environment_check"].status == "ok"
    assert by_id["01_baseline_profiling"].status == "failed"
    msg = by_id["01_baseline_profiling"].error["message"]
    assert f"the disk of the run folder {run_dir} is full (" in msg and "MiB free" in msg and "--resume" in msg
    assert [by_id[k].status for k in ("02_batched_decode", "03_dataloader_tuning")] == ["pending", "pending"]
    assert any(ln.startswith("Stopped: the disk of the run folder") for ln in lines)
    assert any(ln.endswith("\nNot started: 02_batched_decode, 03_dataloader_tuning") for ln in lines)
    saved = json.loads((run_dir / "run.json").read_text())
    assert saved["status"] == "failed"  # recorded where the disk allowed it
    assert (run_dir / "report.html").is_file()


def test_run_json_that_cannot_be_written_on_a_full_disk_is_a_clear_error_not_a_traceback(tmp_path, monkeypatch):
    import errno

    real_save = rundir.RunState.save
    calls = []

    def save(self, run_dir):
        calls.append(1)
        if len(calls) >= 4:  # the run folder fills up after the first notebook started
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(self, run_dir)

    monkeypatch.setattr(rundir.RunState, "save", save)
    lines = []
    run_dir, state = run(RunOptions(profile="smoke", out=tmp_path / "run", only=["00", "01"]), echo=lines.append,
                         executor=lambda nb, **kw: None, device_checker=_fake_device)
    assert state.status == "failed"
    assert any("Stopped: the disk of the run folder" in ln for ln in lines)
    # the reason is said once ("Stopped: ..."); run.json's own failure says so in a few words, not again in full
    assert any(ln.startswith("run.json could not be updated either (disk full): it keeps its last good copy, "
                             "which says 'running'") for ln in lines)
    assert sum("is full" in ln for ln in lines) == 1
    assert json.loads((run_dir / "run.json").read_text())["status"] == "running"  # the last good copy is kept


def _disk_fills_for(monkeypatch, full_for):
    """Simulate a full disk: ``os.fsync`` fails with ENOSPC for a file whose name ``full_for(name)`` accepts.

    Every whole file the run writes goes through :func:`helpers.fsutil.write_atomic`, which creates its temporary
    file, writes it and fsyncs it before the rename; the temporary file exists when the error comes (as the 0-byte
    run.json.tmp of a real full disk did), so the test shows that it is removed.
    """
    import errno
    import os

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc/self/fd to name the file being written")
    real_fsync = os.fsync

    def fsync(fd):
        if full_for(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def _run_then_resume_on_a_full_disk(tmp_path, monkeypatch, capsys, full_for):
    """A run whose notebook 01 fails, then ``run --resume`` (the command line) where 01 meets a full disk."""
    import errno
    import functools

    from helpers.workbook import cli

    out = tmp_path / "run"

    def boom(nb, **kw):
        if nb.id.startswith("01"):
            raise RuntimeError("boom")

    run(RunOptions(profile="smoke", out=out, only=["00", "01"]), echo=lambda s: None, executor=boom,
        device_checker=_fake_device)
    before = {name: (out / name).read_bytes() for name in ("report.md", "report.html", "run.json")}
    full = []

    def disk_fills(nb, **kw):
        full.append(nb.id)
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "figures" / f"{nb.id}__x.png"))

    _disk_fills_for(monkeypatch, lambda name: bool(full) and full_for(name))
    monkeypatch.setattr(runner, "run", functools.partial(run, executor=disk_fills, device_checker=_fake_device))
    capsys.readouterr()
    rc = cli.main(["run", "--resume", "--out", str(out)])
    captured = capsys.readouterr()
    assert full == ["01_baseline_profiling"]
    return out, before, rc, captured


def test_a_full_disk_keeps_the_previous_report_whole_and_marks_the_run_failed(tmp_path, monkeypatch, capsys, caplog):
    # the disk has room for run.json, not for the report: run.json says failed and why; the old report stays whole
    out, before, rc, captured = _run_then_resume_on_a_full_disk(tmp_path, monkeypatch, capsys,
                                                                lambda name: "report." in name)
    assert rc == 1
    assert (out / "report.md").read_bytes() == before["report.md"]  # not truncated, not half written
    assert (out / "report.html").read_bytes() == before["report.html"]
    saved = json.loads((out / "run.json").read_text())
    assert saved["status"] == "failed" and "is full" in saved["error"] and "--resume" in saved["error"]
    nb01 = next(n for n in saved["notebooks"] if n["id"] == "01_baseline_profiling")
    assert nb01["status"] == "failed" and "is full" in nb01["error"]["message"]
    assert not [p for p in out.rglob("*") if "tmp" in p.name]  # no temporary file left
    assert captured.out.count("is full") == 1  # the reason, once
    assert "Report could not be written (disk full); report.md and report.html on disk are left whole" in captured.out
    assert "Traceback" not in captured.err and "Traceback" not in caplog.text


def test_a_full_disk_for_run_json_too_is_said_and_leaves_no_temporary_file(tmp_path, monkeypatch, capsys, caplog):
    out, before, rc, captured = _run_then_resume_on_a_full_disk(tmp_path, monkeypatch, capsys, lambda name: True)
    assert rc == 1
    assert (out / "report.md").read_bytes() == before["report.md"]
    saved = json.loads((out / "run.json").read_text())  # whole: the last copy the disk took (01 starting)
    assert saved["status"] == "running"
    assert "run.json could not be updated either (disk full): it keeps its last good copy, which says 'running'" in (
        captured.out)
    assert not [p for p in out.rglob("*") if "tmp" in p.name]
    assert captured.out.count("is full") == 1
    assert "Traceback" not in captured.err and "Traceback" not in caplog.text


def test_a_full_disk_while_dropping_old_records_stops_the_run_cleanly(tmp_path, monkeypatch, capsys, caplog):
    from helpers.workbook import cli
    import functools

    out = tmp_path / "run"
    run(RunOptions(profile="smoke", out=out, only=["00", "01"]), echo=lambda s: None,
        executor=lambda nb, **kw: (_ for _ in ()).throw(RuntimeError("boom")) if nb.id.startswith("01") else None,
        device_checker=_fake_device)
    line = json.dumps({"notebook": "01_baseline_profiling", "experiment": "e", "variant": "v", "metric": "m",
                       "value": 1, "unit": "x"}) + "\n"
    (out / "results.jsonl").write_text(line)  # a partial record of 01, dropped before 01 reruns
    _disk_fills_for(monkeypatch, lambda name: "results.jsonl" in name)
    ran = []
    monkeypatch.setattr(runner, "run", functools.partial(run, executor=lambda nb, **kw: ran.append(nb.id),
                                                         device_checker=_fake_device))
    rc = cli.main(["run", "--resume", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 1 and ran == []  # 01 did not start: it could not have written its results either
    assert (out / "results.jsonl").read_text() == line  # kept whole
    assert not [p for p in out.rglob("*") if "tmp" in p.name]
    assert captured.out.count("is full") == 1 and "Stopped: the disk of the run folder" in captured.out
    saved = json.loads((out / "run.json").read_text())
    assert saved["status"] == "failed" and "is full" in saved["error"]
    assert "Traceback" not in captured.err and "Traceback" not in caplog.text

def test_a_resumed_run_ends_the_processes_its_killed_predecessor_left(tmp_path):
    from helpers.process import register_child

    sleepers = []

    def first(nb, **kw):  # notebook 01 starts a long-lived child (as notebook 08 starts torchrun), then the run dies
        if nb.id == "01_baseline_profiling":
            p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
            sleepers.append(p)
            register_child(p.pid, role="torchrun")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(RunOptions(profile="smoke", out=tmp_path / "run", only=["00", "01"]), echo=lambda s: None,
            executor=first, device_checker=_fake_device)
    # a child that is not ours any more: a live process whose record has another start time (a reused PID)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    (tmp_path / "run" / rundir.CHILDREN_DIR / f"{other.pid}.json").write_text(
        json.dumps({"pid": other.pid, "create_time": 1.0, "role": "someone else's"}))
    try:
        assert sleepers[0].poll() is None  # still alive after the run ended
        lines = []
        run(RunOptions(resume=True, out=tmp_path / "run"), echo=lines.append, executor=lambda nb, **kw: None,
            device_checker=_fake_device)
        assert sleepers[0].wait(timeout=10) is not None
        assert f"Ended a process left by an earlier run of this folder: torchrun (pid {sleepers[0].pid})" in lines
        assert other.poll() is None  # not ours: untouched
        assert list((tmp_path / "run" / rundir.CHILDREN_DIR).iterdir()) == []
    finally:
        for p in (*sleepers, other):
            p.kill()
            p.wait()


def test_dash_p_sets_a_parameter_in_every_notebook_that_has_it(tmp_path):
    seen = {}
    run(RunOptions(profile="smoke", out=tmp_path / "run", only=("01", "03"),
                   overrides=(("batch_size", "16"), ("num_workers_list", "[0, 1]"))),
        echo=lambda s: None, executor=lambda nb, **kw: seen.update({nb.id: nb.parameters}),
        device_checker=_fake_device)
    assert seen["01_baseline_profiling"]["batch_size"] == 16 and seen["03_dataloader_tuning"]["batch_size"] == 16
    assert seen["03_dataloader_tuning"]["num_workers_list"] == [0, 1]  # read as YAML
    assert "num_workers_list" not in seen["01_baseline_profiling"]  # only where it is declared


@pytest.mark.parametrize("pairs, match", [((("batchsize", "4"),), r"-p batchsize: no selected notebook"),
                                          ((("device", "cuda"),), r"the runner sets 'device' \(use --device\)"),
                                          ((("batch_size", "-4"),), r"batch_size"),
                                          ((("job", "x.py:f"),), r"-p job: the runner sets 'job' \(use --job"),
                                          ((("data_dir", "/tmp"),), r"use --data-dir"),
                                          ((("out_dir", "/tmp"),), r"use --out")])
def test_dash_p_is_checked_before_any_work(tmp_path, pairs, match):
    with pytest.raises(ParameterError, match=match):
        run(RunOptions(profile="smoke", out=tmp_path / "run", only=("01",), overrides=pairs), echo=lambda s: None,
            executor=lambda nb, **kw: pytest.fail("no notebook may start"), device_checker=_fake_device)
    assert not (tmp_path / "run" / "run.json").exists()


def test_a_users_profile_file(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("common:\n  batch_size: 12\n01_baseline_profiling:\n  steps: 5\n")
    seen = {}
    run_dir, state = run(RunOptions(profile=str(mine), only=("01",), out=tmp_path / "run"), echo=lambda s: None,
                         executor=lambda nb, **kw: seen.update(nb.parameters), device_checker=_fake_device)
    assert seen["batch_size"] == 12 and seen["steps"] == 5 and state.profile == str(mine.resolve())
    typo = tmp_path / "typo.yaml"
    typo.write_text("common:\n  batch_sise: 8\n")
    with pytest.raises(ParameterError, match=r"'common' sets 'batch_sise', which no notebook declares"):
        run(RunOptions(profile=str(typo), out=tmp_path / "r1"), echo=lambda s: None,
            executor=lambda nb, **kw: pytest.fail("no notebook may start"), device_checker=_fake_device)
    with pytest.raises(ParameterError, match="no profile file"):
        run(RunOptions(profile=str(tmp_path / "nope.yaml"), out=tmp_path / "r2"), echo=lambda s: None,
            executor=lambda nb, **kw: None, device_checker=_fake_device)
    with pytest.raises(ParameterError, match="not one of"):
        run(RunOptions(profile="fast", out=tmp_path / "r3"), echo=lambda s: None,
            executor=lambda nb, **kw: None, device_checker=_fake_device)


# ---------------------------------------------------------------- a user's job keeps its own batch size

SIZED_JOB = """import torch
from helpers.jobs.supervised import supervised_job


def make_job(batch_size=32, image_size=24, seed=0):
    data = [(torch.ones(3), torch.tensor(0.0))] * 64
    return supervised_job(data, lambda: torch.nn.Linear(3, 1), lambda o, y: o.mean(),
                          lambda p: torch.optim.SGD(p, lr=0.1), batch_size=batch_size, name=f"sized {image_size} px")
"""

MEASURE_BODY = """
from helpers.workbook.nbsetup import start
ctx = start("01_baseline_profiling", globals())
job = ctx.job()
ctx.store.add("dataset", "your job", "batch_size", job.workload.batch_size, "samples", **job.describe())
ctx.store.verdict(metric="m", value=1.0, unit="x", recommendation="device-bound",
                  reason=f"measured {job.name} at batch {ctx.params['batch_size']}")
"""


def test_a_profiles_sizes_are_not_passed_to_a_users_job(tmp_path):
    job = tmp_path / "sizedjob.py"
    job.write_text(SIZED_JOB)
    seen = {}
    run(RunOptions(profile="smoke", out=tmp_path / "run", only=("01", "09"), job=f"{job}:make_job"),
        echo=lambda s: None, executor=lambda nb, **kw: seen.update({nb.id: nb.parameters}),
        device_checker=_fake_device)
    for params in seen.values():  # smoke's batch_size 8 and image_size 64 are the built-in job's
        assert "batch_size" not in params and "image_size" not in params
        assert params["max_images"] == 48 and params["steps"] <= 4  # smoke still shortens samples and steps
    seen.clear()
    run(RunOptions(profile="smoke", out=tmp_path / "run16", only=("01",), job=f"{job}:make_job",
                   overrides=(("batch_size", "16"),)),
        echo=lambda s: None, executor=lambda nb, **kw: seen.update({nb.id: nb.parameters}),
        device_checker=_fake_device)
    assert seen["01_baseline_profiling"]["batch_size"] == 16 and "image_size" not in seen["01_baseline_profiling"]


@pytest.mark.notebook
@pytest.mark.parametrize("overrides, batch", [((), 32), ((("batch_size", "16"),), 16)])
def test_a_smoke_run_measures_the_users_job_at_its_own_batch_size(tmp_path, overrides, batch):
    """Through papermill: the factory's default (32) stands under the smoke profile (batch 8), -p sets another."""
    from helpers.results import load_results

    folder = tmp_path / "notebooks"
    folder.mkdir()
    shutil.copytree(ROOT / "notebooks" / "profiles", folder / "profiles")
    _write_nb(folder, "01_baseline_profiling", MEASURE_BODY)
    job = tmp_path / "sizedjob.py"
    job.write_text(SIZED_JOB)
    run_dir, state = run(RunOptions(profile="smoke", device="cpu", out=tmp_path / "run", job=f"{job}:make_job",
                                    overrides=overrides, timeout_s=300),
                         echo=lambda s: None, notebooks_folder=folder, device_checker=_fake_device)
    assert state.status == "ok", {n.id: n.error for n in state.notebooks if n.status != "ok"}
    df = load_results(run_dir / "results.jsonl")
    rec = df[(df["experiment"] == "dataset")].iloc[-1]
    assert rec["value"] == batch and rec["extra"]["job"] == "sized 24 px"  # its own image_size too, not smoke's 64
    v = df[df["experiment"] == "verdict"].iloc[-1]
    assert f"at batch {batch}" in v["reason"] and v["parameters"]["batch_size"] == batch  # records say it too
    assert "image_size" not in v["parameters"]  # the factory's own: the workbook does not know it
    head = (run_dir / "report.md").read_text().splitlines()[:8]
    line = next(x for x in head if x.startswith("Job measured:"))
    assert f"at batch size {batch} (" in line
    assert ("set with -p batch_size" if overrides else "your factory's own") in line


def test_the_quick_profiles_demonstration_budget_is_not_passed_to_a_users_job(tmp_path):
    """Notebook 09 sizes a user's batch from the machine's free memory (memory_budget_mib=0), not from quick's 100 MiB."""
    nb = ROOT / "notebooks" / "09_memory_and_batch_size.ipynb"
    quick = profiles.load_profile("quick")
    builtin = profiles.build_parameters(nb, quick, device="cpu", run_dir=tmp_path)
    assert builtin["memory_budget_mib"] == 100 and builtin["batch_size"] == 32  # the built-in job's demonstration
    mine = profiles.build_parameters(nb, quick, device="cpu", run_dir=tmp_path, job="/x/job.py:make_job")
    assert "memory_budget_mib" not in mine and "batch_size" not in mine and mine["finder_max_batch"] == 256
    set_by_user = profiles.build_parameters(nb, quick, device="cpu", run_dir=tmp_path, job="/x/job.py:make_job",
                                          overrides={"memory_budget_mib": 300, "batch_size": 24})
    assert set_by_user["memory_budget_mib"] == 300 and set_by_user["batch_size"] == 24
