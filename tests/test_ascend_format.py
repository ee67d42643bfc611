"""The built Ascend folders (tests/ascend_fixtures.py) and the reader's names against torch_npu 2.13.0's writer.

Every header row, file and folder name, event key and metadata key the reader relies on is read from the
wheel's own source (parsed, never imported; tests/npu_wheel.py finds or downloads the wheel) and compared with
what the reader expects and what the builder writes, so that neither can drift from the real format.
"""

from __future__ import annotations

import ast
import csv
import importlib.util
import json
import re
from pathlib import Path

import pytest

from helpers.diagnose import profiler as diag_profiler
from helpers.traces import ascend
from tests import ascend_fixtures as fx
from tests.npu_wheel import wheel_or_skip

PROF = "torch_npu/profiler/"
ANALYSIS = PROF + "analysis/"
STEP_PARSER = ANALYSIS + "prof_view/_trace_step_time_parser.py"
OPERATOR_PARSER = ANALYSIS + "prof_view/_operator_view_parser.py"
KERNEL_PARSER = ANALYSIS + "prof_view/_kernel_view_parser.py"
TRACE_PARSER = ANALYSIS + "prof_view/_trace_view_parser.py"
CSV_HEADERS = ANALYSIS + "prof_common_func/_csv_headers.py"
CONSTANT = ANALYSIS + "prof_common_func/_constant.py"
PATHS = ANALYSIS + "prof_common_func/_path_manager.py"
EVENTS = ANALYSIS + "prof_common_func/_trace_event_manager.py"
FILES = ANALYSIS + "prof_common_func/_file_manager.py"
INTERFACE = PROF + "profiler_interface.py"
CREATOR = PROF + "_profiler_path_creator.py"


@pytest.fixture(scope="module")
def wheel():
    return wheel_or_skip()


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    steps = [fx.Step(n, host_s=0.05, data_s=0.01, optimizer_s=0.002, compute_s=0.03, comm_s=0.004,
                     comm_exposed_s=0.001, free_s=0.005) for n in (2, 3)]
    return fx.build_ascend_folder(tmp_path_factory.mktemp("fmt"), steps, rank=3, world_size=4)


def _header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f))


