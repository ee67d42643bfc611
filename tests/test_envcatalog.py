"""Tests for helpers.diagnose.envcatalog: one test per rule."""

from __future__ import annotations

import pytest

from helpers.diagnose import envcatalog as ec


def by_severity(findings, severity):
    return [f for f in findings if f.severity == severity]


def only(findings, name):
    return [f for f in findings if f.name == name]


def test_empty_environment_gives_no_findings():
    assert ec.check_env({}) == []
    frame = ec.findings_frame([])
    assert frame.empty and list(frame.columns) == ["name", "value", "severity", "message", "fix"]


def test_unrelated_variables_are_ignored():
    assert ec.check_env({"HOME": "/root", "PATH": "/usr/bin", "LANG": "C"}) == []


@pytest.mark.parametrize("name", sorted(ec.INVENTED))
def test_each_invented_name_is_an_error_with_a_replacement(name):
    findings = ec.check_env({name: "1"})
    assert len(findings) == 1
    f = findings[0]
    assert f.severity == "error" and f.name == name
    assert "does not exist" in f.message and f.fix


def test_invented_replacements_name_real_variables():
    assert "HCCL_WHITELIST_DISABLE" in ec.INVENTED["HCCL_OP_BLOCK_LIST"]
    assert "ASCEND_LAUNCH_BLOCKING" in ec.INVENTED["PT_DEBUG"]
    assert "TORCH_NPU_LOGS" in ec.INVENTED["PT_DEBUG"]


@pytest.mark.parametrize("value", ["tree", "level0:NA;level1:tree", "allreduce=level0:NA;level1:tree"])
def test_hccl_algo_tree_is_rejected_with_the_fix(value):
    errors = by_severity(ec.check_env({"HCCL_ALGO": value}), "error")
    assert errors, value
    assert "tree" in errors[0].message
    assert "level0:NA;level1:ring" in errors[0].fix


@pytest.mark.parametrize("value", [
    "level0:NA;level1:ring",
    "level0:NA;level1:H-D_R",
    "level0:NA;level1:NHR;level2:ring",
    "allreduce=level0:NA;level1:ring/alltoall=level0:NA;level1:pairwise",
])
def test_hccl_algo_valid_forms_are_accepted(value):
    findings = ec.check_env({"HCCL_ALGO": value})
    assert [f.severity for f in findings] == ["ok"], findings
    assert "adaptive" in findings[0].message


def test_hccl_algo_bare_algorithm_and_pairwise_misuse():
    assert by_severity(ec.check_env({"HCCL_ALGO": "ring"}), "error")
    warn = ec.check_env({"HCCL_ALGO": "level0:NA;level1:pairwise"})
    assert [f.severity for f in warn] == ["warning"] and "AlltoAll" in warn[0].message


@pytest.mark.parametrize("value, severity", [("0", "warning"), ("1", "ok"), ("2", "ok"), ("3", "error"),
                                             ("yes", "error")])
def test_task_queue_enable(value, severity):
    findings = ec.check_env({"TASK_QUEUE_ENABLE": value})
    assert [f.severity for f in findings] == [severity]


@pytest.mark.parametrize("conf", [
    "expandable_segments:True,max_split_size_mb:64",
    "garbage_collection_threshold:0.6,expandable_segments:True",
])
def test_npu_alloc_conf_expandable_constraint(conf):
    errors = by_severity(ec.check_env({"PYTORCH_NPU_ALLOC_CONF": conf}), "error")
    assert len(errors) == 1
    assert "expandable_segments" in errors[0].message
    assert "expandable_segments:False" in errors[0].fix


@pytest.mark.parametrize("conf, fragment", [
    ("max_split_size_mb:20", "greater than 20"),
    ("garbage_collection_threshold:1.0", "between 0 and 1"),
    ("garbage_collection_threshold:0", "between 0 and 1"),
    ("expandable_segments:true", "True or False"),
    ("base_addr_aligned_kb:32", "[0, 16]"),
    ("page_size:2g", "1g"),
    ("max_split_size_mb", "key:value"),
    ("max_split_sise_mb:128", "unknown key"),
    ("backend:cudaMallocAsync", "CUDA"),
])
def test_npu_alloc_conf_value_errors(conf, fragment):
    errors = by_severity(ec.check_env({"PYTORCH_NPU_ALLOC_CONF": conf}), "error")
    assert errors and any(fragment in e.message for e in errors), errors


def test_npu_alloc_conf_unknown_key_suggests_spelling():
    errors = by_severity(ec.check_env({"PYTORCH_NPU_ALLOC_CONF": "max_split_sise_mb:128"}), "error")
    assert "max_split_size_mb" in errors[0].fix


