"""expected_warnings: a notebook's intended warnings go to stdout with a prefix, not to stderr; errors still do."""

from __future__ import annotations

import logging
import sys
import warnings

from helpers.workbook.output import expected_warnings


def test_intended_warnings_print_on_stdout_and_errors_stay_on_stderr(capsys):
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    root.addHandler(handler)
    try:
        with expected_warnings("the truncated JPEG is reported and skipped") as lines:
            logging.getLogger("helpers.pipeline.fast").warning("bad image %s: truncated", "x.jpg")
            warnings.warn("too many workers for 2 cores", UserWarning)
            logging.getLogger("helpers.pipeline.fast").error("a real error")
        logging.getLogger("helpers.pipeline.fast").warning("after the block")
    finally:
        root.removeHandler(handler)
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "(expected warnings below: the truncated JPEG is reported and skipped)"
    assert "expected: WARNING helpers.pipeline.fast: bad image x.jpg: truncated" in out
    assert "expected: UserWarning: too many workers for 2 cores" in out
    assert lines == [l for l in out.splitlines()[1:]]
    assert "bad image" not in err and "a real error" in err and "after the block" in err
    assert all(handler is not h for h in root.handlers)


def test_nothing_is_printed_when_no_warning_comes(capsys):
    with expected_warnings("more workers than cores") as lines:
        logging.getLogger("helpers").info("not a warning")
    assert lines == [] and capsys.readouterr().out == ""


def test_only_the_matching_warnings_are_expected(capsys, monkeypatch):
    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *a, **k: shown.append(str(message)))
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    root.addHandler(handler)
    try:
        with expected_warnings("more workers than cores, on purpose", match=r"more than the \d+ usable CPU"):
            logging.getLogger("helpers.pipeline.loader").warning("num_workers=3 is more than the 2 usable CPU core(s)")
            logging.getLogger("helpers.pipeline.fast").warning("bad image y.jpg")
            warnings.warn("something else", UserWarning)
    finally:
        root.removeHandler(handler)
    out, err = capsys.readouterr()
    assert "expected: WARNING helpers.pipeline.loader: num_workers=3" in out
    assert "bad image y.jpg" in err and "bad image" not in out
    assert shown == ["something else"] and "something else" not in out  # shown as Python shows warnings
