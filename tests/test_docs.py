"""The README and the docs/ pages: their links lead somewhere, their torchrun commands are the ones the tests run, and
the per-rank profiler snippet of docs/many_ranks.md writes a folder that ``python -m helpers trace`` reads.

The README's first commands are checked in tests/test_packaging.py, its list of notebooks and docs/notebooks.md's
table in tests/test_checklist.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def _code_blocks(text: str, lang: str = "") -> list[str]:
    return re.findall(r"```" + lang + r"\n(.*?)```", text, re.S)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_to_a_file_and_a_heading(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name} links {target}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name} links {target}: no such heading in {dest.name}"


def _torchrun_commands(text: str) -> list[str]:
    """Every torchrun command of the page's shell blocks, its continuation lines joined."""
    commands = []
    for block in _code_blocks(text, "bash"):
        joined = re.sub(r"\\\n\s*", " ", block)
        commands += [line for line in joined.splitlines() if "torchrun " in line]
    return commands


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_c10d_launches_give_no_node_rank(page):
    """torchrun ignores --node-rank under the c10d rendezvous (it warns so); every node runs the same command."""
    for cmd in _torchrun_commands(page.read_text()):
        if "--rdzv-backend c10d" in cmd:
            assert "--node-rank" not in cmd, f"{page.name}: {cmd}"
            if "--nnodes 2" in cmd or "--nnodes $" in cmd:
                assert "--rdzv-id" in cmd, f"{page.name}: the launches of one job share an id: {cmd}"


#: A papermill command line: the command, then the notebook it runs.
_PAPERMILL = re.compile(r"\bpapermill\s+\S+\.ipynb")


def _papermill_commands(text: str) -> list[str]:
    """Every line of the page that runs a notebook through papermill, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if _PAPERMILL.search(line)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_papermill_commands_run_the_panels_headless(page):
    """papermill presses no button: without ``WORKBOOK_HEADLESS=1`` (helpers.params.headless) a notebook's "Try it"
    panel shows its widgets and measures nothing."""
    for cmd in _papermill_commands(page.read_text()):
        assert re.search(r"\bWORKBOOK_HEADLESS=1\s.*\bpapermill\s", cmd), (
            f"{page.name}: set WORKBOOK_HEADLESS=1 in front of papermill, so that the panels measure: {cmd}")


def test_the_papermill_check_finds_a_command_without_the_variable():
    assert _papermill_commands("```bash\n.venv/bin/papermill nb.ipynb out.ipynb \\\n  -p device cpu\n```\n") == [
        ".venv/bin/papermill nb.ipynb out.ipynb  -p device cpu"]  # continuation lines joined
    assert _papermill_commands("`python -m papermill a.ipynb b.ipynb`") == ["`python -m papermill a.ipynb b.ipynb`"]
    assert not _papermill_commands("papermill's cell durations; the runner (papermill) runs each notebook")
    assert any("run_options.md" == p.name and _papermill_commands(p.read_text()) for p in PAGES)


def test_two_nodes_on_one_machine_is_the_command_the_instrument_tests_run():
    doc = (ROOT / "docs" / "many_ranks.md").read_text()
    loop = next(c for c in _torchrun_commands(doc) if c.startswith("for n in 0 1"))
    flags = set(re.findall(r"--[a-z][a-z-]*", loop))
    source = (ROOT / "tests" / "test_instrument_ranks.py").read_text()
    launcher = re.search(r"^def _torchrun\(.*?(?=^\S)", source, re.S | re.M).group(0)
    tested = set(re.findall(r'"(--[a-z][a-z-]*)"', launcher))
    assert flags == {"--nnodes", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--nproc-per-node"}
    assert flags <= tested and "--node-rank" not in tested


#: What the snippet needs around it: a process group, a DDP model, a loader and a step (the user's own loop).
_AROUND = '''import torch
import torch.distributed as dist

torch.set_num_threads(1)
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = torch.utils.data.TensorDataset(torch.randn(160, 8), torch.randn(160, 1))
loader = torch.utils.data.DataLoader(data, batch_size=16)


def train_step(batch):
    x, y = batch
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


'''


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_per_rank_trace_snippet_writes_a_folder_the_trace_reader_reads(tmp_path):
    doc = (ROOT / "docs" / "many_ranks.md").read_text()
    snippet = _code_blocks(doc.split("## One profiler trace per rank", 1)[1], "python")[0]
    assert 'tensorboard_trace_handler("prof", worker_name=f"rank{rank}")' in snippet
    (tmp_path / "train.py").write_text(_AROUND + snippet + "dist.destroy_process_group()\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    names = sorted(p.name.split(".")[0] for p in (tmp_path / "prof").glob("*.pt.trace.json"))
    assert names == ["rank0", "rank1"]
    read = subprocess.run([sys.executable, "-m", "helpers", "trace", str(tmp_path / "prof"), "--out",
                           str(tmp_path / "out")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert read.returncode == 0, read.stderr[-3000:]
    assert "all 2 ranks (5 steps each)" in read.stdout