def _function(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise KeyError(name)


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def test_step_trace_header_and_column_meaning(wheel, built):
    title = wheel.class_attr(STEP_PARSER, "TraceStepTimeParser", "title")
    assert tuple(title) == ascend.STEP_TRACE_COLUMNS
    assert set(ascend.STEP_TRACE_REQUIRED) <= set(title)
    assert wheel.class_attr(STEP_PARSER, "TraceStepTimeParser", "STEP_TRACE") == ascend.STEP_TRACE_FILE
    assert _header(built / ascend.OUTPUT_DIR / ascend.STEP_TRACE_FILE) == title
    # Each column is the sum of the device events of the same name inside the step (timeflag), written in the
    # title's order; the reader maps Computing -> compute, Communication(Not Overlapped) -> comm_exposed,
    # Communication -> comm, Free -> idle on that meaning.
    flags = wheel.class_attr(STEP_PARSER, "TraceStepTimeParser", "timeflag")
    assert {k: flags[k] for k in ("Computing", "Communication", "Free", "Communication(Not Overlapped)")} == {
        "Computing": "compute", "Communication": "comun", "Free": "free",
        "Communication(Not Overlapped)": "comunNotOverlp"}
    create = _function(wheel.tree(STEP_PARSER), "create_step_file")
    rows = [n for n in ast.walk(create) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "append"
            and n.args and isinstance(n.args[0], ast.List) and len(n.args[0].elts) == len(title)]
    assert len(rows) == 1, "the row written per device and step"
    keys = [e.slice.value for e in rows[0].args[0].elts[2:]]
    assert keys == ["compute", "comunNotOverlp", "Overlp", "comun", "free", "stage", "bubble",
                    "comunNotOverlpRec", "prepare"]
    text = wheel.text(STEP_PARSER)
    assert "convert_ns2us_float(cur_step.get(Constant.START_TS))" in text  # step bounds: ns -> µs
    assert wheel.class_attr(CONSTANT, "Constant", "NS_TO_US") == 1000


def test_operator_and_kernel_details_headers(wheel, built):
    headers = wheel.class_attr(OPERATOR_PARSER, "OperatorViewParser", "OPERATOR_HEADERS")
    assert tuple(headers) == fx.OPERATOR_COLUMNS
    assert wheel.class_attr(OPERATOR_PARSER, "OperatorViewParser", "OPERATOR_VIEW") == ascend.OPERATOR_DETAILS_FILE
    assert set(diag_profiler._NPU_OPERATOR_COLUMNS.values()) <= set(headers)  # the aggregation reused
    assert _header(built / ascend.OUTPUT_DIR / ascend.OPERATOR_DETAILS_FILE) == headers

    base = wheel.class_attr(CSV_HEADERS, "CsvHeaders", "OP_SUMMARY_KERNEL_BASE_HEADERS")
    assert '["Step Id"] + output_headers' in wheel.text(KERNEL_PARSER)
    assert fx.KERNEL_COLUMNS == ("Step Id", *base)
    assert {ascend.KERNEL_NAME, ascend.KERNEL_DURATION} <= set(base)
    assert wheel.class_attr(KERNEL_PARSER, "KernelViewParser", "KERNEL_VIEW") == ascend.KERNEL_DETAILS_FILE
    assert _header(built / ascend.OUTPUT_DIR / ascend.KERNEL_DETAILS_FILE) == list(fx.KERNEL_COLUMNS)


def test_folder_layout_and_names(wheel, built):
    const = {k: wheel.class_attr(CONSTANT, "Constant", k) for k in
             ("OUTPUT_DIR", "FRAMEWORK_DIR", "PROFILER_META_DATA", "TRACE_VIEW")}
    assert const == {"OUTPUT_DIR": ascend.OUTPUT_DIR, "FRAMEWORK_DIR": ascend.FRAMEWORK_DIR,
                     "PROFILER_META_DATA": ascend.METADATA_FILE, "TRACE_VIEW": ascend.TRACE_VIEW_FILE}
    assert wheel.class_attr(TRACE_PARSER, "TraceViewParser", "TRACE_VIEW") == ascend.TRACE_VIEW_FILE
    paths = wheel.tree(PATHS)
    assert ascend.PROF_DIR_PATTERN.pattern in _strings(_function(paths, "get_cann_path"))
    info = _strings(_function(paths, "get_info_file_path"))
    assert {"profiler_info.json", r"^profiler_info_\d+\.json"} <= info
    assert 'f"profiler_info_{rank_id}.json"' in wheel.text(INTERFACE)
    # <worker>_<pid>_<time>_ascend_pt, time = %Y%m%d%H%M%S%f less its last 3 digits
    creator = wheel.text(CREATOR)
    assert '"{}_{}".format(' in creator and "str(os.getpid())" in creator
    assert f'"{{}}_{{}}{ascend.ASCEND_SUFFIX}".format(worker_name, current_time.strftime("%Y%m%d%H%M%S%f")[:-3])' \
        in creator
    assert re.fullmatch(r"node-a_4242_\d{17}" + ascend.ASCEND_SUFFIX, built.name)
    names = {p.name for p in built.iterdir()}
    assert {ascend.OUTPUT_DIR, ascend.FRAMEWORK_DIR, ascend.METADATA_FILE} <= names
    assert any(ascend.PROF_DIR_PATTERN.match(n) for n in names)
    assert [n for n in names if ascend.INFO_FILE_PATTERN.match(n)] == ["profiler_info_3.json"]
    assert ascend.looks_like_ascend(built)


def test_stopped_profiler_and_offline_parse(wheel):
    # Parsing runs in tensorboard_trace_handler's handler only when analyse_flag is True; otherwise, or when the
    # run stops first, the raw folders stay without ASCEND_PROFILER_OUTPUT. The offline call the reader names:
    module, name = ascend.OFFLINE_PARSE.rsplit(".", 1)
    assert module == "torch_npu.profiler.profiler"
    tree = wheel.tree(PROF + "profiler.py")
    assert name in ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign)
                                         and getattr(n.targets[0], "id", "") == "__all__"))
    assert _function(tree, name).args.args[0].arg == "profiler_path"
    handler = _function(tree, "tensorboard_trace_handler")
    assert "analyse_flag" in {a.arg for a in handler.args.args}
    assert "from torch_npu.profiler.profiler import analyse" in wheel.text(ANALYSIS + "_npu_profiler.py")


