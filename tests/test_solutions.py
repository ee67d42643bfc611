"""docs/solutions.md: every python block runs, section by section (one namespace per notebook's section, after the
setup block), so the solutions to the notebooks' "On your own" exercises are known to work. The blocks assert the
facts their answers rest on (a finding is an error, busbw = algbw x 2(n-1)/n, each worker draws its own stream)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = REPO / "docs" / "solutions.md"
NOTEBOOKS = sorted(p.stem for p in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def sections() -> dict[str, list[str]]:
    """``{"Setup": [code, ...], "00": [...], ...}``: the python blocks under each ``## `` heading."""
    out: dict[str, list[str]] = {}
    current = None
    for part in re.split(r"^## ", SOLUTIONS.read_text(), flags=re.M)[1:]:
        title = part.split("\n", 1)[0].strip()
        current = title.split()[0]
        out[current] = re.findall(r"```python\n(.*?)```", part, flags=re.S)
    return out


def test_every_notebook_has_a_section_and_every_exercise_an_entry():
    text = SOLUTIONS.read_text()
    import json

    for stem in NOTEBOOKS:
        nn = stem[:2]
        assert re.search(rf"^## {nn} ", text, flags=re.M), f"no section for {stem}"
        nb = json.loads((REPO / "notebooks" / f"{stem}.ipynb").read_text())
        own = next("".join(c["source"]) for c in nb["cells"] if "## On your own" in "".join(c["source"]))
        block = own.split("## On your own", 1)[1].split("\n## ", 1)[0]
        n_exercises = len(re.findall(r"^\d+\. ", block, flags=re.M))
        for k in range(1, n_exercises + 1):
            assert re.search(rf"^### {nn}\.{k} ", text, flags=re.M), f"{stem}: exercise {k} has no solution entry"


#: The sections whose code reruns a notebook at the smoke profile's own parameters (e.g. ``rerun("07")``): the
#: session's smoke run already made those runs, and :func:`_reuse_smoke_run` hands their records to ``rerun``. These
#: sections run last, in this order (the longest last), so that under pytest-xdist the other worker has finished the
#: smoke run by then.
REUSE_SMOKE_RUN = ("07", "06", "02", "05", "01")


def _reuse_smoke_run(namespace: dict, smoke) -> None:
    """Seed the solutions' ``rerun`` cache with each notebook's records of the session's smoke run (the smoke profile
    on the CPU, unchanged parameters): what ``rerun(nn)`` would measure again."""
    from helpers.results import load_results

    run_dir, state = smoke
    records = load_results(run_dir / "results.jsonl")
    for nb in state.notebooks:
        if nb.status == "ok":
            own = records[records["notebook"] == nb.id].reset_index(drop=True)
            namespace["_reruns"][(nb.id[:2], json.dumps({}))] = own


@pytest.mark.slow
@pytest.mark.parametrize("section", sorted((s[:2] for s in NOTEBOOKS),
                                            key=lambda s: REUSE_SMOKE_RUN.index(s) + 1 if s in REUSE_SMOKE_RUN else 0))
def test_solution_code_runs(section, monkeypatch, tmp_path, request, tmp_path_factory):
    from session_support import smoke_run_if_made

    blocks = sections()
    monkeypatch.chdir(REPO)
    namespace: dict = {"__name__": f"solutions_{section}"}
    exec(compile("\n".join(blocks["Setup"]), "docs/solutions.md (setup)", "exec"), namespace)
    smoke = smoke_run_if_made(request, tmp_path_factory) if section in REUSE_SMOKE_RUN else None
    if smoke is not None:
        _reuse_smoke_run(namespace, smoke)
    for i, code in enumerate(blocks.get(section, [])):
        exec(compile(code, f"docs/solutions.md ({section}, block {i + 1})", "exec"), namespace)
