"""Tests for helpers.diagnose.envcatalog: one test per rule."""

from __future__ import annotations

import re

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
    assert f.severity == "warning" and "check the spelling" in f.message
    assert "HCCL_BUFFSIZE" in f.fix


def test_recognised_real_names_are_not_reported():
    environ = {"ASCEND_HOME_PATH": "/usr/local/Ascend/ascend-toolkit/latest",
               "HCCL_WHITELIST_DISABLE": "1", "NCCL_P2P_LEVEL": "NVL", "OMP_PROC_BIND": "close",
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


def test_envvar_rejects_bad_declarations():
    with pytest.raises(ValueError):
        ec.EnvVar(name="X", scope="nowhere", description="", kind="free")
    with pytest.raises(ValueError):
        ec.EnvVar(name="X", scope="torch", description="", kind="enum")


# --------------------------------------------------------------------------
# NCCL and torch ProcessGroupNCCL settings
# --------------------------------------------------------------------------

@pytest.mark.parametrize("name, value, severity", [
    ("NCCL_ALGO", "Ring,Tree", "warning"),          # valid, but overrides NCCL's own choice
    ("NCCL_ALGO", "tree", "warning"),               # NCCL matches names case-insensitively
    ("NCCL_ALGO", "^NVLS", "warning"),
    ("NCCL_ALGO", "ring;allreduce:tree,collnetdirect;broadcast:ring", "warning"),
    ("NCCL_ALGO", "NHR", "error"),                  # an HCCL algorithm
    ("NCCL_ALGO", "ring;tree", "error"),            # second entry without a collective prefix
    ("NCCL_ALGO", "alltoall:ring", "error"),        # not one of NCCL's prefixable collectives
    ("NCCL_ALGO", "", "error"),
    ("NCCL_PROTO", "^LL128", "warning"),
    ("NCCL_PROTO", "LL,Simple;allreduce:^LL", "warning"),
    ("NCCL_PROTO", "LL256", "error"),
    ("NCCL_P2P_DISABLE", "1", "ok"),
    ("NCCL_P2P_DISABLE", "yes", "error"),
    ("NCCL_BUFFSIZE", "4194304", "ok"),
    ("NCCL_BUFFSIZE", "5000000", "warning"),        # not a power of two
    ("NCCL_BUFFSIZE", "256", "warning"),            # bytes, not MB
    ("NCCL_BUFFSIZE", "4MB", "error"),
    ("NCCL_NTHREADS", "256", "ok"),
    ("NCCL_NTHREADS", "100", "error"),              # not a multiple of 32
    ("NCCL_NTHREADS", "1024", "error"),             # above 512
    ("NCCL_MIN_NCHANNELS", "4", "ok"),
    ("NCCL_MAX_NCHANNELS", "65", "error"),          # MAXCHANNELS = 64
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3", "ok"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", "ok"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0", "warning"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "4", "error"),
    ("TORCH_NCCL_BLOCKING_WAIT", "0", "ok"),
    ("TORCH_NCCL_BLOCKING_WAIT", "False", "ok"),
    ("TORCH_NCCL_BLOCKING_WAIT", "1", "warning"),
    ("TORCH_NCCL_BLOCKING_WAIT", "maybe", "error"),
])
def test_nccl_and_torch_nccl_rules(name, value, severity):
    findings = ec.check_env({name: value})
    assert [f.severity for f in findings] == [severity], findings


def test_hccl_algo_tree_is_an_error_but_nccl_tree_is_real():
    assert by_severity(ec.check_env({"HCCL_ALGO": "tree"}), "error")
    assert not by_severity(ec.check_env({"NCCL_ALGO": "Tree"}), "error")


def test_nccl_algo_error_points_hccl_names_to_hccl_algo():
    (f,) = ec.check_env({"NCCL_ALGO": "H-D_R"})
    assert "HCCL_ALGO" in f.message


@pytest.mark.parametrize("old, new", sorted((o, n) for o, (n, _) in ec.DEPRECATED.items()))
def test_deprecated_torch_names_warn_with_the_current_name(old, new):
    (f,) = ec.check_env({old: "1"})
    assert f.severity == "warning" and "deprecated" in f.message
    assert f"{new}=1" in f.fix


def test_deprecated_name_with_a_wrong_value_is_an_error():
    (f,) = ec.check_env({"NCCL_ASYNC_ERROR_HANDLING": "9"})
    assert f.severity == "error" and "TORCH_NCCL_ASYNC_ERROR_HANDLING" in f.message


def test_deprecated_and_current_name_with_different_values():
    findings = ec.check_env({"NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_BLOCKING_WAIT": "0"})
    (f,) = only(findings, "NCCL_BLOCKING_WAIT+TORCH_NCCL_BLOCKING_WAIT")
    assert f.severity == "warning" and "TORCH_NCCL_BLOCKING_WAIT='0'" in f.message
    assert not only(ec.check_env({"NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_BLOCKING_WAIT": "1"}),
                    "NCCL_BLOCKING_WAIT+TORCH_NCCL_BLOCKING_WAIT")


def test_nccl_channel_minimum_above_maximum_is_a_conflict():
    findings = ec.check_env({"NCCL_MIN_NCHANNELS": "32", "NCCL_MAX_NCHANNELS": "4"})
    assert [(f.name, f.severity) for f in findings] == [("NCCL_MIN_NCHANNELS+NCCL_MAX_NCHANNELS", "error")]
    assert [f.severity for f in ec.check_env({"NCCL_MIN_NCHANNELS": "4", "NCCL_MAX_NCHANNELS": "4"})] == ["ok", "ok"]


def test_variables_in_a_conflict_are_not_also_reported_ok():
    findings = ec.check_env({"HCCL_INTRA_ROCE_ENABLE": "1", "HCCL_INTRA_PCIE_ENABLE": "1"})
    assert [f.severity for f in findings] == ["error"]


def test_new_catalog_entries_have_sources_and_valid_defaults():
    for name in ("NCCL_P2P_DISABLE", "NCCL_ALGO", "NCCL_PROTO", "NCCL_BUFFSIZE", "NCCL_NTHREADS",
                 "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                 "TORCH_NCCL_BLOCKING_WAIT"):
        assert name in ec.CATALOG and ec.CATALOG[name].source
    assert not (set(ec.DEPRECATED) & (set(ec.CATALOG) | set(ec.RECOGNISED)))
    for new, _ in ec.DEPRECATED.values():
        assert new in ec.CATALOG or new in ec.RECOGNISED, new


# --------------------------------------------------------------------------
# Env files
# --------------------------------------------------------------------------

def test_parse_env_file_forms(tmp_path):
    path = tmp_path / "a.env"
    path.write_text(
        "# comment\n"
        "\n"
        "TASK_QUEUE_ENABLE=2\n"
        "export HCCL_ALGO=\"level0:NA;level1:ring\"\n"
        "  export   HCCL_BUFFSIZE='400'   # trailing comment\n"
        "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True\n"
        "EMPTY=\n"
        "SPACED=\"a b\"\n"
        "TASK_QUEUE_ENABLE=1\n"
        "HASH='a#b'\n")
    assert ec.parse_env_file(path) == {
        "TASK_QUEUE_ENABLE": "1", "HCCL_ALGO": "level0:NA;level1:ring", "HCCL_BUFFSIZE": "400",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "EMPTY": "", "SPACED": "a b", "HASH": "a#b"}


@pytest.mark.parametrize("line, fragment", [
    ("no equals sign", "is not a setting"),
    ("1BAD=x", "is not a setting"),
    ("KEY = value", "is not a setting"),
    ("KEY= value", "starts with a space"),
    ("KEY=a b", "unquoted spaces"),
    ("KEY=\"open", "close the quote"),
])
def test_parse_env_file_errors_name_the_line(tmp_path, line, fragment):
    path = tmp_path / "bad.env"
    path.write_text(f"OK=1\n{line}\n")
    with pytest.raises(ec.ParameterError, match=fragment) as info:
        ec.parse_env_file(path)
    assert f"{path}:2:" in str(info.value)


def test_parse_env_file_missing_file(tmp_path):
    with pytest.raises(ec.ParameterError, match="cannot read env file"):
        ec.parse_env_file(tmp_path / "missing.env")


def test_write_env_file_keeps_only_validated_settings(tmp_path):
    environ = {"HCCL_ALGO": "level0:NA;level1:ring", "HCCL_BUFFSIZE": "400", "TASK_QUEUE_ENABLE": "0",
               "PATH": "/usr/bin", "HCCL_WHITELIST_DISABLE": "1", "HCCL_BUFSIZE": "1"}
    path, findings = ec.write_env_file(environ, tmp_path / "sub" / "run.env")
    text = path.read_text()
    assert text.startswith("# Written by helpers.diagnose.envcatalog.write_env_file")
    assert "# warning: TASK_QUEUE_ENABLE" in text
    # Validated names only: PATH, the recognised-only and the misspelt name are not written.
    assert ec.parse_env_file(path) == {"HCCL_ALGO": "level0:NA;level1:ring", "HCCL_BUFFSIZE": "400",
                                       "TASK_QUEUE_ENABLE": "0"}
    assert {f.name for f in findings} >= {"HCCL_ALGO", "HCCL_BUFSIZE"}


def test_write_env_file_raises_listing_every_invalid_setting(tmp_path):
    environ = {"PT_DEBUG": "1", "HCCL_ALGO": "tree", "HCCL_BUFFSIZE": "400",
               "HCCL_INTRA_ROCE_ENABLE": "1", "HCCL_INTRA_PCIE_ENABLE": "1"}
    target = tmp_path / "run.env"
    with pytest.raises(ec.ParameterError) as info:
        ec.write_env_file(environ, target)
    message = str(info.value)
    for name in ("PT_DEBUG", "HCCL_ALGO", "HCCL_INTRA_ROCE_ENABLE+HCCL_INTRA_PCIE_ENABLE"):
        assert name in message
    assert "fix:" in message and not target.exists()
    path, _ = ec.write_env_file(environ, target, skip_invalid=True)
    assert ec.parse_env_file(path) == {"HCCL_BUFFSIZE": "400"}
    assert "Left out as invalid or invented: HCCL_ALGO, HCCL_INTRA_PCIE_ENABLE, HCCL_INTRA_ROCE_ENABLE, PT_DEBUG" \
        in path.read_text()


def test_write_env_file_npu_flag_changes_the_verdict(tmp_path):
    environ = {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True", "PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    with pytest.raises(ec.ParameterError):
        ec.write_env_file(environ, tmp_path / "a.env", npu=True)
    path, _ = ec.write_env_file(environ, tmp_path / "b.env", npu=False)
    assert set(ec.parse_env_file(path)) == set(environ)


def test_write_env_file_unwritable_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ec.OutputDirError):
        ec.write_env_file({"HCCL_BUFFSIZE": "400"}, blocker / "run.env")


def test_format_finding_is_one_line_with_the_fix():
    (f,) = ec.check_env({"HCCL_ALGO": "tree"})
    line = ec.format_finding(f)
    assert "\n" not in line and line.startswith("ERROR   HCCL_ALGO=tree:") and "| fix: " in line


# ---- NCCL's own parsing of its debug variables (NVIDIA/nccl 5067397c src/debug.cc, param parsers) ----

@pytest.mark.parametrize("value", ["WARN", "warn", "Info", "abort", "ABORT", " TRACE ", "version"])
def test_nccl_debug_is_matched_in_any_case_like_nccl(value):
    (f,) = ec.validate_value("NCCL_DEBUG", value)
    assert f.severity == "ok", f


@pytest.mark.parametrize("value", ["DEBUG", "verbose", "1", ""])
def test_nccl_debug_unknown_value_is_an_error_that_says_nccl_ignores_it(value):
    (f,) = ec.validate_value("NCCL_DEBUG", value)
    assert f.severity == "error" and "no debug output" in f.message
    assert "ABORT" in f.message


def test_nccl_debug_ok_notes_do_not_depend_on_case():
    (f,) = ec.validate_value("NCCL_DEBUG", "info")
    assert f.severity == "ok" and "production" in f.message


@pytest.mark.parametrize("value, severity", [
    ("ALL", "ok"), ("all", "ok"), ("INIT,COLL", "ok"), ("init, net ,Graph", "ok"), ("^INIT,COLL", "ok"),
    ("ALLOC_HOST,DESTROY", "ok"), ("INIT,,COLL", "ok"),
    ("foo", "error"), ("INIT,colls", "error"),
    ("init,^coll", "error"),  # '^' only inverts when it starts the whole value
])
def test_nccl_debug_subsys_follows_nccls_bitset_parser(value, severity):
    (f,) = ec.validate_value("NCCL_DEBUG_SUBSYS", value)
    assert f.severity == severity, f
    if severity == "error":
        assert "INIT,BOOTSTRAP,ENV" in f.message


def test_nccl_debug_subsys_is_validated_not_silently_skipped():
    findings = ec.check_env({"NCCL_DEBUG_SUBSYS": "ALL", "NCCL_FASTMODE": "1"})
    by_name = {f.name: f for f in findings}
    assert by_name["NCCL_DEBUG_SUBSYS"].severity == "ok"
    assert by_name["NCCL_FASTMODE"].severity == "warning" and "catalog" in by_name["NCCL_FASTMODE"].message
    assert "NCCL_DEBUG_SUBSYS" not in ec.RECOGNISED


@pytest.mark.parametrize("name, value", [("NCCL_PROTO", "ll128"), ("NCCL_PROTO", "simple"), ("NCCL_ALGO", "RING")])
def test_nccl_algo_and_proto_names_are_case_insensitive(name, value):
    assert [f.severity for f in ec.validate_value(name, value)] == ["warning"]  # valid; advice only


def test_allowed_ranges_are_written_for_people():
    assert ec.CATALOG["HCCL_BUFFSIZE"].allowed == "integer >= 1 MB"
    assert ec.CATALOG["HCCL_CONNECT_TIMEOUT"].allowed == "integer 120 to 7200 s"
    assert "inf" not in " ".join(v.allowed for v in ec.CATALOG.values() if v.kind == "int")
    assert ec.CATALOG["NCCL_DEBUG"].allowed.endswith("(any case)")


@pytest.mark.parametrize("environ", [
    {"HCCL_ALGO": "tree"}, {"HCCL_CONNECT_TIMEOUT": "30"}, {"NCCL_DEBUG": "verbose"}, {"PT_DEBUG": "1"},
    {"TASK_QUEUE_ENABLE": "0"}, {"NCCL_BUFFSIZE": "1000"}, {"OMP_NUM_THREADS": "x"},
    {"PYTORCH_NPU_ALLOC_CONF": "max_split_size_mb:10"}, {"HCCL_BUFFSIZE": "400"}, {"NCCL_ASYNC_ERROR_HANDLING": "1"},
])
def test_a_finding_line_names_the_setting_once(environ):
    (name, value), = environ.items()
    for f in ec.check_env(environ):
        head = ec.format_finding(f).partition(" | fix: ")[0]
        assert len(re.findall(rf"(?<![A-Z_]){name}\b", head)) == 1, head
        assert not f.message.startswith(name), f.message


def test_catalog_text_shows_unset_defaults_and_every_entry():
    text = ec.format_catalog(width=80)
    blocks = text.strip().split("\n\n")
    assert len(blocks) == len(ec.CATALOG)
    for var in ec.CATALOG.values():
        block = next(b for b in blocks if b.startswith(var.name + "  ("))
        for label in ("what:", "allowed:", "default:", "source:"):
            assert label in block, (var.name, label)
    nthreads = next(b for b in blocks if b.startswith("NCCL_NTHREADS  ("))
    assert ec.CATALOG["NCCL_NTHREADS"].default is None and "\n  default: unset\n" in nthreads + "\n"
    for line in text.splitlines():  # wrapped; only a single unbreakable word (a URL, a path) may overrun
        assert len(line) <= 80 or max(len(word) for word in line.split()) > 40, line


# --------------------------------------------------------------------------
# CANN 9.0.0 HCCL pages and NCCL's env.rst (catalog update)
# --------------------------------------------------------------------------

@pytest.mark.parametrize("value, severity", [
    ("CCU_SCHED", "ok"),
    ("CCU_MS", "warning"),      # documented, but CANN 9.0.0 says the current version does not support it
    ("AI_CPU", "ok"), ("HOST_TS", "ok"),
    ("CCU", "error"), ("ccu_sched", "error"),  # CANN compares exactly
])
def test_hccl_op_expansion_mode_takes_the_ccu_modes(value, severity):
    assert [f.severity for f in ec.check_env({"HCCL_OP_EXPANSION_MODE": value})] == [severity]


def test_hccl_op_expansion_mode_integer_error_lists_the_ccu_modes():
    (f,) = ec.check_env({"HCCL_OP_EXPANSION_MODE": "2"})
    assert f.severity == "error" and "CCU_MS" in f.message and "CCU_SCHED" in f.message


@pytest.mark.parametrize("value", ["0.05", "0.5", "1.25", "1091.00", "1836", "0", "+30", " 0.1 "])
def test_hccl_exec_timeout_accepts_whole_seconds_and_10ms_steps(value):
    (f,) = ec.check_env({"HCCL_EXEC_TIMEOUT": value})
    assert f.severity == "ok", f
    if "." in value:
        assert "AIV" in f.message and "whole seconds" in f.message


@pytest.mark.parametrize("value, fragment", [
    ("0.055", "10 ms"), ("0.001", "10 ms"),            # finer than HCCL's precision
    ("-0.05", "out of range"), ("2147483648", "out of range"),
    ("abc", "not a number"), ("1e3", "not a number"), (".5", "not a number"), ("5.", "not a number"),
    ("0,05", "not a number"), ("30s", "not a number"), ("", "not a number"),
])
def test_hccl_exec_timeout_rejects_other_values(value, fragment):
    (f,) = ec.check_env({"HCCL_EXEC_TIMEOUT": value})
    assert f.severity == "error" and fragment in f.message, f
    assert "0.05" in f.fix


@pytest.mark.parametrize("mode", ["HOST", "HOST_TS", "CCU_MS", "CCU_SCHED"])
def test_hccl_exec_timeout_fraction_in_a_whole_seconds_mode_is_a_warning(mode):
    findings = ec.check_env({"HCCL_EXEC_TIMEOUT": "0.05", "HCCL_OP_EXPANSION_MODE": mode})
    (pair,) = only(findings, "HCCL_EXEC_TIMEOUT+HCCL_OP_EXPANSION_MODE")
    assert pair.severity == "warning" and "whole seconds" in pair.message
    assert not only(ec.check_env({"HCCL_EXEC_TIMEOUT": "60", "HCCL_OP_EXPANSION_MODE": mode}),
                    "HCCL_EXEC_TIMEOUT+HCCL_OP_EXPANSION_MODE")


@pytest.mark.parametrize("environ, conflict", [
    ({"HCCL_EXEC_TIMEOUT": "0.05", "HCCL_OP_EXPANSION_MODE": "AIV"}, False),
    ({"HCCL_EXEC_TIMEOUT": "0.05", "HCCL_OP_EXPANSION_MODE": "AI_CPU"}, False),
    ({"HCCL_EXEC_TIMEOUT": "1091.5", "HCCL_OP_EXPANSION_MODE": "AIV"}, True),   # above AIV's 1091
    ({"HCCL_EXEC_TIMEOUT": "0", "HCCL_OP_EXPANSION_MODE": "AIV"}, True),        # 0 is taken as 1091 in AIV
])
def test_hccl_exec_timeout_in_aiv_and_ai_cpu_modes(environ, conflict):
    findings = ec.check_env(environ)
    assert bool(only(findings, "HCCL_EXEC_TIMEOUT+HCCL_OP_EXPANSION_MODE")) is conflict, findings
    assert not by_severity(findings, "error")


def test_hccl_exec_timeout_allowed_text_names_the_precision():
    allowed = ec.CATALOG["HCCL_EXEC_TIMEOUT"].allowed
    assert "10 ms" in allowed and "2147483647" in allowed and "0.05" in allowed


@pytest.mark.parametrize("value", [
    "reduce=level0:NA;level1:ring",
    "scatter=level0:NA;level1:NHR",
    "allreduce=level0:NA;level1:ring/reduce=level0:NA;level1:H-D_R/scatter=level0:NA;level1:NB",
])
def test_hccl_algo_per_operator_form_takes_reduce_and_scatter(value):
    assert [f.severity for f in ec.check_env({"HCCL_ALGO": value})] == ["ok"]


def test_hccl_algo_operator_list_is_the_documented_seven():
    assert set(ec.HCCL_ALGO_OPS) == {"allgather", "reducescatter", "allreduce", "broadcast", "reduce",
                                     "scatter", "alltoall"}
    warn = ec.check_env({"HCCL_ALGO": "gather=level0:NA;level1:ring"})
    assert [f.severity for f in warn] == ["warning"] and "reduce" in warn[0].message


@pytest.mark.parametrize("environ, unset_name", [
    ({"HCCL_INTRA_PCIE_ENABLE": "0"}, "HCCL_INTRA_ROCE_ENABLE"),
    ({"HCCL_INTRA_ROCE_ENABLE": "0"}, "HCCL_INTRA_PCIE_ENABLE"),
])
def test_intra_link_zero_with_the_other_unset_is_a_conflict(environ, unset_name):
    findings = ec.check_env(environ)
    assert [(f.name, f.severity) for f in findings] == [("HCCL_INTRA_ROCE_ENABLE+HCCL_INTRA_PCIE_ENABLE", "error")]
    (f,) = findings
    assert f"{unset_name}=(unset)" in f.value and "does not support" in f.message and f.fix
    line = ec.format_finding(f)
    assert line.startswith("ERROR   HCCL_INTRA_ROCE_ENABLE+HCCL_INTRA_PCIE_ENABLE:")


@pytest.mark.parametrize("pcie, roce", [("1", None), ("1", "0"), ("0", "1"), (None, "1"), ("0", "0"), (None, None)])
def test_intra_link_combinations_in_the_cann_table_are_not_conflicts(pcie, roce):
    environ = {k: v for k, v in (("HCCL_INTRA_PCIE_ENABLE", pcie), ("HCCL_INTRA_ROCE_ENABLE", roce)) if v is not None}
    assert not by_severity(ec.check_env(environ), "error")


def test_write_env_file_leaves_out_an_unsupported_intra_link_setting(tmp_path):
    path, _ = ec.write_env_file({"HCCL_INTRA_PCIE_ENABLE": "0", "HCCL_BUFFSIZE": "400"}, tmp_path / "run.env",
                                skip_invalid=True)
    assert ec.parse_env_file(path) == {"HCCL_BUFFSIZE": "400"}


@pytest.mark.parametrize("name, value, severity", [
    ("HCCL_RDMA_TIMEOUT", "5", "ok"),
    ("HCCL_RDMA_TIMEOUT", "20", "ok"),
    ("HCCL_RDMA_TIMEOUT", "24", "warning"),   # 910A/300I Duo/Atlas 350 only; A2/A3 stop at 20
    ("HCCL_RDMA_TIMEOUT", "4", "error"),
    ("HCCL_RDMA_TIMEOUT", "25", "error"),
    ("HCCL_RDMA_TIMEOUT", "6.5", "error"),
    ("HCCL_RDMA_RETRY_CNT", "1", "ok"),
    ("HCCL_RDMA_RETRY_CNT", "7", "ok"),
    ("HCCL_RDMA_RETRY_CNT", "0", "error"),
    ("HCCL_RDMA_RETRY_CNT", "8", "error"),
    ("HCCL_NPU_SOCKET_PORT_RANGE", "61000-61050", "ok"),                     # the four documented examples
    ("HCCL_NPU_SOCKET_PORT_RANGE", "61000,61050-61100,61200-61210", "ok"),
    ("HCCL_NPU_SOCKET_PORT_RANGE", "57000,57005,57007,58008,58100,58105,58107,58108", "ok"),
    ("HCCL_NPU_SOCKET_PORT_RANGE", "auto", "ok"),
    ("HCCL_NPU_SOCKET_PORT_RANGE", "16666", "ok"),
    ("HCCL_NPU_SOCKET_PORT_RANGE", "1000-1100", "warning"),                  # reaches into 1-1023
    ("HCCL_NPU_SOCKET_PORT_RANGE", "61000-61050,61040-61060", "error"),      # overlapping entries
    ("HCCL_NPU_SOCKET_PORT_RANGE", "61000,61000", "error"),
    ("HCCL_NPU_SOCKET_PORT_RANGE", "61050-61000", "error"),
    ("HCCL_NPU_SOCKET_PORT_RANGE", "0", "error"),
    ("HCCL_NPU_SOCKET_PORT_RANGE", "65536", "error"),
    ("HCCL_NPU_SOCKET_PORT_RANGE", "61000;61001", "error"),
    ("HCCL_NPU_SOCKET_PORT_RANGE", "", "error"),
])
def test_hccl_rdma_and_npu_port_settings(name, value, severity):
    findings = ec.check_env({name: value})
    assert [f.severity for f in findings] == [severity], findings


def test_new_hccl_entries_have_documented_defaults_and_cann_900_sources():
    expected = {"HCCL_RDMA_TIMEOUT": "20", "HCCL_RDMA_RETRY_CNT": "7", "HCCL_NPU_SOCKET_PORT_RANGE": "16666"}
    for name, default in expected.items():
        var = ec.CATALOG[name]
        assert var.scope == "HCCL" and var.default == default and "canncommercial/900" in var.source, name
        assert [f.severity for f in ec.validate_value(name, default)] == ["ok"]
    assert ec.CATALOG["HCCL_RDMA_TIMEOUT"].allowed == "integer 5 to 24"
    assert not ({"HCCL_RDMA_TIMEOUT", "HCCL_RDMA_RETRY_CNT", "HCCL_NPU_SOCKET_PORT_RANGE"} & set(ec.RECOGNISED))


@pytest.mark.parametrize("name, version", [
    ("NCCL_LL_THRESHOLD", "2.5"), ("NCCL_TREE_THRESHOLD", "2.5"), ("NCCL_SINGLE_RING_THRESHOLD", "2.3"),
    ("NCCL_IB_CUDA_SUPPORT", "2.4.0"), ("NCCL_CHECKS_DISABLE", "2.2.12"),
])
def test_nccl_names_nccl_no_longer_reads_are_a_warning_with_the_version(name, version):
    (f,) = ec.check_env({name: "1"})
    assert f.severity == "warning" and f.name == name
    assert "does nothing in current NCCL" in f.message and f"NCCL {version}" in f.message
    assert f.fix.startswith(f"unset {name}")
    assert name in ec.REMOVED and name not in ec.RECOGNISED and ec.REMOVED[name][2]


def test_removed_nccl_names_point_to_what_replaced_them():
    (f,) = ec.check_env({"NCCL_IB_CUDA_SUPPORT": "0"})
    assert "NCCL_NET_GDR_LEVEL" in f.fix
    (f,) = ec.check_env({"NCCL_LL_THRESHOLD": "0"})
    assert "NCCL_PROTO" in f.fix


def test_removed_names_are_disjoint_from_the_other_tables_and_not_written(tmp_path):
    tables = (ec.CATALOG, ec.RECOGNISED, ec.INVENTED, ec.DEPRECATED)
    assert not any(set(ec.REMOVED) & set(t) for t in tables)
    path, findings = ec.write_env_file({"NCCL_LL_THRESHOLD": "0", "NCCL_DEBUG": "WARN"}, tmp_path / "run.env")
    assert ec.parse_env_file(path) == {"NCCL_DEBUG": "WARN"}
    assert "# warning: NCCL_LL_THRESHOLD" in path.read_text()
