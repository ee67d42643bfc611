"""The workbook as a user installs it into their own environment: a wheel, run from an empty folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
    # a fresh environment: every dependency from the package indexes (torch==2.13.0 from the wheel on disk)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-compile", str(wheel)], check=True, timeout=1800,
                   env=env, cwd=tmp_path)
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
    # the same three lines under torchrun, 2 ranks (no process group: the ranks meet in ./runs/instrument-ranks)
    ranks = call(str(venv / "bin" / "torchrun"), "--standalone", "--nproc-per-node", "2", "train.py")
    assert ranks.startswith("your loop: 2 of 2 ranks on 1 node(s), 5 steps measured per rank (gathered through the "
                            "folder") and ranks.count("your loop: ") == 1 and ranks.count("\njob: ") == 1
    copied = call(str(venv / "bin" / "workbook"), "notebooks", "mine")
    assert "11 notebooks in mine" in copied and (work / "mine" / "profiles" / "quick.yaml").is_file()
    assert _files(site) == before  # nothing written inside site-packages
    assert (tmp_path / "cache" / "training-perf-workbook" / "data").is_dir()  # the embedded photos: a user cache
