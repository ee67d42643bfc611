"""The built Ascend folders (tests/ascend_fixtures.py) and the reader's names against torch_npu 2.13.0's writer.

Every header row, file and folder name, event key and metadata key the reader relies on is read from the
wheel's own source (parsed, never imported; tests/npu_wheel.py finds or downloads the wheel) and compared with
what the reader expects and what the builder writes, so that neither can drift from the real format.
"""

from __future__ import annotations

import ast
import copy
import csv
import importlib.util
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace

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
COMM_PARSER = ANALYSIS + "prof_view/_communication_parser.py"
RELATION = ANALYSIS + "prof_parse/_fwk_cann_relation_parser.py"
EVENT_BEAN = ANALYSIS + "prof_bean/_event_bean.py"
PARSER_CONFIG = ANALYSIS + "prof_config/_parser_config.py"
PROFILER_CONFIG = ANALYSIS + "_profiler_config.py"


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


# --- partial folders: the device timeline, kernel_details' steps, communication.json ---------------------------


class _AnyName:
    """Stands for ErrCode: every attribute is a name."""

    def __getattr__(self, name: str) -> str:
        return name


def _run_module(wheel, path: str, **names) -> dict:
    """The namespace of one wheel module run from its source, its torch_npu imports replaced by ``names``
    (the standard library's are kept), so that the writer's own functions can run on the built files."""
    tree = copy.deepcopy(wheel.tree(path))
    tree.body = [n for n in tree.body if not (isinstance(n, ast.ImportFrom)
                                              and (n.level or (n.module or "").startswith("torch_npu")))]
    ns = {"__name__": "wheel:" + path, **names}
    exec(compile(tree, f"{wheel.path.name}:{path}", "exec"), ns)  # noqa: S102  the wheel's own source
    return ns


@pytest.fixture(scope="module")
def constant(wheel) -> dict:
    """prof_common_func/_constant.py: Constant, convert_us2ns, convert_ns2us_float, print_*_msg."""
    return _run_module(wheel, CONSTANT, _should_print_warning=lambda: False, ErrCode=_AnyName(),
                       prof_error=lambda *_a: "")


HCCL_STEPS = {n: [fx.HcclOp(links={"HCCS": (40.0, 1.0), "RDMA": (3.0, 1.5)},
                            pairs={"0-1": ("HCCS", 40.0, 1.0), "0-8": ("RDMA", 3.0, 1.5)}),
                  fx.HcclOp(name="hcom_allGather", elapse_ms=1.0, transit_ms=0.5, wait_ms=0.4, sync_ms=0.1,
                            links={"HCCS": (10.0, 0.5)}, pairs={"0-1": ("HCCS", 10.0, 0.5)}),
                  fx.HcclOp(name="hcom_send", elapse_ms=0.5, transit_ms=0.2, wait_ms=0.2, sync_ms=0.0,
                            links={"RDMA": (1.0, 0.2)}, pairs={"0-8": ("RDMA", 1.0, 0.2)})]
              for n in (2, 3)}


@pytest.fixture(scope="module")
def built_partial(tmp_path_factory) -> Path:
    """A built folder with HCCL, a pipeline receive and an uneven device timeline."""
    steps = [fx.Step(2, host_s=0.05, data_s=0.01, optimizer_s=0.002, compute_s=0.02, comm_s=0.006,
                     comm_exposed_s=0.002, free_s=0.004, prepare_s=0.012),
             fx.Step(3, host_s=0.04, data_s=0.002, optimizer_s=0.002, compute_s=0.03, comm_s=0.004,
                     comm_exposed_s=0.004, free_s=0.001, prepare_s=0.003)]
    return fx.build_ascend_folder(tmp_path_factory.mktemp("partial"), steps, rank=0, world_size=16,
                                  hccl=HCCL_STEPS)