def test_trace_view_events_and_truncated_form(wheel, built):
    create = _function(wheel.tree(EVENTS), "create_x_event")
    ret = next(n.value for n in ast.walk(create) if isinstance(n, ast.Return))
    assert tuple(k.value for k in ret.keys) == fx.X_EVENT_KEYS
    assert "convert_ns2us_str(event.ts)" in ast.unparse(ret)  # ts: a string of µs
    events = json.loads((built / ascend.OUTPUT_DIR / ascend.TRACE_VIEW_FILE).read_text())
    x = [e for e in events if e.get("ph") == "X" and "cat" in e]
    assert x and all(tuple(e) == fx.X_EVENT_KEYS and isinstance(e["ts"], str) for e in x)
    assert fx.us_str(1_234_567) == "1234.567" and fx.us_str(7) == "0.007"
    # trace_view.json is written in two parts: the host events without the closing bracket, then the device
    # events appended; a failure between the two leaves the file truncated (the reader's "truncated" case).
    # The host part: its X events, then its metadata events, the first the "Python" process name (where the
    # reader stops reading).
    fwk = ast.unparse(_function(wheel.tree(ANALYSIS + "prof_parse/_fwk_file_parser.py"), "get_fwk_trace_data"))
    x_at = fwk.index("TraceEventManager.create_x_event(torch_op, 'cpu_op')")
    m_at = fwk.index("other_event_list = TraceEventManager.create_m_event(pid, tid_dict)")
    assert x_at < m_at < fwk.index("fwk_x_event_list.extend(other_event_list)")
    first_m = ast.unparse(_function(wheel.tree(EVENTS), "create_m_event"))
    assert "event_list = [{'ph': 'M', 'name': Constant.PROCESS_NAME, 'pid': pid, 'tid': 0, 'args': {'name': " \
        "'Python'}}" in first_m
    assert wheel.class_attr(CONSTANT, "Constant", "PROCESS_NAME") == "process_name"
    files = wheel.text(FILES)
    assert "file.write(data[:-1])" in files and 'data = f",{data[1:]}"' in files
    assert "create_prepare_trace_json_by_path(trace_file_path, fwk_trace_data)" in wheel.text(
        ANALYSIS + "prof_view/prepare_parse/_fwk_pre_parser.py")


def test_metadata_keys(wheel, built):
    const = {k: wheel.class_attr(CONSTANT, "Constant", k) for k in
             ("CONFIG", "START_INFO", "END_INFO", "TORCH_NPU_VERSION", "CANN_VERSION", "RANK_ID")}
    assert tuple(const[k] for k in ("CONFIG", "START_INFO", "END_INFO", "TORCH_NPU_VERSION",
                                    "CANN_VERSION")) == fx.INFO_KEYS
    assert const["RANK_ID"] == "rank_id"
    dump = _function(wheel.tree(INTERFACE), "_dump_profiler_info")
    assert "total_info['rank_id'] = rank_id" in ast.unparse(dump)
    assert "os.environ.get('RANK')" in ast.unparse(dump)  # a string when it comes from RANK
    info = json.loads((built / "profiler_info_3.json").read_text())
    assert tuple(k for k in info if k != "rank_id") == fx.INFO_KEYS and info["rank_id"] == "3"
    assert wheel.class_attr(INTERFACE, "_ProfInterface", "PARALLEL_GROUP_KEY") == "parallel_group_info"
    assert wheel.class_attr(INTERFACE, "_ProfInterface", "TRACE_ID_KEY") == "trace_id"
    groups = _strings(_function(wheel.tree(INTERFACE), "_add_group_info_to_metadata"))
    assert {"default_group", "group_name", "group_rank", "global_ranks"} <= groups
    group = json.loads((built / ascend.METADATA_FILE).read_text())["parallel_group_info"]
    assert list(next(iter(group.values()))) == ["group_name", "group_rank", "global_ranks"]
    # CANN's info.json: msprof requires "hostname" in it (Ascend msprof, analysis/csrc/domain/services/
    # environment/context.cpp, CHECK_VALUES); torch_npu reads PROF_*/host/info.json for its CPU frequency.
    assert 'os.path.join(cls.get_cann_path(profiler_path), "host/info.json")' in wheel.text(PATHS)


def test_torch_record_function_names():
    """The DataLoader and optimizer annotations come from torch itself (torch 2.13, read without importing)."""
    root = Path(importlib.util.find_spec("torch").origin).parent
    loader = (root / "utils" / "data" / "dataloader.py").read_text()
    assert ('f"' + ascend.DATALOADER_PREFIX + '{self.__class__.__name__}' + ascend.DATALOADER_SUFFIX + '"') in loader
    optim = (root / "optim" / "optimizer.py").read_text()
    assert ('f"' + ascend.OPTIMIZER_PREFIX + '{self.__class__.__name__}.step"') in optim
