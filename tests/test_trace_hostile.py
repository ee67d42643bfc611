"""Hostile or corrupt Kineto traces: each gives one TraceError that says what is wrong, in bounded memory.

Built in tmp_path at a scale that still crosses each limit of helpers/traces/kineto.py and peek.py: nesting 200,000
deep (400 KB), strings of 2 MiB and 20 MB, NaN / Infinity / negative times, gzip bombs of ~200 MB of text, one string
or number of 3 MiB for the header read and Ascend's trace_view.json (of 300 MB for the command, slow). The worst
cases run in a child process under RLIMIT_AS of 1 GiB whose peak resident memory (VmHWM) must stay under 512 MiB.
"""

from __future__ import annotations

import gzip
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.traces import kineto
from helpers.traces.kineto import read_kineto
from helpers.traces.model import TraceError

ROOT = Path(__file__).resolve().parents[1]
HEAD = '{"schemaVersion": 1, "traceEvents": [\n'
STEP = '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 1000000}'
PEAK_MIB = 512


def _event(i: int, *, name: str = "aten::add", ts="", dur="5", layout: str = "kineto") -> str:
    """One complete event as Kineto lays it out, or with sorted keys (which the fast path's expression misses)."""
    ts = ts or str(10 + i)
    if layout == "kineto":
        return (f'{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": 1, "tid": 1, "ts": {ts}, "dur": {dur}, '
                f'"args": {{"External id": {i}}}}}')
    return (f'{{"args": {{"External id": {i}}}, "cat": "cpu_op", "dur": {dur}, "name": "{name}", "ph": "X", '
            f'"pid": 1, "tid": 1, "ts": {ts}}}')


def _trace(path: Path, events: list[str]) -> Path:
    path.write_text(HEAD + ",\n".join([STEP, *events]) + "\n]}\n")
    return path