def test_device_timeline_names(wheel):
    """What the reader takes from trace_view.json's device part, as TraceStepTimeParser takes it."""
    flags = wheel.class_attr(STEP_PARSER, "TraceStepTimeParser", "timeflag")
    meaning = {"compute": "compute", "comun": "comm", "comunNotOverlp": "comm_exposed", "free": "idle"}
    assert {k: meaning[flags[k]] for k in ascend.DEVICE_EVENTS} == ascend.DEVICE_EVENTS
    assert flags[ascend.BUBBLE_PREFIX] == "bubble"
    create = ast.unparse(_function(wheel.tree(STEP_PARSER), "create_step_file"))
    assert f"str(data.get('name')).startswith('{ascend.BUBBLE_PREFIX}')" in create
    assert f"data.get('name') in {set(ascend.DEVICE_EVENTS)!r}" in create or all(
        repr(n) in create for n in ascend.DEVICE_EVENTS)
    assert wheel.class_attr(CONSTANT, "Constant", "PROCESS_LABEL") == ascend.PROCESS_LABELS
    assert f"startswith('{ascend.NPU_LABEL}')" in create and f"-1 if label == '{ascend.NPU_LABEL}'" in create
    # The flows: from the host operator to the kernel, id = the kernel's start (ns).
    flow = _function(wheel.tree(EVENTS), "create_torch_to_npu_flow")
    text = ast.unparse(flow)
    assert "flow_id = end_event.ts" in text
    ret = next(n.value for n in ast.walk(flow) if isinstance(n, ast.Return))
    assert [tuple(k.value for k in d.keys) for d in ret.elts] == [fx.FLOW_KEYS] * 2
    assert {ascend.FLOW_NAME, ascend.FLOW_CAT} <= _strings(flow)
    # The step's device window: first kernel to the later of the last kernel and the host step's end.
    assert "Constant.END_TS: max(device_end_ts, step_node.end_time)" in wheel.text(RELATION)
    # Level0 prunes some CANN rows from trace_view.json (by name prefix or process name), never these.
    config = next(n for n in ast.walk(wheel.tree(PROFILER_CONFIG)) if isinstance(n, ast.Assign)
                  and getattr(n.targets[0], "id", "") == "LEVEL_TRACE_PRUNE_CONFIG")
    prune = {ast.unparse(k): ast.literal_eval(v) for k, v in zip(config.value.keys, config.value.values)}
    kept = [*ascend.DEVICE_EVENTS, ascend.BUBBLE_PREFIX, "Overlap Analysis"]
    assert prune["Constant.LEVEL0"] and not any(n.startswith(k) for keys in prune.values() for k in keys
                                                for n in kept)
    assert "self._trace_data.extend(self._get_flow_event(msprof_timeline_data))" in wheel.text(TRACE_PARSER)
    # The host operators' category; every host event has one (create_x_event's keys), device events none.
    fwk = ast.unparse(_function(wheel.tree(ANALYSIS + "prof_parse/_fwk_file_parser.py"), "get_fwk_trace_data"))
    assert f"TraceEventManager.create_x_event(torch_op, '{ascend.HOST_OP_CAT}')" in fwk
    assert "cat" in fx.X_EVENT_KEYS


def test_kernel_details_steps_and_times(wheel):
    kernel = wheel.text(KERNEL_PARSER)
    assert f'headers = ["{ascend.KERNEL_STEP}"] + output_headers if self.step_range else output_headers' in kernel
    base = wheel.class_attr(CSV_HEADERS, "CsvHeaders", "OP_SUMMARY_KERNEL_BASE_HEADERS")
    assert {ascend.KERNEL_TYPE, ascend.KERNEL_START, ascend.KERNEL_DEVICE} <= set(base)
    # CANN's times end in a tab that torch_npu strips when it reads them: the reader strips it too.
    assert 'def convert_us2ns(us: Union[str, float, int], tail="\\t") -> int:' in wheel.text(CONSTANT)


