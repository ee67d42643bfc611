"""The job's optimizer steps, as the probe counts them: a validation loop's batches are not accumulation's."""
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from helpers.tune import hook
from helpers.tune.hook import Recorder
from helpers.tune.session import job_steps

USER = """
def fit(train, val, epochs, step):
    for epoch in range(epochs):
        for x in train:
            step()
        for x in val:  # a validation loop: no optimizer step
            pass
"""


def test_a_validation_loop_does_not_count_as_gradient_accumulation(tmp_path, monkeypatch):
    monkeypatch.setattr(DataLoader, "__iter__", DataLoader.__iter__)
    monkeypatch.setattr(_BaseDataLoaderIter, "__next__", _BaseDataLoaderIter.__next__)
    script = tmp_path / "train.py"
    script.write_text(USER)
    rec = Recorder({"warmup": 1, "steps": 5, "user_roots": [str(tmp_path)], "script": str(script)})
    hook._watch_loops(rec)
    train, val = DataLoader(list(range(20)), batch_size=2), DataLoader(list(range(8)), batch_size=2)
    train._workbook_tune_user = val._workbook_tune_user = True  # as the hook marks the loaders the user builds
    ns: dict = {}
    exec(compile(USER, str(script), "exec"), ns)
    steps = []
    ns["fit"](train, val, 2, lambda: steps.append(1))
    assert rec.batches == 2 * (10 + 4) and len(steps) == 20
    probe = {"loop_sites": list(rec.loop_sites.values()), "steps_seen": len(steps), "batches_drawn": rec.batches}
    assert [x.get("drawn") for x in probe["loop_sites"]] == [20, 8]
    assert job_steps(probe) == (20, "10 batches per epoch x 2 epochs (epochs)")


def test_an_older_probe_without_counts_per_loop_still_reads_the_total():
    probe = {"loop_sites": [{"batches": 10, "epochs": {"expr": "epochs", "value": 2}}], "steps_seen": 5,
             "batches_drawn": 20}
    assert job_steps(probe) == (5, "10 batches per epoch x 2 epochs (epochs) / 4 batches per optimizer step")


RANGES = """
import sys


class Config:
    epochs = 4


cfg = Config()


def loop(loader, start, frames, read):
    for epoch in range(3):
        for x in loader:
            frames["literal"] = read(sys._getframe())
    for epoch in range(start, cfg.epochs):
        for x in loader:
            frames["names"] = read(sys._getframe())
    for epoch in range(len(loader) + 1):
        for x in loader:
            frames["call"] = read(sys._getframe())
    while True:
        for x in loader:
            frames["while"] = read(sys._getframe())
        break
"""


def test_the_epochs_are_read_from_the_range_loop_around_the_loader_loop(tmp_path):
    """``for epoch in range(3):`` holds the job's epochs where no name does (the job's length, compile's
    break-even): literals, names and attributes are read in the loop's frame; a call, or no range loop, gives
    none (nothing is evaluated)."""
    script = tmp_path / "train.py"
    script.write_text(RANGES)
    ns: dict = {}
    exec(compile(RANGES, str(script), "exec"), ns)
    got: dict = {}
    ns["loop"]([0], 1, got, hook._epochs_from_range)  # read at the loop, as the hook reads it
    assert got == {"literal": {"expr": "range(3)", "value": 3}, "names": {"expr": "range(start, cfg.epochs)",
                                                                          "value": 3},
                   "call": None, "while": None}