def _refused(path: Path, *needles: str) -> str:
    with pytest.raises(TraceError) as info:
        read_kineto(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: "), msg
    for needle in needles:
        assert needle in msg, msg
    assert "\n" not in msg
    return msg


def _child(path: Path, timeout: float = 300) -> tuple[str, float]:
    """read_kineto(path) in a child limited to 1 GiB of address space: (its one line of outcome, peak RSS MiB)."""
    code = textwrap.dedent(f"""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from helpers.traces.kineto import read_kineto
        from helpers.traces.model import TraceError
        try:
            read_kineto({str(path)!r})
            out = "read"
        except TraceError as exc:
            out = "TraceError: " + str(exc)
        peak = [int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")][0] / 1024
        print(out)
        print(peak)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    out, peak = p.stdout.strip().rsplit("\n", 1)
    return out, float(peak)


# ------------------------------------------------------------------------------------------------ nesting


@pytest.mark.parametrize("depth", [2_000, 20_000, 200_000])
def test_deeply_nested_brackets_are_refused_not_recursed_into(tmp_path, depth):
    path = tmp_path / "nested.pt.trace.json"
    path.write_text(HEAD + "[" * depth + "]" * depth + "]}")
    _refused(path, "nested", "levels deep", "not written by torch.profiler")


def test_brackets_that_never_close_are_refused_as_nesting(tmp_path):
    path = tmp_path / "open.pt.trace.json"
    path.write_text(HEAD + "[" * 200_000 + "}")
    _refused(path, "nested")


@pytest.mark.parametrize("where", ["args of an event", "metadata"])
def test_nesting_inside_an_event_or_the_metadata_is_refused(tmp_path, where):
    deep = '{"a": ' * 50_000 + "1" + "}" * 50_000
    if where == "metadata":
        path = tmp_path / "meta.pt.trace.json"
        path.write_text('{"deviceProperties": ' + deep + ', "traceEvents": [' + STEP + "]}")
    else:
        bad = '{"ph": "X", "cat": "cpu_op", "name": "x", "pid": 1, "tid": 1, "ts": 5, "dur": 1, "args": ' + deep + "}"
        path = _trace(tmp_path / "args.pt.trace.json", [_event(i) for i in range(10)] + [bad])
    _refused(path, "nested")


def test_nesting_in_a_chunk_the_fast_path_hands_to_json_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(kineto, "CHUNK_CHARS", 4096)
    bad = '{"args": ' + "[" * 5_000 + "]" * 5_000 + ', "ph": "X", "cat": "c", "name": "n", "pid": 1, "tid": 1}'
    events = [_event(i) for i in range(200)] + [bad] + [_event(i) for i in range(200, 600)]
    _refused(_trace(tmp_path / "chunk.pt.trace.json", events), "nested")


@pytest.mark.subprocess
def test_nesting_200000_deep_stays_small_in_memory(tmp_path):
    path = tmp_path / "nested.pt.trace.json"
    path.write_text(HEAD + "[" * 200_000 + "]" * 200_000 + "]}")
    out, peak = _child(path)
    assert out.startswith("TraceError: ") and "nested" in out, out
    assert peak < PEAK_MIB, f"peak RSS {peak:.0f} MiB"


# ------------------------------------------------------------------------------------------------ times


BAD_TIMES = [
    ({"ts": "NaN"}, "ts=NaN"),
    ({"ts": "Infinity"}, "ts=Infinity"),
    ({"ts": "-Infinity"}, "ts=-Infinity"),
    ({"ts": "1e300"}, "ts=1e+300"),
    ({"dur": "NaN"}, "dur=NaN"),
    ({"dur": "Infinity"}, "dur=Infinity"),
    ({"dur": "-5"}, "negative duration, dur=-5"),
]


@pytest.mark.parametrize("path_taken", ["fast", "json chunk", "exact"])
@pytest.mark.parametrize("bad,needle", BAD_TIMES, ids=[n for _, n in BAD_TIMES])
def test_times_that_are_not_finite_or_durations_below_zero_are_named(tmp_path, monkeypatch, bad, needle,
                                                                     path_taken):
    layout = "sorted" if path_taken == "json chunk" else "kineto"
    n = 3 if path_taken == "exact" else 600  # a small file is read by the exact path alone
    if path_taken != "exact":
        monkeypatch.setattr(kineto, "CHUNK_CHARS", 4096)
    events = [_event(i, layout=layout) for i in range(n)]
    events[n // 2] = _event(n // 2, name="aten::mul", layout=layout, **bad)
    msg = _refused(_trace(tmp_path / "t.pt.trace.json", events), needle, "aten::mul",
                   "corrupt or was not written by torch.profiler")
    assert f"complete event {n // 2 + 2:,} " in msg  # the step is the first complete event


def test_negative_but_finite_times_are_read(tmp_path):
    # a clock of its own may start before zero; only non-finite or absurd times are refused
    step = STEP.replace('"ts": 0', '"ts": -500000')
    path = tmp_path / "neg.pt.trace.json"
    path.write_text(HEAD + ",\n".join([step] + [_event(i, ts=str(-400000 + i)) for i in range(5)]) + "]}")
    rt = read_kineto(path)
    assert [s.step for s in rt.steps] == [1] and rt.steps[0].step_s == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------ long strings


def test_a_20_mb_string_is_refused(tmp_path):
    events = [_event(i) for i in range(100)] + [_event(100, name="a" * 20_000_000)]
    events += [_event(i) for i in range(101, 200)]
    _refused(_trace(tmp_path / "long.pt.trace.json", events), "a string", "runs on for more than 16 MiB")


@pytest.mark.parametrize("path_taken", ["fast", "exact"])
def test_a_name_of_two_mib_is_refused(tmp_path, monkeypatch, path_taken):
    if path_taken == "fast":  # the name lies inside one of the fast path's chunks
        monkeypatch.setattr(kineto, "CHUNK_CHARS", 6 << 20)
        events = [_event(i) for i in range(20_000)] + [_event(20_000, name="b" * (2 << 20))]
        events += [_event(i) for i in range(20_001, 60_000)]
    else:
        events = [_event(0, name="b" * (2 << 20))]
    _refused(_trace(tmp_path / "name.pt.trace.json", events), "event name is 2,097,152 characters long")


@pytest.mark.subprocess
def test_a_string_of_wide_characters_stays_small_in_memory(tmp_path):
    # 4-byte characters make Python hold the text at 4 bytes a character: the 16 MiB cap bounds the buffer
    path = tmp_path / "wide.pt.trace.json"
    with open(path, "w", encoding="utf-8") as f:
        f.write(HEAD + STEP + ",\n" + ",\n".join(_event(i) for i in range(1000)) + ",\n")
        f.write('{"ph": "X", "cat": "cpu_op", "name": "')
        for _ in range(40):
            f.write("\U0001F600" * 1_000_000)
        f.write('", "pid": 1, "tid": 1, "ts": 5, "dur": 1}]}')
    out, peak = _child(path)
    assert out.startswith("TraceError: ") and "runs on for more than" in out, out
    assert peak < PEAK_MIB, f"peak RSS {peak:.0f} MiB"


def test_metadata_beyond_the_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(kineto, "MAX_META_CHARS", 10_000)
    meta = ", ".join(f'"key{i}": "{"x" * 100}"' for i in range(200))
    path = tmp_path / "meta.pt.trace.json"
    path.write_text("{" + meta + ', "traceEvents": [' + STEP + "]}")
    _refused(path, "metadata beside traceEvents")


def test_an_integer_too_long_to_convert_is_refused(tmp_path):
    path = _trace(tmp_path / "digits.pt.trace.json", [_event(0).replace('"External id": 0', '"id": ' + "9" * 5000)])
    _refused(path, "cannot be decoded", "4300 digits")


def test_the_exact_path_hands_large_events_on_by_their_text(tmp_path, monkeypatch):
    monkeypatch.setattr(kineto, "PENDING_CHARS", 1000)
    calls = []
    real = kineto._Columns.add_dicts
    monkeypatch.setattr(kineto._Columns, "add_dicts", lambda self, ev: (calls.append(len(ev)), real(self, ev))[1])
    rt = read_kineto(_trace(tmp_path / "t.pt.trace.json", [_event(i) for i in range(40)]))
    assert rt.provenance["events"] == 41 and len(calls) >= 4 and max(calls) <= 10  # 9 events of ~110 characters


def test_chunks_for_json_are_decoded_in_pieces_with_the_same_result(tmp_path, monkeypatch):
    # "name" before "cat": the fast path's expression misses every event, so each chunk goes to json.loads
    events = [_event(i, name=f"op{i % 7}").replace('"cat": "cpu_op", ', "").replace('"pid"', '"cat": "cpu_op", "pid"')
              for i in range(3000)]
    path = _trace(tmp_path / "t.pt.trace.json", events)
    monkeypatch.setattr(kineto, "CHUNK_CHARS", 64 << 10)
    whole = read_kineto(path)
    monkeypatch.setattr(kineto, "JSON_PIECE_CHARS", 4 << 10)
    pieces = read_kineto(path)
    assert pieces.provenance["parse"] == whole.provenance["parse"]
    assert pieces.provenance["parse"]["json_chunks"] > 3 and not pieces.provenance["parse"]["restarted"]
    assert pieces.provenance["events"] == whole.provenance["events"] == 3001
    assert pieces.steps == whole.steps and pieces.top_ops == whole.top_ops


# ------------------------------------------------------------------------------------------------ gzip


def _gzip_stream(path: Path, head: str, block: bytes, total: int, tail: str) -> Path:
    """A gzip of ``head``, ``block`` repeated up to ``total`` bytes, ``tail``: written in chunks, never whole."""
    with gzip.open(path, "wb", compresslevel=6) as g:
        g.write(head.encode())
        n = 0
        while n < total:
            g.write(block)
            n += len(block)
        g.write(tail.encode())
    return path


@pytest.mark.subprocess
@pytest.mark.parametrize("what", ["spaces", "one repeated event"])
def test_a_gzip_bomb_is_refused_in_small_memory(tmp_path, what):
    if what == "spaces":
        block = b" " * (1 << 20)
    else:
        block = (",\n" + _event(7)).encode() * 4000
    path = _gzip_stream(tmp_path / "bomb.pt.trace.json.gz", HEAD + STEP, block, 200 << 20, "]}")
    assert path.stat().st_size < (200 << 20) / kineto.MAX_GZIP_RATIO
    out, peak = _child(path)
    assert out.startswith("TraceError: ") and "expands more than 200-fold" in out, out
    assert peak < PEAK_MIB, f"peak RSS {peak:.0f} MiB"


def _free_disk(monkeypatch, free: int) -> None:
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda where: usage(free * 2, free, free))


def test_a_gzip_whose_trailer_claims_gigabytes_is_refused_before_the_read_with_both_sizes(tmp_path, monkeypatch):
    data = gzip.compress((HEAD + STEP + "]}").encode())
    path = tmp_path / "claims.pt.trace.json.gz"
    path.write_bytes(data[:-4] + (0xFFFFFFF0).to_bytes(4, "little"))
    _free_disk(monkeypatch, 1 << 30)  # room for what 1 GiB of spill holds, not for 4.3 GB of text
    monkeypatch.setattr(kineto, "_parse", lambda *a, **k: pytest.fail("read despite the disk check"))
    _refused(path, "4.3 GB trace keeps its events on disk", "set TMPDIR")


def test_a_gzip_holding_more_than_its_trailer_says_is_checked_again(tmp_path, monkeypatch):
    events = ",\n".join(_event(i, name=f"op{i % 50}") for i in range(20_000))
    data = gzip.compress((HEAD + STEP + ",\n" + events + "]}").encode())
    path = tmp_path / "liar.pt.trace.json.gz"
    path.write_bytes(data[:-4] + (1).to_bytes(4, "little"))  # ISIZE says 1 byte (the CRC is not checked first)
    _free_disk(monkeypatch, 1 << 30)  # enough for what the trailer says, not for 4 GiB more
    monkeypatch.setattr(kineto, "CHUNK_CHARS", 4096)  # checked as the text grows, before gzip's own end check
    _refused(path, "more text than", "disk check assumed", "GB of disk", "set TMPDIR")


def test_no_room_for_the_spill_is_one_clear_error_and_leaves_nothing(tmp_path, monkeypatch):
    import tempfile

    events = ",\n".join(_event(i, name=f"op{i % 50}") for i in range(3_000))
    path = tmp_path / "t.pt.trace.json"
    path.write_text(HEAD + STEP + ",\n" + events + "]}")
    monkeypatch.setattr(kineto, "SPILL_EVENTS", 100)
    monkeypatch.setattr(kineto, "CHUNK_CHARS", 4096)
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill_dir))

    def full(self, *a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kineto.Spill, "write", full)
    _refused(path, "keeping the trace's events on disk", "No space left on device", "set TMPDIR")
    assert not any(spill_dir.iterdir()), "the spill folder was left behind"


# ------------------------------------------------------------------------------------------------ the command


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["NaN", "nested"])
def test_the_trace_command_prints_one_line_and_no_traceback(tmp_path, kind):
    if kind == "NaN":
        path = _trace(tmp_path / "nan.pt.trace.json", [_event(i) for i in range(5)] + [_event(5, ts="NaN")])
        needle = "ts=NaN"
    else:
        path = tmp_path / "nested.pt.trace.json"
        path.write_text(HEAD + STEP + ", " + "[" * 2_000 + "]" * 2_000 + "]}")
        needle = "nested"
    p = subprocess.run([sys.executable, "-m", "helpers", "trace", str(path), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode != 0
    assert "Traceback" not in p.stderr, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(path) in lines[0] and needle in lines[0], (
        p.stderr)


@pytest.mark.parametrize("text, needle", [
    ('{"traceEvents": [' + "[" * 200_000 + "]" * 200_000 + "]}", "nested more than 64 levels"),
    ('{"schemaVersion": 1, "x": ' + "[" * 200_000 + "]" * 200_000 + ', "traceEvents": []}', "nested more than"),
    ('{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, '
     '"ts": NaN, "dur": 1}]}', "corrupt or was not written by torch.profiler"),
])
def test_the_header_read_before_the_parse_is_bounded_too(tmp_path, text, needle):
    # the folder check reads each file's header first (helpers.traces.peek): it must refuse what the reader refuses,
    # in one line, without following 200,000 levels of nesting or blaming a killed job for a NaN
    from helpers.traces import peek

    path = tmp_path / "t.pt.trace.json"
    path.write_text(text)
    with pytest.raises(TraceError, match=needle) as e:
        peek.kineto_header(path)
    assert "\n" not in str(e.value) and "killed" not in str(e.value)


# ------------------------------------------------------------------------------------------------ one long token


def _long_token(path: Path, head: str, block: str, total: int, tail: str) -> Path:
    """``head``, ``block`` repeated up to ``total`` characters, ``tail``: written in blocks, never held whole."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(head)
        for _ in range(0, total, len(block)):
            f.write(block)
        f.write(tail)
    return path


LONG_TOKENS = {  # (text before, the block repeated, text after, what the error calls it)
    "event name": ('{"traceEvents": [{"name": "', "a" * 4096, '"}]}', "a string"),
    "whole file": ('"', "a" * 4096, '"', "a string"),
    "key": ('{"', "a" * 4096, '": 1, "traceEvents": []}', "a string"),
    "metadata value": ('{"schemaVersion": 1, "x": "', "a" * 4096, '", "traceEvents": []}', "a string"),
    "escaped quotes": ('{"traceEvents": [{"name": "', '\\"' * 2048, '"}]}', "a string"),
    "number": ('{"traceEvents": [{"ph": "X", "ts": 1', "1" * 4096, "}]}", "a number or literal"),
}


@pytest.mark.parametrize("kind", LONG_TOKENS)
def test_one_long_token_is_refused_by_the_header_read_as_it_is_read(tmp_path, kind):
    # yajl (ijson's lexer) keeps a token cut by a read and lexes it again after each read: quadratic time, and the
    # whole token in memory. The header read measures each token across its reads and stops past the limit.
    from helpers.traces import peek

    head, block, tail, what = LONG_TOKENS[kind]
    path = _long_token(tmp_path / "t.pt.trace.json", head, block, 3 << 20, tail)
    with pytest.raises(TraceError) as e:
        peek.kineto_header(path)
    msg = str(e.value)
    start = len(head) - 1  # the opening quote, or the number's first digit
    assert msg.startswith(f"{path}: {what} in the JSON runs on for more than 1 MiB from byte {start:,} "), msg
    assert "pass the .pt.trace.json torch.profiler wrote" in msg and "\n" not in msg


@pytest.mark.parametrize("read_bytes", [1, 2, 3, 5, 7, 64])
def test_tokens_are_measured_across_reads_of_any_size(tmp_path, monkeypatch, read_bytes):
    # tokens of up to 40 bytes, escapes (\" and \\) cut by the reads anywhere, pass a limit of 40 bytes; one that
    # runs on past a read's end after 40 bytes is refused: any longer than the limit and a read. The metadata
    # follows the events, so that the header read scans them all.
    from helpers.traces import peek

    monkeypatch.setattr(peek, "READ_BYTES", read_bytes)
    monkeypatch.setattr(peek, "MAX_TOKEN_BYTES", 40)
    names = ['a\\"b\\\\', "\\\\" * 19, '\\"' * 19, "x" * 38, "\\u00e9t\\u00e9", "\u00e9" * 19, "\\\\\\\"" * 9]
    events = [f'{{"name": "{n}", "ts": {i}.{"1" * 37}, "ok": true, "no": null}}' for i, n in enumerate(names)]
    text = '{"traceEvents": [' + ", ".join(events) + '], "distributedInfo": {"rank": 3, "world_size": 4}}'
    path = tmp_path / "t.pt.trace.json"
    path.write_text(text, encoding="utf-8")
    h = peek.kineto_header(path)
    assert (h.rank, h.world_size, h.complete) == (3, 4, True)
    for long in ['"' + "y" * 120 + '"', '"' + "\\\\" * 60 + '"', "1." + "1" * 120, '"' + "\u00e9" * 60 + '"']:
        for where, at in [("first", 9), ("event", text.index('"no"') + 6)]:
            if where == "first":
                bad = '{"long": ' + long + ", " + text[1:]
            else:
                bad = text.replace('"no": null', '"no": ' + long, 1)
            path.write_text(bad, encoding="utf-8")
            with pytest.raises(TraceError, match=f"runs on for more than 0 MiB from byte {at} "):
                peek.kineto_header(path)


def test_strings_of_real_traces_pass_the_header_read_whole(tmp_path):
    # a kernel name of 64 KiB (torch's longest are a few KB) and 10,000 strings that straddle the reads, scanned to
    # the metadata after them
    from helpers.traces import peek

    events = [_event(i, name="void at::native::kernel<" + "float, " * 9000 + ">") for i in range(3)]
    events += [_event(i, name=f"op\\\\{i}\\\"" * (i % 50)) for i in range(10_000)]
    path = tmp_path / "t.pt.trace.json"
    path.write_text('{"traceEvents": [' + ",\n".join([STEP, *events]) + '], "distributedInfo": {"rank": 1}}')
    h = peek.kineto_header(path)
    assert h.complete and h.rank == 1


@pytest.mark.parametrize("where", ["second event", "first event"])
def test_one_long_string_in_ascend_trace_view_stops_its_read_as_a_cut_does(tmp_path, where):
    # trace_view.json is streamed by the same lexer: the string ends the read, the other files give the steps
    import json

    from helpers.traces.ascend import OUTPUT_DIR, TRACE_VIEW_FILE, read_ascend
    from tests.ascend_fixtures import Step, build_ascend_folder

    steps = [Step(n, host_s=0.1, data_s=0.05, compute_s=0.04, free_s=0.01) for n in range(3)]
    folder = build_ascend_folder(tmp_path, steps)
    tv = folder / OUTPUT_DIR / TRACE_VIEW_FILE
    events = [json.dumps(e) for e in json.loads(tv.read_text())]
    before = 1 if where == "second event" else 0
    head = "[" + "".join(e + ", " for e in events[:before]) + '{"name": "'
    _long_token(tv, head, "a" * 4096, 3 << 20, '"}, ' + ", ".join(events[before:]) + "]")
    t = read_ascend(folder)
    assert [s.step for s in t.steps] == [0, 1, 2] and all(s.data is None for s in t.steps)
    said = [x for x in t.limits if "runs on for more than 1 MiB" in x]
    assert len(said) == 1 and said[0].startswith(f"{tv}: a string in the JSON runs on for more than 1 MiB from byte "
                                                 f"{len(head) - 1:,} "), t.limits
    assert f"not written by torch_npu; the read stops there: host phases come from the {before} events" in said[0]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["event name", "whole file"])
def test_a_300_mb_trace_of_one_string_is_one_line_within_60_s_in_small_memory(tmp_path, kind):
    # issue 44: the trace command gave no answer within 120 s on such a file (the header read's lexer, quadratic)
    head, block, tail, what = LONG_TOKENS[kind]
    path = _long_token(tmp_path / "long.pt.trace.json", head, "a" * (1 << 20), 300 << 20, tail)
    code = textwrap.dedent(f"""
        import resource, sys, time
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        sys.argv = ["helpers", "trace", {str(path)!r}, "--out", {str(tmp_path / "out")!r}]
        from helpers.workbook.cli import main
        t = time.monotonic()
        rc = main()
        took = time.monotonic() - t
        peak = [int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:")][0] / 1024
        print(rc, took, peak)
    """)
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    finally:
        path.unlink()  # pytest keeps the last runs' folders: not 300 MB each
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    rc, took, peak = p.stdout.split()
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert rc != "0" and len(lines) == 1, p.stderr
    assert lines[0].startswith(f"error: {path}: {what} in the JSON runs on for more than 1 MiB"), lines[0]
    assert float(took) < 60, f"{float(took):.0f} s"
    assert float(peak) < PEAK_MIB, f"peak RSS {float(peak):.0f} MiB"


def test_metadata_after_a_long_event_array_leaves_the_header_incomplete_not_wrong(tmp_path, monkeypatch):
    from helpers.traces import peek

    monkeypatch.setattr(peek, "MAX_SCAN_BYTES", 1000)
    events = ", ".join('{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": %d, "dur": 1}' % i
                       for i in range(200))
    path = tmp_path / "t.pt.trace.json"
    path.write_text('{"traceEvents": [' + events + '], "distributedInfo": {"rank": 1, "world_size": 2}}')
    h = peek.kineto_header(path)
    assert h.complete is False and h.rank is None  # not read, and said so: the ranks are checked after the read
    monkeypatch.setattr(peek, "MAX_SCAN_BYTES", 1 << 30)
    h = peek.kineto_header(path)
    assert h.complete and (h.rank, h.world_size) == (1, 2)
