"""The change, in the notebooks (issue 35, item 2): each of notebooks 02-09 shows its technique in a cell the learner
runs, the few lines of plain PyTorch, timed before and after.

- Each notebook has its "The change in code" section (a heading, then the code cells tagged ``technique``) before
  the call that makes its long measurement, and no technique cell is a check cell.
- For 03, 04, 06 and 07 the lines that make the change are the lines ``workbook tune`` writes: the test has
  :func:`helpers.tune.rewrite.apply_edits` rewrite the cell's own "before" lines and finds the result in the cell
  (``device_type``'s value aside: the cell names the notebook's device).
- For 05 the cell defines the side-stream prefetcher exactly as :data:`helpers.pipeline.side_stream.SOURCE` has it,
  the text tune writes into a script and the functions its runtime candidate runs.
- Each technique cell runs from the notebook's parameters (the smoke profile's values) and ``acc`` (the CPU here)
  alone: its own imports and its own small data, nothing else from the notebook.
"""

from __future__ import annotations

import contextlib
import io
import re
import textwrap
import time
from pathlib import Path

import nbformat
import pytest

from helpers.experiments.registry import validate_notebook_params
from helpers.tune.rewrite import Edit, apply_edits
from helpers.workbook.nbtools import is_check_cell
from helpers.workbook.profiles import build_parameters, load_profile

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = ("02", "03", "04", "05", "06", "07", "08", "09")
HEADING = "## The change in code"
TAG = "technique"

#: Per notebook: the "before" lines as the cell has them, and the edits tune makes to such lines (the edit kinds and
#: values of helpers.tune.candidates; only their lines are the cell's).
BEFORE = {
    "03": ("after = DataLoader(files, batch_size=None, collate_fn=simplejpeg.decode_jpeg)\n",
           [Edit("loader", "cell.py", 1, {"num_workers": 2, "persistent_workers": True})]),
    "04": ('for (x,) in DataLoader(data, batch_size=P["batch_size"]):\n    x = x.to(device)\n',
           [Edit("loader", "cell.py", 1, {"pin_memory": True}), Edit("non_blocking", "cell.py", 2)]),
    "06": ("import torch\nloss = model(x).square().mean()\n",
           [Edit("autocast", "cell.py", 2, {"device_type": "cpu", "dtype": "bfloat16"})]),
    "07": ("import torch\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
           [Edit("channels_last", "cell.py", 2, {"name": "model", "assign": True})]),
}


def notebook(nn: str) -> Path:
    return next((ROOT / "notebooks").glob(f"{nn}_*.ipynb"))


def technique_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if TAG in c.metadata.get("tags", [])]


def _lines(source: str) -> list[str]:
    """Source lines without trailing comments, with ``device_type``'s value masked; blank lines dropped."""
    out = []
    for line in source.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).rstrip()
        line = re.sub(r"device_type=[^,)]+", "device_type=<device>", line)
        if line.strip():
            out.append(line)
    return out


def _holds_block(cell: str, block: list[str], *, any_target: bool = False) -> bool:
    """Whether ``block`` (lines) appears in ``cell`` as consecutive lines at some indentation; with ``any_target``
    the name an assignment binds may differ (the cell keeps the "before" and the "after" side by side)."""
    def norm(line: str) -> str:
        return re.sub(r"^(\s*)\w+ = ", r"\1<name> = ", line) if any_target else line

    lines = [norm(x) for x in _lines(cell)]
    want = [norm(x) for x in _lines(textwrap.dedent("\n".join(block)))]
    for indent in ("", "    ", "        "):
        shifted = [indent + w for w in want]
        if any(lines[i:i + len(shifted)] == shifted for i in range(len(lines) - len(shifted) + 1)):
            return True
    return False


@pytest.mark.parametrize("nn", NUMBERS)
def test_each_notebook_shows_its_change_before_the_long_measurement(nn):
    nb = nbformat.read(notebook(nn), as_version=4)
    found = technique_cells(nb)
    assert found, f"notebook {nn} has no code cell tagged {TAG!r}"
    assert found == list(range(found[0], found[0] + len(found))), "the technique cells follow one another"
    assert all(nb.cells[i].cell_type == "code" and not is_check_cell(nb.cells[i]) for i in found)
    intro = nb.cells[found[0] - 1]
    assert intro.cell_type == "markdown" and intro.source.startswith(HEADING), \
        f"notebook {nn}: the technique cells follow a markdown cell that starts {HEADING!r}"
    long_run = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and ".run(" in c.source)
    assert found[-1] < long_run, f"notebook {nn}: the change comes before the long measurement (cell {long_run})"
    code = "\n".join(nb.cells[i].source for i in found)
    assert "compare(" in code and "verdict_text()" in code, "the cell times before against after"


