"""report.html rendered in a real headless browser (Chromium from the system packages).

The test builds a small run folder (records written through ResultsStore and
two figures drawn with matplotlib), writes the report, then asks Chromium for
a screenshot of it and for its DOM after load. It checks that the screenshot
is a non-blank PNG of the window size, that the checklist table has the
expected rows, that every <img> is a data URI that decodes, that the browser
loaded every image (a load-time check in a copy of the page reports images
with naturalWidth 0), and that Chromium logged no error about the page.

Chromium missing: the test fails with the install command when
WORKBOOK_REQUIRE_BROWSER=1 (set by .ci/run), and is skipped otherwise.
"""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image, ImageStat

from browser_support import chromium

from helpers.results import ResultsStore
from helpers.workbook.report import checklist_items, write_report

WINDOW = (1280, 2000)
TIMEOUT_S = 90
#: Chromium's own log lines that concern the page (a load failure, a script error).
PAGE_ERRORS = re.compile(r"net::ERR_|Failed to load resource|Uncaught|Not allowed to load|BROKEN-IMAGE|"
                         r"Refused to|Mixed Content", re.I)
#: Appended to a copy of the page for the DOM check only (the report itself has no script):
#: after load, count images the browser could not decode, and log each one as a console error.
LOAD_CHECK = """<script>window.addEventListener('load', function () {
  var broken = 0;
  for (var i = 0; i < document.images.length; i++) {
    var im = document.images[i];
    if (!im.complete || im.naturalWidth === 0) { broken++; console.error('BROKEN-IMAGE ' + im.alt); }
  }
  document.body.setAttribute('data-images', String(document.images.length));
  document.body.setAttribute('data-broken-images', String(broken));
});</script>"""


def _chromium() -> str:
    return chromium()


def _run_chromium(exe: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-extensions", "--disable-sync", "--no-first-run", "--no-default-browser-check",
           "--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio", "--enable-logging=stderr",
           "--log-level=0", f"--user-data-dir={tmp_path / 'chromium-profile'}",
           f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=5000", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"Chromium did not finish in {TIMEOUT_S} s: {' '.join(cmd)}")
    assert proc.returncode == 0, f"Chromium exited with {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc


def _page_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if PAGE_ERRORS.search(line)]


@pytest.fixture
def run_with_figures(tmp_path):
    """A run folder with verdicts for 01, 05, 07, 10 and two matplotlib figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = tmp_path / "run"
    results = run_dir / "results.jsonl"
    s = ResultsStore(results, notebook="01_baseline_profiling", device="cpu:test")
    s.add("step", "baseline", "step_time", 0.21, "s", repeats=20, spread={"p25": 0.2, "p75": 0.22})
    s.verdict(metric="exposed_input_fraction", value=0.78, unit="fraction", recommendation="host-bound",
              reason="the device waits for input 78% of each step", spread={"p25": 0.75, "p75": 0.8}, repeats=20)
    s = ResultsStore(results, notebook="05_stream_overlap", device="cpu:test")
    s.verdict(metric="exposed_input_fraction", value=0.08, unit="fraction", recommendation="enable",
              reason="exposed input 31% -> 8% of the step", spread={"p25": 0.07, "p75": 0.09}, repeats=20)
    s = ResultsStore(results, notebook="07_channels_last", device="cpu:test")
    s.verdict(metric="speedup", value=1.26, unit="x", recommendation="enable", reason="1.26x faster",
              spread={"ci_low": 1.14, "ci_high": 1.4, "confidence": 0.95}, repeats=9)
    s = ResultsStore(results, notebook="10_end_to_end", device="cpu:test")
    s.verdict(metric="speedup", value=2.7, unit="x", recommendation="enable", reason="2.7x, same learning",
              spread={"ci_low": 2.5, "ci_high": 2.9, "confidence": 0.95}, repeats=5)
    figs = run_dir / "figures"
    figs.mkdir(parents=True)
    for nb, name in (("01_baseline_profiling", "phase_breakdown"), ("10_end_to_end", "before_after")):
        fig, ax = plt.subplots(figsize=(4, 2.5))
        ax.bar(["data", "compute"], [0.78, 0.22], color=["#d95f02", "#1b9e77"])
        ax.set_title(name)
        fig.savefig(figs / f"{nb}__{name}.png", dpi=60)
        plt.close(fig)
    html_path, _ = write_report(run_dir)
    return html_path


class _Dom(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.imgs, self.body = [], [], {}
        self._in_table = False
        self._row = None
        self._cell = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        elif tag == "table" and a.get("id") == "checklist":
            self._in_table = True
        elif tag == "tr" and self._in_table and "data-notebook" in a:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = []
        elif tag == "img":
            self.imgs.append(a)

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None
        elif tag == "table":
            self._in_table = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def test_report_renders_in_chromium(run_with_figures, tmp_path):
    exe = _chromium()
    html_path = run_with_figures

    # 1. screenshot of the report as a user opens it (kept in tmp_path as the test's artifact)
    shot = tmp_path / "report.png"
    proc = _run_chromium(exe, tmp_path, f"--screenshot={shot}", html_path.as_uri())
    assert not _page_errors(proc.stderr), _page_errors(proc.stderr)
    assert shot.is_file(), f"no screenshot written:\n{proc.stderr[-2000:]}"
    with Image.open(shot) as im:
        assert im.format == "PNG" and im.size == WINDOW
        gray = im.convert("L")
        stat = ImageStat.Stat(gray)
        assert stat.stddev[0] > 10, f"screenshot looks blank (pixel std {stat.stddev[0]:.1f})"
        dark = sum(gray.histogram()[:128]) / (WINDOW[0] * WINDOW[1])
        assert dark > 0.005, f"almost no dark pixels ({dark:.2%}): no text drawn?"

    # 2. the DOM after load, from a copy of the page with a load-time image check appended
    checked = html_path.with_name("report_checked.html")
    checked.write_text(html_path.read_text(encoding="utf-8").replace("</body>", LOAD_CHECK + "</body>"),
                       encoding="utf-8")
    proc = _run_chromium(exe, tmp_path, "--dump-dom", checked.as_uri())
    assert not _page_errors(proc.stderr), _page_errors(proc.stderr)
    dom = _Dom()
    dom.feed(proc.stdout)
    assert [r[0] for r in dom.rows] == [name for _, name in checklist_items()]
    by_item = {r[0]: r for r in dom.rows}
    assert by_item["end to end"][1:3] == ["2.70x (95% CI 2.50–2.90)", "enable"]
    assert by_item["baseline profiling"][1:3] == ["78% (IQR 75%–80%)", "host-bound"]
    assert by_item["collectives"][2] == "missing"
    assert dom.body.get("data-images") == "2", "the load check did not run (or found no images)"
    assert dom.body.get("data-broken-images") == "0"
    assert len(dom.imgs) == 2
    for img in dom.imgs:
        src = img["src"]
        assert not re.match(r"^[a-z]+://", src), f"the report loads an external image: {src[:80]}"
        assert src.startswith("data:image/png;base64,")
        with Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1], validate=True))) as fig:
            fig.load()
            assert fig.width > 50 and fig.height > 50


@pytest.mark.parametrize("required, outcome", [("1", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_missing_chromium_skips_or_fails_with_the_install_command(monkeypatch, required, outcome):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("WORKBOOK_REQUIRE_BROWSER", required)
    with pytest.raises(outcome, match="apt-get install -y --no-install-recommends chromium"):
        _chromium()
