"""The guide's toy experiment (docs/adding_a_notebook.md), added to a temporary copy of the package: the registry,
the runner, the report and notebook 10 take it with no edit outside the guide's files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "adding_a_notebook.md"


def guide_files() -> dict[str, str]:
    """``{path: text}`` of every block the guide marks with ``<!-- file: PATH -->``."""
    found = re.findall(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", GUIDE.read_text(), flags=re.S)
    return dict(found)


def percent_to_notebook(text: str) -> dict:
    """A notebook (nbformat 4 JSON) from the percent format: ``# %%`` code cells, ``# %% [markdown]`` markdown."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    for part in re.split(r"^# %%", text, flags=re.M)[1:]:
        header, _, body = part.partition("\n")
        body = body.strip("\n")
        if "[markdown]" in header:
            nb.cells.append(nbformat.v4.new_markdown_cell("\n".join(l[2:] if l.startswith("# ") else l.lstrip("#")
                                                                   for l in body.splitlines())))
        else:
            cell = nbformat.v4.new_code_cell(body)
            if "parameters" in header:
                cell.metadata["tags"] = ["parameters"]
            nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    return nb


def test_the_guide_names_its_files():
    files = guide_files()
    assert set(files) == {"helpers/experiments/toy_sum.py", "notebooks/11_toy_sum.ipynb"}
    nb = percent_to_notebook(files["notebooks/11_toy_sum.ipynb"])
    assert nb.cells[0].source.splitlines()[0] == "# Sum a tensor two ways"
    assert any(c.metadata.get("tags") == ["parameters"] for c in nb.cells)


CHECK = r'''
import json, sys
from pathlib import Path
from helpers.experiments import registry
from helpers.results import ResultsStore, load_results
from helpers.verdict import Action
from helpers.workbook.runner import RunOptions, load_profile, run

assert registry.notebook_ids()[-1] == "11_toy_sum", registry.notebook_ids()
assert "toy_sum" in registry.optimization_names()
assert load_profile("smoke")["11_toy_sum"] == {"size": 1000, "repeats": 3}

run_dir, state = run(RunOptions(profile="smoke", device="cpu", only=("11",), out=Path("run").resolve(), timeout_s=600),
                     echo=print)
assert state.status == "ok", {n.id: n.error for n in state.notebooks}
table = load_results(run_dir / "results.jsonl")
rows = table[table["notebook"] == "11_toy_sum"]
assert set(rows["experiment"]) >= {"sum", "verdict", "machine state", "try it"}, sorted(set(rows["experiment"]))
html = (run_dir / "report.html").read_text()
assert "11 toy sum" in html and "11_toy_sum.ipynb" in html

from helpers.device import get_accelerator
from helpers.experiments import e2e_jobs, e2e_select

cpu = get_accelerator("cpu")
ResultsStore(Path("fake.jsonl"), notebook="11_toy_sum").verdict(
    metric="speedup", value=1.5, unit="x", recommendation="enable", reason="fake",
    action=Action("toy_sum", True, "toy_sum=True"))
sel = e2e_select.select_optimizations(["auto"], load_results(Path("fake.jsonl")), cpu, native_bf16=False)
by = {c.name: c for c in sel.choices}
assert by["toy_sum"].enabled and by["toy_sum"].source == "verdict", by["toy_sum"]
assert "toy_sum" in sel.optimizations
assert e2e_select.device_defaults(cpu, native_bf16=False)["toy_sum"] == (False, "a toy: on only where its verdict says so")
assert e2e_jobs.check_optimizations(["toy_sum"]) == ("toy_sum",)
print("TOY OK")
'''


@pytest.mark.notebook
def test_a_new_experiment_from_the_guide_is_picked_up_everywhere(tmp_path):
    repo = tmp_path / "repo"
    for name in ("helpers", "notebooks"):
        shutil.copytree(ROOT / name, repo / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    (repo / "data").mkdir()
    for path, text in guide_files().items():
        target = repo / path
        if target.suffix == ".ipynb":
            target.write_text(json.dumps(percent_to_notebook(text), indent=1))
        else:
            target.write_text(text)
    with open(repo / "notebooks" / "profiles" / "smoke.yaml", "a") as f:
        f.write("11_toy_sum:\n  size: 1000\n  repeats: 3\n")
    changed = sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if p.is_file()
                     and not (ROOT / p.relative_to(repo)).exists() or (p.is_file() and p.name == "smoke.yaml"))
    assert changed == ["helpers/experiments/toy_sum.py", "notebooks/11_toy_sum.ipynb", "notebooks/profiles/smoke.yaml"]
    env = {"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "MPLBACKEND": "Agg"}
    out = subprocess.run([sys.executable, "-c", CHECK], cwd=repo, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0 and "TOY OK" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