@pytest.mark.parametrize("nn", sorted(BEFORE))
def test_the_change_is_the_code_tune_writes(nn):
    nb = nbformat.read(notebook(nn), as_version=4)
    cell = "\n".join(nb.cells[i].source for i in technique_cells(nb))
    before, edits = BEFORE[nn]
    # the cell's own longest line, as a last line: tune keeps a call it lengthens within its file's own limit
    before += "#" * max(len(ln) for ln in cell.splitlines()) + "\n"
    after, made, skipped = apply_edits(before, edits)
    assert not skipped and len(made) == len(edits), skipped
    old, new = before.splitlines(), after.splitlines()
    changed_old = [x for x in old if x not in new]
    changed_new = [x for x in new if x not in old]
    assert changed_new, "tune's rewrite changed nothing"
    assert _holds_block(cell, changed_new), (
        f"notebook {nn}: the technique cell does not hold tune's lines\n" + "\n".join(changed_new))
    if changed_old:  # the AMP recipe's shape: the same lines before the change, in the same cell
        assert _holds_block(cell, changed_old, any_target=True), (
            f"notebook {nn}: the technique cell does not hold the lines before the change\n" + "\n".join(changed_old))


def test_06s_float16_lines_are_the_ones_tune_writes():
    """Where the device has no bfloat16, tune writes float16 with the AMP recipe's loss scaling, and
    ``unscale_`` before a gradient clip; notebook 06's cell holds those lines in tune's order: the scaler, then the
    step from the autocast to ``update()`` as one block (the GradScaler's device masked as the autocast's is)."""
    nb = nbformat.read(notebook("06"), as_version=4)
    cell = "\n".join(nb.cells[i].source for i in technique_cells(nb))
    before = ("import torch\nloss = model(x).square().mean()\noptimizer.zero_grad()\nloss.backward()\n"
              "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)\noptimizer.step()\n")
    edits = [Edit("autocast", "cell.py", 2, {"device_type": "cpu", "dtype": "float16"}),
             Edit("grad_scaler", "cell.py", 6, {"device_type": "cpu", "backward": [4], "clip": [5]})]
    after, made, skipped = apply_edits(before, edits)
    assert not skipped and len(made) == 2, skipped
    new = [x for x in after.splitlines() if x.strip() and x not in before.splitlines()]
    assert len(new) == 7, new  # the scaler, the with, the loss inside it, scale/backward, unscale_, step, update

    def mask(text: str) -> str:
        return re.sub(r"GradScaler\([^)]*\)", "GradScaler(<device>)", text)

    scaler = next(x for x in new if "GradScaler(" in x)
    step = after.split(scaler, 1)[1].strip("\n").splitlines()  # with ... through update(), in tune's order
    assert [x for x in step if x in new] == [x for x in new if x != scaler]
    assert _holds_block(mask(cell), [mask(scaler)]), f"notebook 06's cell lacks tune's line {scaler!r}"
    assert _holds_block(mask(cell), step), "notebook 06's cell lacks tune's step, in its order\n" + "\n".join(step)


def test_05s_prefetcher_is_the_one_tune_runs_and_writes():
    import inspect

    from helpers.pipeline import side_stream

    nb = nbformat.read(notebook("05"), as_version=4)
    cell = "\n".join(nb.cells[i].source for i in technique_cells(nb))
    for f in (side_stream.side_stream, side_stream.copy_batch, side_stream.prefetch):
        assert inspect.getsource(f).rstrip("\n") in cell, (
            f"notebook 05's {f.__name__} differs from helpers/pipeline/side_stream.py's")
    assert side_stream.HEADER in cell and all(f"import {m}\n" in cell for m in side_stream.IMPORTS)
    assert "wait_stream" in side_stream.SOURCE and "record_stream" in side_stream.SOURCE


def test_the_check_finds_a_line_that_differs_from_tunes():
    cell = "before = DataLoader(files)\nafter = DataLoader(files, persistent_workers=True, num_workers=2)\n"
    new, _, _ = apply_edits("after = DataLoader(files)\n",
                            [Edit("loader", "cell.py", 1, {"num_workers": 2, "persistent_workers": True})])
    assert not _holds_block(cell, new.splitlines())
    autocast = 'with torch.autocast(device_type=acc.device.type, dtype=torch.bfloat16):  # the change\n    y = m(x)\n'
    assert _holds_block(autocast, ['with torch.autocast(device_type="cpu", dtype=torch.bfloat16):', "    y = m(x)"])
    assert not _holds_block(autocast, ['with torch.autocast(device_type="cpu", dtype=torch.float16):', "    y = m(x)"])