def test_level_none_writes_no_step_files(wheel):
    """profiler_level=Level_none parses without TraceStepTimeParser, KernelViewParser or CommunicationParser:
    its folder holds trace_view.json and operator_details.csv, a partial folder by the writer's own making."""
    tree = wheel.tree(PARSER_CONFIG)
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "ParserConfig")

    def parsers(attr: str) -> set[str]:
        value = next(s.value for s in cls.body if isinstance(s, ast.Assign) and s.targets[0].id == attr)
        text = next(v for k, v in zip(value.keys, value.values) if ast.unparse(k) == "Constant.Text")
        handler = next(v for k, v in zip(text.keys, text.values)
                       if ast.unparse(k) == "Constant.TENSORBOARD_TRACE_HANDLER")
        return {e.id for e in handler.elts}

    none, common = parsers("LEVEL_NONE_CONFIG"), parsers("COMMON_CONFIG")
    assert {"TraceViewParser", "OperatorViewParser"} <= none
    assert not {"TraceStepTimeParser", "KernelViewParser", "CommunicationParser"} & none
    assert {"TraceStepTimeParser", "KernelViewParser", "CommunicationParser"} <= common


def test_communication_names(wheel, built_partial):
    attr = lambda a: wheel.class_attr(COMM_PARSER, "CommunicationParser", a)  # noqa: E731
    assert attr("COMMUNICATION") == ascend.COMMUNICATION_FILE
    assert attr("COMMUNICATION_MATRIX") == ascend.COMMUNICATION_MATRIX_FILE
    assert (attr("P2P"), attr("COLLECTIVE")) == ascend.COMM_GROUPS
    names = {"COMMUNICATION_TIME_INFO": ascend.COMM_TIME_INFO, "COMMUNICATION_BANDWIDTH_INFO":
             ascend.COMM_BANDWIDTH_INFO, "WAIT_TIME_MS": ascend.WAIT_TIME_MS, "TRANSIT_TIME_MS":
             ascend.TRANSIT_TIME_MS, "SYNCHRONIZATION_TIME_MS": ascend.SYNC_TIME_MS, "TRANSIT_SIZE_MB":
             ascend.TRANSIT_SIZE_MB, "BANDWIDTH_GB_S": ascend.BANDWIDTH_GB_S, "TRANSPORT_TYPE":
             ascend.TRANSPORT_TYPE}
    assert {k: attr(k) for k in names} == names
    assert attr("TOTAL") == "total"  # names starting so are skipped by the writer, and by the reader
    assert (attr("START_TIMESTAMP"), attr("WAIT_TIME_RATIO"), attr("SYNCHRONIZATION_TIME_RATIO")) == (
        fx.COMM_TIME_KEYS[0], fx.COMM_TIME_KEYS[-2], fx.COMM_TIME_KEYS[-1])
    assert (attr("HCOM_SEND"), attr("HCOM_RECEIVE"), attr("HCOM_BATCHSENDRECV")) == fx.P2P_PREFIXES
    assert attr("HCCL_PATTERN") == fx.HCCL_PATTERN
    tree = wheel.tree(COMM_PARSER)
    assert f"comm_ops['{ascend.TOTAL_OP_INFO}']" in ast.unparse(_function(tree, "compute_total_info"))
    gen = ast.unparse(_function(tree, "generate_communication"))
    assert f"step = '{ascend.COMM_STEP_PREFIX}' + step_info.get('step_id') if step_info.get('step_id') else " \
        f"'{ascend.COMM_STEP_PREFIX}'" in gen
    assert f"f'{{new_comm_op_name[0]}}{ascend.MATRIX_TOTAL}{{new_comm_op_name[1]}}'" in wheel.text(COMM_PARSER)
    # Elapse and Idle are CANN's names: the writer passes every time key through but the start and the ratios.
    combine = ast.unparse(_function(tree, "combine_time_info"))
    assert "if time_info not in ratio_list and time_info != self.START_TIMESTAMP:" in combine
    comm = json.loads((built_partial / ascend.OUTPUT_DIR / ascend.COMMUNICATION_FILE).read_text())
    op = next(v for k, v in comm["step2"]["collective"].items() if k != ascend.TOTAL_OP_INFO)
    assert tuple(op[ascend.COMM_TIME_INFO]) == fx.COMM_TIME_KEYS
    assert {ascend.ELAPSE_TIME_MS, ascend.IDLE_TIME_MS} <= set(comm["step2"]["collective"][ascend.TOTAL_OP_INFO][
        ascend.COMM_TIME_INFO])
    assert tuple(op[ascend.COMM_BANDWIDTH_INFO]) == fx.TRANSPORTS
    # Bandwidth = size / time, MB / ms = GB/s (compute_ratio), the reader's formula.
    assert "return round(dividend / divisor, 4)" in ast.unparse(_function(tree, "compute_ratio"))