@pytest.mark.parametrize("conf", [
    "max_split_size_mb:32,garbage_collection_threshold:0.6",
    "expandable_segments:True,base_addr_aligned_kb:16",
    "page_size:1g",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
    " expandable_segments : False ",
])
def test_npu_alloc_conf_documented_examples_are_valid(conf):
    assert [f.severity for f in ec.check_env({"PYTORCH_NPU_ALLOC_CONF": conf})] == ["ok"]


def test_cuda_alloc_conf_light_validation():
    ok = ec.check_env({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync,expandable_segments:True,"
                                                   "max_split_size_mb:128"})
    assert [f.severity for f in ok] == ["ok"]  # CUDA allows expandable + max_split together
    bad = ec.check_env({"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMalloc"})
    assert by_severity(bad, "error")


def test_both_intra_links_enabled_is_a_conflict():
    findings = ec.check_env({"HCCL_INTRA_ROCE_ENABLE": "1", "HCCL_INTRA_PCIE_ENABLE": "1"})
    conflict = only(findings, "HCCL_INTRA_ROCE_ENABLE+HCCL_INTRA_PCIE_ENABLE")
    assert len(conflict) == 1 and conflict[0].severity == "error"
    assert not by_severity(ec.check_env({"HCCL_INTRA_ROCE_ENABLE": "1", "HCCL_INTRA_PCIE_ENABLE": "0"}), "error")


def test_alloc_conf_and_npu_alloc_conf_together_conflict():
    environ = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:32",
               "PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:64"}
    conflict = only(ec.check_env(environ), "PYTORCH_NPU_ALLOC_CONF+PYTORCH_ALLOC_CONF")
    assert len(conflict) == 1 and conflict[0].severity == "error"
    assert "Both PYTORCH_NPU_ALLOC_CONF and PYTORCH_ALLOC_CONF" in conflict[0].message
    # Explicitly without torch_npu the pair is only a warning.
    conflict = only(ec.check_env(environ, npu=False), "PYTORCH_NPU_ALLOC_CONF+PYTORCH_ALLOC_CONF")
    assert conflict[0].severity == "warning"


def test_typo_suggests_the_real_name():
    findings = ec.check_env({"HCCL_BUFSIZE": "200"})
    assert len(findings) == 1
    f = findings[0]
    assert f.severity == "warning" and "check spelling" in f.message
    assert "HCCL_BUFFSIZE" in f.fix


def test_recognised_real_names_are_not_reported():
    environ = {"ASCEND_HOME_PATH": "/usr/local/Ascend/ascend-toolkit/latest",
               "HCCL_WHITELIST_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "OMP_PROC_BIND": "close",
               "TORCH_NPU_COMPACT_ERROR_OUTPUT": "1"}
    assert ec.check_env(environ) == []


def test_unknown_unwatched_prefix_is_ignored_and_custom_prefixes_apply():
    assert ec.check_env({"MY_SETTING": "1"}) == []
    assert [f.severity for f in ec.check_env({"MY_SETTING": "1"}, prefixes=("MY_",))] == ["warning"]