def smoke_params(nn: str, tmp_path: Path) -> dict:
    """The notebook's parameters at the smoke profile, on the CPU, validated as the notebook's first cell does."""
    path = notebook(nn)
    given = build_parameters(path, load_profile("smoke"), device="cpu", run_dir=tmp_path)
    return validate_notebook_params(path.stem, given)


@pytest.mark.slow
@pytest.mark.parametrize("nn", NUMBERS)
def test_the_technique_cell_runs_from_the_parameters_and_the_device_alone(nn, tmp_path):
    import torch.distributed as dist

    from helpers.device import get_accelerator

    nb = nbformat.read(notebook(nn), as_version=4)
    namespace = {"P": smoke_params(nn, tmp_path), "acc": get_accelerator("cpu")}
    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        for i in technique_cells(nb):
            exec(compile(nb.cells[i].source, f"<notebook {nn}, cell {i}>", "exec"), namespace)  # noqa: S102
    took = time.perf_counter() - t0
    printed = out.getvalue()
    assert printed.strip(), f"notebook {nn}: the technique cell prints nothing"
    assert re.search(r"faster|slower|no measurable difference|smaller than|nothing to|no side stream|a CPU",
                     printed), printed
    assert not (dist.is_available() and dist.is_initialized()), "the cell leaves no process group behind"
    assert took < 60, f"notebook {nn}: the technique cell took {took:.1f} s (a few seconds expected)"


def test_jpeg_bytes_gives_the_files_simplejpeg_decodes(tmp_path):
    """The data of 02's and 03's cells: the dataset's JPEGs that libjpeg-turbo decodes to RGB, at most ``n``."""
    import simplejpeg
    from PIL import Image

    from helpers.errors import DataError, ParameterError
    from helpers.pipeline.prepare import jpeg_bytes

    Image.new("RGB", (32, 24), (200, 30, 30)).save(tmp_path / "a.jpg")
    Image.new("RGB", (32, 24), (30, 200, 30)).save(tmp_path / "b.jpg")
    Image.new("CMYK", (32, 24), (0, 0, 0, 0)).save(tmp_path / "c.jpg")  # libjpeg-turbo cannot make RGB of it
    Image.new("RGB", (32, 24)).save(tmp_path / "d.png")
    got = jpeg_bytes(str(tmp_path), n=10)
    assert len(got) == 2 and all(simplejpeg.decode_jpeg(b).shape == (24, 32, 3) for b in got)
    assert len(jpeg_bytes(str(tmp_path), n=1)) == 1
    with pytest.raises(ParameterError, match="n must be"):
        jpeg_bytes(str(tmp_path), n=0)
    pngs = tmp_path / "pngs"
    pngs.mkdir()
    Image.new("RGB", (32, 24)).save(pngs / "e.png")
    with pytest.raises(DataError, match="no file of"):
        jpeg_bytes(str(pngs), n=4)


@pytest.mark.slow
def test_notebook_01_shows_the_three_line_instrument_on_a_plain_loop(tmp_path):
    """01's technique: a plain loop (a PIL Dataset, a small CNN) timed with the instrument's three lines, as a
    learner pastes them into their own loop; it prints the phase split and a one-line verdict."""
    from helpers.device import get_accelerator
    from helpers.verdict import HEADLINE_CHARS

    nb = nbformat.read(notebook("01"), as_version=4)
    cells = technique_cells(nb)
    assert cells and cells == list(range(cells[0], cells[0] + len(cells))), "the technique cells follow one another"
    source = "\n".join(nb.cells[i].source for i in cells)
    loop = nb.cells[cells[-1]].source  # the last cell: the learner's loop with the three lines, nothing else
    for line in ("steps = instrument(loader, device=device", "for x, y in steps:", "steps.copied()",
                 "steps.report()"):
        assert line in loop, line
    assert not any(is_check_cell(nb.cells[i]) for i in cells)
    namespace = {"P": smoke_params("01", tmp_path), "acc": get_accelerator("cpu")}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "<notebook 01, technique>", "exec"), namespace)  # noqa: S102
    lines = out.getvalue().splitlines()
    assert re.match(r"your loop: \d+ steps measured$", lines[0]), lines
    assert re.match(r"(HOST-BOUND|BALANCED|DEVICE-BOUND|INCONCLUSIVE)", lines[1]) and len(lines[1]) <= HEADLINE_CHARS
    assert any(line.startswith("median step ") and "data " in line and "copy " in line and "compute " in line
               for line in lines), lines