def _wheel_step_range(wheel, constant, events: list[dict], host_pid: int) -> list[dict]:
    """FwkCANNRelationParser.get_step_range run on the built trace_view.json: step nodes from its ProfilerStep#N
    events, the kernel dict from its torch_to_npu flows (launch ts -> the kernel events they end at)."""
    conv = constant["convert_us2ns"]
    bean = _run_module(wheel, EVENT_BEAN, Constant=constant["Constant"], convert_us2ns=conv)["EventBean"]

    class Node:  # the parts of a TorchOpNode get_step_range uses
        def __init__(self, ev):
            self.event = SimpleNamespace(name=ev["name"])
            self.start_time, self.end_time = conv(ev["ts"]), bean(ev).end_ns
            self.corr_id_total = []

        def is_profiler_step(self):
            return self.event.name.find("ProfilerStep#") != -1

        def update_corr_id_total(self, corr_id):
            self.corr_id_total.append(corr_id)

    class FwkFileParser:  # no task queue: the launch times are the kernel dict's keys
        def __init__(self, _path):
            pass

        def has_task_queue_data(self):
            return False

    by_id = {(e["pid"], e["tid"], conv(e["ts"])): e for e in events if e.get("ph") == "X"}
    starts = {e["id"]: e for e in events if e.get("ph") == "s" and e.get("cat") == ascend.FLOW_CAT}
    kernels: dict = {}
    for f in (e for e in events if e.get("ph") == "f" and e.get("cat") == ascend.FLOW_CAT):
        kernels.setdefault(conv(starts[f["id"]]["ts"]), []).append(bean(by_id[(f["pid"], f["tid"],
                                                                                 conv(f["ts"]))]))
    ns = _run_module(wheel, RELATION, FwkFileParser=FwkFileParser, ProfilerConfig=None, TorchOpNode=None,
                     Constant=constant["Constant"], print_error_msg=print, ProfilerLogger=None, CANNFileParser=None)
    parser = object.__new__(ns["FwkCANNRelationParser"])
    parser._profiler_path, parser.logger = "", logging.getLogger("wheel")
    root = SimpleNamespace(child_node_list=[Node(e) for e in events if e.get("ph") == "X" and e["pid"] == host_pid
                                            and e["name"].startswith(ascend.PROFILER_STEP_PREFIX)])
    return parser.get_step_range(root, kernels)