@pytest.mark.parametrize("name, value, severity", [
    ("HCCL_BUFFSIZE", "0", "error"),
    ("HCCL_BUFFSIZE", "400", "ok"),
    ("HCCL_CONNECT_TIMEOUT", "60", "error"),
    ("HCCL_CONNECT_TIMEOUT", "7200", "ok"),
    ("HCCL_EXEC_TIMEOUT", "-1", "error"),
    ("HCCL_EXEC_TIMEOUT", "0", "ok"),
    ("HCCL_OP_EXPANSION_MODE", "AIV", "ok"),
    ("HCCL_OP_EXPANSION_MODE", "3", "error"),
    ("ASCEND_GLOBAL_LOG_LEVEL", "5", "error"),
    ("ASCEND_SLOG_PRINT_TO_STDOUT", "1", "ok"),
    ("ASCEND_LAUNCH_BLOCKING", "1", "warning"),
    ("COMBINED_ENABLE", "2", "error"),
    ("ACLNN_CACHE_LIMIT", "10000001", "error"),
    ("ACLNN_CACHE_LIMIT", "0", "warning"),
    ("MULTI_STREAM_MEMORY_REUSE", "2", "warning"),
    ("MULTI_STREAM_MEMORY_REUSE", "3", "ok"),
    ("TORCH_DEVICE_BACKEND_AUTOLOAD", "0", "ok"),
    ("TORCH_DEVICE_BACKEND_AUTOLOAD", "true", "error"),
    ("CPU_AFFINITY_CONF", "2", "ok"),
    ("CPU_AFFINITY_CONF", "1,npu0:0-1,npu1:2-5,npu1:7-8,npu3:9-9", "ok"),
    ("CPU_AFFINITY_CONF", "3", "error"),
    ("CPU_AFFINITY_CONF", "1,npu0:5-2", "error"),
    ("OMP_NUM_THREADS", "0", "error"),
    ("OMP_NUM_THREADS", "4", "ok"),
    ("MKL_NUM_THREADS", "four", "error"),
    ("NCCL_DEBUG", "DEBUG", "error"),
    ("NCCL_DEBUG", "WARN", "ok"),
    ("NCCL_IB_DISABLE", "1", "ok"),
    ("CUDA_VISIBLE_DEVICES", "0,1", "ok"),
    ("CUDA_VISIBLE_DEVICES", "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "ok"),
    ("CUDA_VISIBLE_DEVICES", "", "warning"),
    ("ASCEND_RT_VISIBLE_DEVICES", "0,x", "error"),
    ("TORCH_NPU_LOGS", "memory,+dispatch,-all", "ok"),
    ("TORCH_NPU_LOGS", "memroy", "warning"),
])
def test_single_variable_rules(name, value, severity):
    findings = ec.check_env({name: value})
    assert [f.severity for f in findings] == [severity], findings


def test_inf_nan_mode_zero_needs_force_disable():
    warn = only(ec.check_env({"INF_NAN_MODE_ENABLE": "0"}), "INF_NAN_MODE_ENABLE+INF_NAN_MODE_FORCE_DISABLE")
    assert len(warn) == 1 and warn[0].severity == "warning"
    assert not only(ec.check_env({"INF_NAN_MODE_ENABLE": "0", "INF_NAN_MODE_FORCE_DISABLE": "1"}),
                    "INF_NAN_MODE_ENABLE+INF_NAN_MODE_FORCE_DISABLE")


def test_launch_blocking_overrides_task_queue():
    findings = ec.check_env({"ASCEND_LAUNCH_BLOCKING": "1", "TASK_QUEUE_ENABLE": "2"})
    assert only(findings, "ASCEND_LAUNCH_BLOCKING+TASK_QUEUE_ENABLE")


def test_aiv_exec_timeout_limit():
    findings = ec.check_env({"HCCL_OP_EXPANSION_MODE": "AIV", "HCCL_EXEC_TIMEOUT": "1836"})
    assert only(findings, "HCCL_EXEC_TIMEOUT+HCCL_OP_EXPANSION_MODE")
    assert not only(ec.check_env({"HCCL_OP_EXPANSION_MODE": "AIV", "HCCL_EXEC_TIMEOUT": "1000"}),
                    "HCCL_EXEC_TIMEOUT+HCCL_OP_EXPANSION_MODE")


def test_omp_threads_above_usable_cores():
    findings = ec.check_env({"OMP_NUM_THREADS": "64"}, usable_cores=8)
    assert [(f.name, f.severity) for f in findings] == [("OMP_NUM_THREADS", "warning")]
    assert [f.severity for f in ec.check_env({"OMP_NUM_THREADS": "8"}, usable_cores=8)] == ["ok"]


def test_findings_frame_sorts_errors_first():
    findings = ec.check_env({"TASK_QUEUE_ENABLE": "2", "HCCL_BUFSIZE": "1", "PT_DEBUG": "1"})
    frame = ec.findings_frame(findings)
    assert list(frame["severity"]) == ["error", "warning", "ok"]


def test_catalog_is_consistent():
    required = {
        "TASK_QUEUE_ENABLE", "ASCEND_LAUNCH_BLOCKING", "ASCEND_GLOBAL_LOG_LEVEL", "ASCEND_SLOG_PRINT_TO_STDOUT",
        "PYTORCH_NPU_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "CPU_AFFINITY_CONF",
        "HCCL_ALGO", "HCCL_BUFFSIZE", "HCCL_CONNECT_TIMEOUT", "HCCL_EXEC_TIMEOUT", "HCCL_INTRA_ROCE_ENABLE",
        "HCCL_INTRA_PCIE_ENABLE", "HCCL_OP_EXPANSION_MODE", "COMBINED_ENABLE", "INF_NAN_MODE_ENABLE",
        "ACLNN_CACHE_LIMIT", "MULTI_STREAM_MEMORY_REUSE", "TORCH_DEVICE_BACKEND_AUTOLOAD",
        "ASCEND_RT_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
        "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "TORCH_NPU_LOGS",
    }
    assert required <= set(ec.CATALOG)
    assert not (set(ec.CATALOG) & set(ec.INVENTED))
    assert not (set(ec.CATALOG) & set(ec.RECOGNISED))
    for var in ec.CATALOG.values():
        assert var.source, var.name
        assert var.scope in ec.SCOPES and var.kind in ec.KINDS
        if var.default is not None:  # every documented default must pass its own validation
            assert [f.severity for f in ec.validate_value(var.name, var.default)] in (["ok"], ["warning"]), var.name
    frame = ec.catalog_frame()
    assert len(frame) == len(ec.CATALOG) and "allowed" in frame.columns


def test_envvar_rejects_bad_declarations():
    with pytest.raises(ValueError):
        ec.EnvVar(name="X", scope="nowhere", description="", kind="free")
    with pytest.raises(ValueError):
        ec.EnvVar(name="X", scope="torch", description="", kind="enum")