def test_wheel_sums_the_built_timeline_as_the_reader_does(wheel, constant, built_partial, tmp_path):
    """TraceStepTimeParser.create_step_file and get_step_range, run from the wheel's source on the built
    trace_view.json, give the built step_trace_time.csv; the reader, without that csv, gives the same phases."""
    events = json.loads((built_partial / ascend.OUTPUT_DIR / ascend.TRACE_VIEW_FILE).read_text())
    host_pid = next(e["pid"] for e in events if e.get("cat") == "cpu_op")
    step_range = _wheel_step_range(wheel, constant, events, host_pid)
    assert [r["step_id"] for r in step_range] == ["2", "3"]
    rows: list = []

    class FileManager:
        @staticmethod
        def create_csv_file(_out, data, _name, _headers=None):
            rows.extend(data)

    ns = _run_module(wheel, STEP_PARSER, BaseParser=object, Constant=constant["Constant"], FileManager=FileManager,
                     convert_ns2us_float=constant["convert_ns2us_float"], ProfilerLogger=None, CANNFileParser=None,
                     FwkCANNRelationParser=None, FwkFileParser=None)
    parser = object.__new__(ns["TraceStepTimeParser"])
    parser.step_range, parser.torch_op_data, parser._profiler_path = step_range, [], ""
    parser.create_step_file("", [e for e in events if e.get("pid") != host_pid], ascend.STEP_TRACE_FILE)
    with (built_partial / ascend.OUTPUT_DIR / ascend.STEP_TRACE_FILE).open(newline="") as f:
        written = [[float(c) for c in r] for r in list(csv.reader(f))[1:]]
    assert [[float(c) for c in r] for r in rows] == [pytest.approx(r, abs=1e-3) for r in written]  # µs

    partial = fx.copy_outputs(built_partial, tmp_path / "copy", [ascend.TRACE_VIEW_FILE])
    read = ascend.read_ascend(partial)
    for row, step in zip(rows, read.steps):
        assert int(row[1]) == step.step
        assert (step.compute, step.comm_exposed, step.comm, step.idle) == pytest.approx(
            (row[2] * 1e-6, row[3] * 1e-6, row[5] * 1e-6, row[6] * 1e-6), abs=1e-9)


def test_wheel_writes_the_built_communication_files(wheel, constant, built_partial):
    """CommunicationParser's own steps (split by the step range, totals, p2p/collective, matrix summaries) run on
    the built ops give the built communication.json and communication_matrix.json."""
    events = json.loads((built_partial / ascend.OUTPUT_DIR / ascend.TRACE_VIEW_FILE).read_text())
    host_pid = next(e["pid"] for e in events if e.get("cat") == "cpu_op")
    ns = _run_module(wheel, COMM_PARSER, BaseParser=object, TorchOpNode=None, Constant=constant["Constant"],
                     print_warn_msg=print, FileManager=None, CANNFileParser=None, CANNDataEnum=None,
                     convert_us2ns=constant["convert_us2ns"], ProfilerLogger=None, FwkCANNRelationParser=None)
    parser = object.__new__(ns["CommunicationParser"])
    parser.step_list = _wheel_step_range(wheel, constant, events, host_pid)
    tl = fx._Timeline([fx.Step(2, host_s=0.05, prepare_s=0.012, compute_s=0.02, comm_s=0.006, comm_exposed_s=0.002),
                       fx.Step(3, host_s=0.04, prepare_s=0.003, compute_s=0.03, comm_s=0.004, comm_exposed_s=0.004)],
                      fx.DEFAULT_OPS, 0, 0)
    raw, matrix = {}, {}
    for s in tl.steps:
        raw.update(fx.raw_communication(HCCL_STEPS[s.step], s.step, fx.comm_start_us(tl, s)))
        matrix.update(fx.raw_matrix(HCCL_STEPS[s.step], s.step))
    parser.split_comm_op_by_step(copy.deepcopy(raw))
    want = {"step" + i["step_id"]: parser.get_communication_ops_dict(i["comm_ops"]) for i in parser.step_list}
    out = built_partial / ascend.OUTPUT_DIR
    assert json.loads((out / ascend.COMMUNICATION_FILE).read_text()) == json.loads(json.dumps(want))
    by_step = parser.split_matrix_by_step(copy.deepcopy(matrix))
    want = {k: parser.get_matrix_ops_dict(v) for k, v in by_step.items()}
    assert json.loads((out / ascend.COMMUNICATION_MATRIX_FILE).read_text()) == json.loads(json.dumps(want))
