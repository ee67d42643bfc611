"""Catalog of real environment settings for torch_npu, CANN, HCCL, NCCL, torch and threads, and a checker.

The catalog is data: one :class:`EnvVar` per setting the workbook knows how to
validate, with where it is documented. :func:`check_env` reads a mapping (pass
``os.environ``; this module does no I/O of its own) and returns one
:class:`Finding` per set variable that the catalog validates (or per problem
with it), per invented name, per unknown name with a watched prefix, per name
that its reader no longer reads (:data:`REMOVED`), and per cross-variable
conflict. Real names that are only recognised (:data:`RECOGNISED`, e.g. the
paths CANN's set_env.sh exports) produce no finding.

Ground truth is ``docs/ascend_api_factcheck.md`` (sections 3 and 7),
the torch_npu docs under ``docs/zh/api/environment_variable/`` of Ascend/pytorch
(master 9e73e708a), torch_npu's ``NPUAllocatorConfig.{h,cpp}``, torch 2.13's
``c10/core/AllocatorConfig.h`` and ``c10/cuda/CUDAAllocatorConfig.h``, the
CANN 9.0.0 HCCL environment-variable pages on hiascend.com, and the NCCL and
OpenMP documentation. Nothing here is guessed: a name that could not
be checked is not in the catalog.

Typical use::

    import os
    findings = check_env(os.environ)
    findings_frame(findings)          # a table sorted errors first

The command line ``python -m helpers env check`` (helpers/workbook/cli.py)
prints :func:`format_finding` lines and :func:`format_catalog`.
:func:`parse_env_file` reads a proposed ``KEY=VALUE`` file and
:func:`write_env_file` writes only the validated settings as ``export`` lines
that torchrun's shell can ``source``. Per-process-group HCCL settings (rather
than environment variables) are built by ``helpers.comm.hccl_options``.
"""

from __future__ import annotations

import difflib
import logging
import re
import shlex
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Callable, Iterable, Mapping

from helpers.errors import OutputDirError, ParameterError

logger = logging.getLogger(__name__)

__all__ = [
    "SCOPES",
    "KINDS",
    "SEVERITIES",
    "WATCHED_PREFIXES",
    "EnvVar",
    "Finding",
    "CATALOG",
    "RECOGNISED",
    "INVENTED",
    "ALLOC_KEYS_GENERIC",
    "ALLOC_KEYS_CUDA",
    "ALLOC_KEYS_NPU",
    "HCCL_ALGOS",
    "HCCL_ALGO_OPS",
    "NCCL_ALGOS",
    "NCCL_PROTOS",
    "NCCL_FUNCS",
    "NCCL_DEBUG_LEVELS",
    "NCCL_DEBUG_SUBSYSTEMS",
    "DEPRECATED",
    "REMOVED",
    "INVENTED_VALUES",
    "lookup",
    "parse_alloc_conf",
    "validate_value",
    "check_env",
    "findings_frame",
    "format_catalog",
    "parse_env_file",
    "write_env_file",
    "format_finding",
]

SCOPES: tuple[str, ...] = ("torch_npu", "CANN", "HCCL", "NCCL", "torch", "threads")

#: How a value is checked. "enum": one of ``choices``; "int": an integer in
#: [``minimum``, ``maximum``]; "alloc_conf_npu" / "alloc_conf_cuda" /
#: "alloc_conf_any": comma-separated ``key:value`` allocator settings;
#: "hccl_algo": HCCL_ALGO syntax; "hccl_exec_timeout": seconds in
#: [``minimum``, ``maximum``], whole or with at most two decimals (HCCL's 10 ms
#: precision); "port_list": ``auto`` or comma-separated ports and ``a-b`` port
#: ranges (HCCL_NPU_SOCKET_PORT_RANGE); "cpu_affinity": CPU_AFFINITY_CONF syntax;
#: "device_list": comma-separated device indices; "thread_list": OpenMP thread
#: counts; "npu_log_modules": TORCH_NPU_LOGS syntax; "nccl_algo" / "nccl_proto":
#: NCCL's ``[^]elem,...[;func:[^]elem,...]`` lists (NCCL ``src/graph/tuning.cc``
#: ``parseList``); "nccl_subsys": NCCL_DEBUG_SUBSYS's ``[^]name,...`` list (NCCL
#: ``src/include/param/parser_bitset.h``); "torch_bool": the booleans torch's c10d
#: ``getCvarBool`` accepts; "free": not checked.
KINDS: tuple[str, ...] = (
    "enum", "int", "alloc_conf_npu", "alloc_conf_cuda", "alloc_conf_any",
    "hccl_algo", "hccl_exec_timeout", "port_list", "cpu_affinity", "device_list", "thread_list",
    "npu_log_modules",
    "nccl_algo", "nccl_proto", "nccl_subsys", "torch_bool", "free",
)

SEVERITIES: tuple[str, ...] = ("ok", "warning", "error")
_SEVERITY_RANK = {"error": 0, "warning": 1, "ok": 2}

WATCHED_PREFIXES: tuple[str, ...] = (
    "ASCEND_", "HCCL_", "NCCL_", "PYTORCH_", "TORCH_", "TASK_QUEUE", "CPU_AFFINITY",
    "INF_NAN", "ACLNN", "MULTI_STREAM", "COMBINED_ENABLE", "OMP_", "MKL_", "CUDA_VISIBLE", "PT_",
)

# Source strings. The fact-check is the team's checked summary; the paths are
# in the Ascend/pytorch repository (gitcode.com/Ascend/pytorch, mirrored on GitHub).
_FC = "docs/ascend_api_factcheck.md"
_NPU_DOC = "Ascend/pytorch docs/zh/api/environment_variable/"
_CANN_ENV = "hiascend.com CANN env-var reference (canncommercial maintenref/envvar/"
#: CANN 9.0.0 pages (commercial edition): the environment-variable reference and the HCCL guide.
_CANN_900_ENV = "https://www.hiascend.com/document/detail/zh/canncommercial/900/maintenref/envvar/"
_CANN_900_HCCL = "https://www.hiascend.com/document/detail/zh/canncommercial/900/API/hcclug/"
_NCCL_DOC = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
#: NCCL sources read for parsers and limits (github.com/NVIDIA/nccl, commit 5067397c, 2026-06-11).
_NCCL_SRC = "NVIDIA/nccl 5067397c "
#: The reStructuredText that docs.nvidia.com's env.html is built from, at the same commit.
_NCCL_ENV_RST = f"{_NCCL_SRC}docs/userguide/source/env.rst"
_TORCH_PG = ("torch 2.13 include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp (env-name lists) and "
             "Utils.hpp (getCvarBool/getCvarInt)")
_OMP_DOC = "OpenMP API specification, chapter 'Environment Variables'"
_TORCH_ALLOC = ("torch 2.13 include/c10/core/AllocatorConfig.h and c10/cuda/CUDAAllocatorConfig.h; "
                "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf")


@dataclass(frozen=True)
class EnvVar:
    """One environment setting the workbook can validate.

    Parameters
    ----------
    name : str
        The variable's exact name.
    scope : str
        Who reads it: one of :data:`SCOPES`.
    description : str
        What it does, in one or two sentences.
    kind : str
        How its value is validated: one of :data:`KINDS`.
    default : str or None
        The documented default (as the string a user would set), or None
        when unset means "feature off" or no default is documented.
    choices : tuple of str
        Allowed values when ``kind == "enum"``.
    minimum, maximum : int or None
        Inclusive bounds when ``kind`` is "int" or "hccl_exec_timeout" (None: unbounded).
    unit : str or None
        Unit of an integer value ("MB", "s", "entries"...).
    source : str
        Where the name and values are documented.
    notes : str
        Caveats a user should know (scope limits, recommended values).
    case_insensitive : bool
        For ``kind == "enum"``: the reader matches ``choices`` ignoring case
        (NCCL's parsers do; torch_npu's and CANN's compare exactly).
    """

    name: str
    scope: str
    description: str
    kind: str
    default: str | None = None
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    unit: str | None = None
    source: str = ""
    notes: str = ""
    case_insensitive: bool = False

    def __post_init__(self) -> None:
        if self.scope not in SCOPES:
            raise ValueError(f"EnvVar {self.name}: scope {self.scope!r} is not one of {SCOPES}")
        if self.kind not in KINDS:
            raise ValueError(f"EnvVar {self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.kind == "enum" and not self.choices:
            raise ValueError(f"EnvVar {self.name}: kind 'enum' needs choices")

    @property
    def allowed(self) -> str:
        """A human-readable description of the accepted values."""
        if self.kind == "enum":
            text = " | ".join(self.choices)
            return text + " (any case)" if self.case_insensitive else text
        if self.kind == "hccl_exec_timeout":
            return (f"seconds {self.minimum} to {self.maximum}: whole, or to 10 ms (two decimals, e.g. 0.05) "
                    "in AIV mode and in A3's AI_CPU mode")
        if self.kind == "int":
            unit = f" {self.unit}" if self.unit else ""
            if self.minimum is not None and self.maximum is not None:
                return f"integer {self.minimum} to {self.maximum}{unit}"
            if self.minimum is not None:
                return f"integer >= {self.minimum}{unit}"
            if self.maximum is not None:
                return f"integer <= {self.maximum}{unit}"
            return f"integer{unit}"
        return {
            "alloc_conf_npu": "key:value,... (torch_npu allocator keys)",
            "alloc_conf_cuda": "key:value,... (PyTorch CUDA allocator keys)",
            "alloc_conf_any": "key:value,... (PyTorch or torch_npu allocator keys)",
            "hccl_algo": "level0:NA;level1:<algo>[;level2:<algo>] or <op>=...;.../<op>=...",
            "port_list": "auto, or comma-separated ports and a-b ranges in 1..65535, e.g. 61000-61050,61200",
            "cpu_affinity": "<mode 0|1|2>[,force:0|1][,npu<N>:<a>-<b>...][,npu_affine:0|1]",
            "device_list": "comma-separated device indices, e.g. 0,1,2,3",
            "thread_list": "positive integer (or comma list for nested levels)",
            "npu_log_modules": "comma-separated [+|-]module, e.g. memory,+dispatch,-all",
            "nccl_algo": "[^]algo,...[;<func>:[^]algo,...] with algo in " + ", ".join(NCCL_ALGOS),
            "nccl_proto": "[^]proto,...[;<func>:[^]proto,...] with proto in " + ", ".join(NCCL_PROTOS),
            "nccl_subsys": "[^]name,... with name in " + ", ".join(NCCL_DEBUG_SUBSYSTEMS) + " (any case)",
            "torch_bool": "1|0 (also true/false, yes/no, y/n, t/f; case-insensitive)",
            "free": "any string (not checked)",
        }[self.kind]


@dataclass(frozen=True)
class Finding:
    """The verdict on one variable (or on a pair of variables).

    Parameters
    ----------
    name : str
        Variable name; for a cross-variable conflict, the names joined by "+".
    value : str
        The value seen (for a conflict, "A=...; B=...").
    severity : str
        "ok", "warning" or "error" (see :data:`SEVERITIES`).
    message : str
        What is right or wrong, with the value seen.
    fix : str
        What to do; empty when nothing needs doing.
    """

    name: str
    value: str
    severity: str
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding {self.name}: severity {self.severity!r} not in {SEVERITIES}")


# --------------------------------------------------------------------------
# Allocator configuration keys
# --------------------------------------------------------------------------

#: Device-generic keys parsed by torch's AcceleratorAllocatorConfig
#: (torch 2.13 ``c10/core/AllocatorConfig.h``); torch_npu supports exactly these
#: (``kNPUSupportAccKeys`` in NPUAllocatorConfig.cpp).
ALLOC_KEYS_GENERIC: frozenset[str] = frozenset({
    "max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
    "roundup_power2_divisions", "expandable_segments", "pinned_use_background_threads",
    "large_segment_size_mb", "pinned_max_round_threshold_mb", "pinned_max_cached_size_mb",
})
#: CUDA-only keys (torch 2.13 ``CUDAAllocatorConfig::getKeys``).
ALLOC_KEYS_CUDA: frozenset[str] = frozenset({
    "backend", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
    "release_lock_on_hipmalloc", "pinned_use_hip_host_register", "graph_capture_record_stream_reuse",
    "pinned_reserve_segment_size_mb", "pinned_num_register_threads", "per_process_memory_fraction",
    "pinned_free_catch_all", "throw_on_cudamalloc_oom",
})
#: torch_npu-only keys (``NPUAllocatorConfig::getKeys``, Ascend/pytorch master 9e73e708a).
ALLOC_KEYS_NPU: frozenset[str] = frozenset({
    "pin_memory_expandable_segments", "pinned_mem_register", "base_addr_aligned_kb", "page_size",
    "segment_size_mb", "multi_stream_lazy_reclaim", "pinned_reserve_segment_size_mb",
    "per_process_memory_fraction", "release_lock_on_npumalloc", "throw_on_npumalloc_oom",
})
_ALLOC_BOOL_KEYS = frozenset({
    "expandable_segments", "pinned_use_background_threads", "pin_memory_expandable_segments",
    "pinned_mem_register", "multi_stream_lazy_reclaim", "release_lock_on_npumalloc",
    "throw_on_npumalloc_oom", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
    "release_lock_on_hipmalloc", "pinned_use_hip_host_register", "graph_capture_record_stream_reuse",
    "pinned_free_catch_all", "throw_on_cudamalloc_oom",
})

# --------------------------------------------------------------------------
# HCCL_ALGO vocabulary (fact-check §3; CANN 8.5.0 envref_07_0079)
# --------------------------------------------------------------------------

HCCL_ALGOS: tuple[str, ...] = ("ring", "H-D_R", "NHR", "NHR_V1", "NB", "AHC", "pipeline", "pairwise")
#: Operator names of the per-operator HCCL_ALGO form (``<op>=level0:NA;level1:<algo>/...``):
#: the seven the HCCL_ALGO page lists ("<op> ... allgather, reducescatter, allreduce,
#: broadcast, reduce, scatter, alltoall"; hiascend canncommercial 800 envref_07_0079,
#: CANN 8.0.0, and 80RC3 envref_07_0089, CANN 8.0.RC3).
HCCL_ALGO_OPS: tuple[str, ...] = (
    "allreduce", "allgather", "broadcast", "reducescatter", "reduce", "scatter", "alltoall",
)
_HCCL_ALGO_FIX = 'export HCCL_ALGO="level0:NA;level1:ring" (or H-D_R, NHR, NHR_V1, NB, AHC, pipeline)'

# --------------------------------------------------------------------------
# NCCL vocabulary (NCCL src/init.cc ncclAlgoStr / ncclProtoStr / ncclFuncStr)
# --------------------------------------------------------------------------

#: Algorithm names NCCL_ALGO accepts (matched case-insensitively by NCCL).
NCCL_ALGOS: tuple[str, ...] = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
#: Protocol names NCCL_PROTO accepts (matched case-insensitively by NCCL).
NCCL_PROTOS: tuple[str, ...] = ("LL", "LL128", "Simple")
#: Collective names usable as the ``<func>:`` prefix of NCCL_ALGO / NCCL_PROTO.
NCCL_FUNCS: tuple[str, ...] = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
#: NCCL_DEBUG levels (NCCL ``src/debug.cc`` ncclParamDebugLevel, commit 5067397c; matched
#: case-insensitively: ``iequals`` in ``src/include/param/utils.h``, ``strcasecmp`` in
#: NCCL <= 2.29). An unknown value is ignored silently (no debug output at all).
NCCL_DEBUG_LEVELS: tuple[str, ...] = ("VERSION", "WARN", "INFO", "ABORT", "TRACE")
#: NCCL_DEBUG_SUBSYS names (NCCL ``src/debug.cc`` ncclParamDebugSubsys, commit 5067397c;
#: ALLOC_HOST and DESTROY are newer than NCCL 2.27). Matched case-insensitively, comma-separated,
#: with one leading '^' to invert the whole list (``src/include/param/parser_bitset.h``).
NCCL_DEBUG_SUBSYSTEMS: tuple[str, ...] = (
    "INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "ALLOC_HOST", "CALL",
    "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE", "RAS", "DESTROY", "ALL",
)
#: NCCL's hard channel limit (``MAXCHANNELS`` in src/include/device.h).
NCCL_MAX_CHANNELS = 64

#: Values torch's ``getCvarBool`` accepts (lower-cased first), true then false.
_TORCH_TRUE = ("1", "y", "yes", "t", "true")
_TORCH_FALSE = ("0", "n", "no", "f", "false")

#: TORCH_NPU_LOGS modules (torch_npu docs alarm_message_printing/TORCH_NPU_LOGS.md), plus "all".
NPU_LOG_MODULES: tuple[str, ...] = (
    "memory", "dispatch", "dispatch_time", "silent", "recovery", "op_plugin", "shmem", "env",
    "acl", "aclgraph", "all",
)


def _v(name, scope, description, kind, **kw) -> EnvVar:
    return EnvVar(name=name, scope=scope, description=description, kind=kind, **kw)


_ENTRIES: tuple[EnvVar, ...] = (
    # ---- torch_npu: operator execution -----------------------------------
    _v("TASK_QUEUE_ENABLE", "torch_npu",
       "Operator-dispatch queue: 0 off, 1 two-stage pipeline (Level 1), 2 Level 2 (also moves "
       "workspace tasks to the second stage).",
       "enum", default="1", choices=("0", "1", "2"),
       source=f"{_NPU_DOC}op_execution/TASK_QUEUE_ENABLE.md; OptionsManager.cpp:575-579; {_FC} §3",
       notes="2 is recommended by Ascend (binary kernels only; may raise peak NPU memory). "
             "Ignored when ASCEND_LAUNCH_BLOCKING=1. Level 2 exists since torch_npu 6.0.0."),
    _v("ASCEND_LAUNCH_BLOCKING", "torch_npu",
       "1 runs every operator synchronously so error stacks point at the failing call.",
       "enum", default="0", choices=("0", "1"),
       source=f"{_NPU_DOC}op_execution/ASCEND_LAUNCH_BLOCKING.md",
       notes="1 is for debugging only: it slows training and turns the task queue off."),
    _v("COMBINED_ENABLE", "torch_npu",
       "Optimises combinations of two non-contiguous operators.",
       "enum", default="0", choices=("0", "1"),
       source=f"{_NPU_DOC}op_execution/COMBINED_ENABLE.md; OptionsManager.cpp:140; {_FC} §3"),
    _v("INF_NAN_MODE_ENABLE", "torch_npu",
       "0 = saturation mode, 1 = INF_NAN (IEEE) mode for Inf/NaN inputs.",
       "enum", default="1", choices=("0", "1"),
       source=f"{_NPU_DOC}op_execution/INF_NAN_MODE_ENABLE.md; {_FC} §3",
       notes="Default 1 on A2/A3; 0 there is intercepted unless INF_NAN_MODE_FORCE_DISABLE=1. "
             "Ignored on 910A/inference parts (saturation only) and 950DT (INF_NAN only)."),
    _v("INF_NAN_MODE_FORCE_DISABLE", "torch_npu",
       "1 forces INF_NAN mode off (saturation mode) on A2/A3; Inf/NaN then become max/0.",
       "enum", default="0", choices=("0", "1"),
       source=f"{_NPU_DOC}op_execution/INF_NAN_MODE_FORCE_DISABLE.md"),
    _v("ACLNN_CACHE_LIMIT", "CANN",
       "Number of aclnn operator-info cache entries on the host, per thread (about 2 KB each).",
       "int", default="10000", minimum=1, maximum=10_000_000, unit="entries",
       source=f"{_CANN_ENV}envref_07_0031, CANN 9.0.0); {_FC} §3",
       notes="Raise it only for wide dynamic-shape ranges."),
    # ---- torch_npu: memory ----------------------------------------------
    _v("PYTORCH_NPU_ALLOC_CONF", "torch_npu",
       "torch_npu caching-allocator settings: comma-separated key:value pairs.",
       "alloc_conf_npu",
       source=f"{_NPU_DOC}memory_management/PYTORCH_NPU_ALLOC_CONF.md; NPUAllocatorConfig.cpp; {_FC} §3",
       notes="max_split_size_mb or garbage_collection_threshold non-default => expandable_segments "
             "must be False. Do not set together with PYTORCH_ALLOC_CONF (torch_npu 26.2+/PyTorch>=2.10)."),
    _v("PYTORCH_ALLOC_CONF", "torch",
       "Device-generic caching-allocator settings read by PyTorch (and by torch_npu from 26.2.0 "
       "with PyTorch >= 2.10).",
       "alloc_conf_any",
       source=f"{_TORCH_ALLOC}; {_NPU_DOC}memory_management/PYTORCH_NPU_ALLOC_CONF.md",
       notes="torch_npu exits with an error when both this and PYTORCH_NPU_ALLOC_CONF are set."),
    _v("PYTORCH_CUDA_ALLOC_CONF", "torch",
       "CUDA caching-allocator settings (the older, CUDA-specific name of PYTORCH_ALLOC_CONF).",
       "alloc_conf_cuda",
       source=_TORCH_ALLOC,
       notes="Validation is light: key names and obvious value errors only."),
    _v("MULTI_STREAM_MEMORY_REUSE", "torch_npu",
       "Multi-stream memory reuse: 0 off, 1 eraseStream/weak ref (default), 2 skip recordStream/"
       "strong ref, 3 = 1 plus early-release reuse.",
       "enum", default="1", choices=("0", "1", "2", "3"),
       source=f"{_NPU_DOC}memory_management/MULTI_STREAM_MEMORY_REUSE.md; OptionsManager.cpp:78-95; {_FC} §3",
       notes="2 is not recommended (may extend tensor lifetimes). 3 was added after 6.0.0."),
    # ---- torch_npu: performance, logging, device --------------------------
    _v("CPU_AFFINITY_CONF", "torch_npu",
       "CPU core binding: mode 0 off, 1 coarse, 2 fine-grained (recommended), with optional "
       "force, per-NPU core ranges and npu_affine.",
       "cpu_affinity",
       source=f"{_NPU_DOC}performance_tuning/CPU_AFFINITY_CONF.md; {_FC} §3",
       notes="npu_affine works on A2 only."),
    _v("TORCH_NPU_LOGS", "torch_npu",
       "Logging of torch_npu modules: comma-separated modules, '+' = DEBUG, '-' = ERROR, bare = INFO.",
       "npu_log_modules",
       source=f"{_NPU_DOC}alarm_message_printing/TORCH_NPU_LOGS.md"),
    _v("ASCEND_RT_VISIBLE_DEVICES", "CANN",
       "Which NPUs this process can see, as comma-separated device indices.",
       "device_list",
       source="CANN runtime; read by torch_npu (getenv in torch_npu/csrc)"),
    # ---- CANN logging -----------------------------------------------------
    _v("ASCEND_GLOBAL_LOG_LEVEL", "CANN",
       "CANN log level: 0 DEBUG, 1 INFO, 2 WARNING, 3 ERROR, 4 NULL.",
       "enum", default="3", choices=("0", "1", "2", "3", "4"),
       source=f"{_CANN_ENV}envref_07_0122); OptionsManager.cpp:269-274; {_FC} §3"),
    _v("ASCEND_SLOG_PRINT_TO_STDOUT", "CANN",
       "0 writes CANN logs to files, 1 prints them to the screen.",
       "enum", default="0", choices=("0", "1"),
       source=f"{_CANN_ENV}envref_07_0121); {_FC} §3"),
    # ---- HCCL -------------------------------------------------------------
    _v("HCCL_ALGO", "HCCL",
       "Inter-server collective algorithm, globally (level0:NA;level1:<algo>) or per operator.",
       "hccl_algo",
       source=("https://www.hiascend.com/document/detail/en/canncommercial/850/maintenref/envvar/"
               "envref_07_0079.html; operator names: https://hiascend.com/document/detail/zh/canncommercial/"
               f"800/apiref/envvar/envref_07_0079.html (CANN 8.0.0); {_FC} §3"),
       notes="Setting it disables HCCL's adaptive algorithm selection. There is no 'tree'. "
             "pairwise is for AlltoAll only. Per-operator names: " + ", ".join(HCCL_ALGO_OPS) + "."),
    _v("HCCL_BUFFSIZE", "HCCL",
       "Size of each communicator's buffer; each communicator uses 2 x BUFFSIZE (send and receive).",
       "int", default="200", minimum=1, unit="MB",
       source=f"{_CANN_ENV}envref_07_0080, 9.0.0); {_FC} §3",
       notes='Per group: ProcessGroupHCCL.Options().hccl_config={"hccl_buffer_size": N}.'),
    _v("HCCL_CONNECT_TIMEOUT", "HCCL",
       "Timeout for building links between ranks; the effective timeout is the value + 20 s.",
       "int", default="120", minimum=120, maximum=7200, unit="s",
       source=f"{_CANN_ENV}envref_07_0077 / 07_0149); {_FC} §3",
       notes="Raise it for slow cluster start-up (field case 19)."),
    _v("HCCL_EXEC_TIMEOUT", "HCCL",
       "Timeout for executing a collective, in seconds; on A2/A3 0 means never time out.",
       "hccl_exec_timeout", default="1836", minimum=0, maximum=2_147_483_647, unit="s",
       source=f"{_CANN_900_ENV}envref_07_0078.html (CANN 9.0.0); {_FC} §3",
       notes="A2/A3: [0, 2147483647]. AIV expansion mode: [0, 1091], default 1091 (0, or more than 1091, is "
             "taken as 1091). 10 ms precision (e.g. 0.05 = 50 ms) in AIV mode and on A3 in AI_CPU (and "
             "AICPU_CacheDisable) mode; whole seconds "
             "in A2's HOST/HOST_TS modes, on the Atlas 350 and on 910A/inference parts. "
             "910A: (0, 17340], rounded down to a multiple of 68."),
    _v("HCCL_INTRA_ROCE_ENABLE", "HCCL",
       "1 uses RoCE for the intra-server link instead of PCIe.",
       "enum", default="0", choices=("0", "1"),
       source=f"{_CANN_ENV}hcclenvref_07_0007, 9.0.0; envref_07_0082, 8.0.0); {_FC} §3",
       notes="Only for Atlas 300T Pro and A2 200T Box16 (A3: LLM-DataDist only); not a "
             "tuning knob for 8-card HCCS servers. Not together with HCCL_INTRA_PCIE_ENABLE=1, and "
             "not 0 while HCCL_INTRA_PCIE_ENABLE is unset."),
    _v("HCCL_INTRA_PCIE_ENABLE", "HCCL",
       "1 uses PCIe for the intra-server link (the default link).",
       "enum", choices=("0", "1"),
       source=(f"{_CANN_900_HCCL}hcclenvref_07_0006.html (CANN 9.0.0, table 1); "
               f"{_CANN_ENV}envref_07_0082, 8.0.0); {_FC} §3"),
       notes="Same narrow scope as HCCL_INTRA_ROCE_ENABLE. Not allowed: both 1; PCIE 0 with ROCE unset; "
             "PCIE unset with ROCE 0."),
    _v("HCCL_OP_EXPANSION_MODE", "HCCL",
       "Where collective operators are expanded: AI_CPU, AIV, HOST, HOST_TS, or on the CCU (CCU_MS, "
       "CCU_SCHED; Atlas 350 only) (product-dependent).",
       "enum", choices=("AI_CPU", "AIV", "HOST", "HOST_TS", "CCU_MS", "CCU_SCHED"),
       source=f"{_CANN_900_ENV}envref_07_0096.html (CANN 9.0.0); {_CANN_ENV}envref_07_0096, 8.5.0); {_FC} §3",
       notes="A3 defaults to AI_CPU; on A2, AIV covers inference features only. CCU_MS (CCU with Memory "
             "Slice relay; falls back to AI_CPU when CCU resources run out) and CCU_SCHED (CCU as scheduler, "
             "HBM to HBM) exist for the Atlas 350 only, and CANN 9.0.0 says CCU_MS is not supported yet; a "
             "product that does not support a value keeps its default. The per-group "
             'torch_npu form takes integers: hccl_config={"hccl_op_expansion_mode": 0..3}.'),
    _v("HCCL_RDMA_TIMEOUT", "HCCL",
       "Exponent of the RDMA NIC's retransmission timeout: the minimum timeout is 4.096 us x 2^value.",
       "int", default="20", minimum=5, maximum=24,
       source=f"{_CANN_900_ENV}envref_07_0091.html (CANN 9.0.0; HCCL guide hcclenvref_07_0026)",
       notes="A2/A3: [5, 20]; Atlas 350, 910A and 300I Duo: [5, 24]. Default 20 everywhere."),
    _v("HCCL_RDMA_RETRY_CNT", "HCCL",
       "How many times the RDMA NIC retransmits.",
       "int", default="7", minimum=1, maximum=7, unit="retries",
       source=f"{_CANN_900_ENV}envref_07_0092.html (CANN 9.0.0; HCCL guide hcclenvref_07_0027)"),
    _v("HCCL_NPU_SOCKET_PORT_RANGE", "HCCL",
       "NPU-side ports HCCL uses for communicators created from root-node info: ports, a-b ranges, "
       "or auto (chosen by the OS).",
       "port_list", default="16666",
       source=f"{_CANN_900_HCCL}hcclenvref_07_0021.html (CANN 9.0.0; envref_07_0144)",
       notes="Unset: port 16666. Plan at least as many ports as HCCL processes per NPU; ranges must not "
             "overlap; avoid the reserved ports 1-1023. In a multi-card job every card of the communicator "
             "must set it. Not with MC2 fused operators on A2. Recommended when several processes share one NPU."),
    # ---- torch / device selection ------------------------------------------
    _v("TORCH_DEVICE_BACKEND_AUTOLOAD", "torch",
       "1 (default) lets `import torch` load out-of-tree backends such as torch_npu; 0 disables it.",
       "enum", default="1", choices=("0", "1"),
       source=f"torch 2.13 torch/__init__.py _is_device_backend_autoload_enabled; {_FC} §7",
       notes="torch enables autoload only when the value is exactly '1'. With 0, "
             "`import torch` works without CANN; NPU use needs the CANN set_env.sh."),
    _v("CUDA_VISIBLE_DEVICES", "torch",
       "Which GPUs this process can see: comma-separated indices or GPU-/MIG- UUIDs.",
       "device_list",
       source="CUDA C Programming Guide, 'CUDA Environment Variables'"),
    # ---- NCCL -------------------------------------------------------------
    _v("NCCL_DEBUG", "NCCL",
       "Amount of NCCL debug output: VERSION, WARN, INFO, ABORT or TRACE (each includes the less "
       "verbose ones); unset prints nothing.",
       "enum", choices=NCCL_DEBUG_LEVELS, case_insensitive=True,
       source=f"{_NCCL_DOC}; {_NCCL_SRC}src/debug.cc ncclParamDebugLevel, src/include/param/parser_enum.h",
       notes="Matched in any case (warn = WARN). An unknown value is ignored without a message, so no "
             "debug output appears. INFO/TRACE are for debugging; NCCL's docs advise against keeping "
             "debug settings in production."),
    _v("NCCL_DEBUG_SUBSYS", "NCCL",
       "Which subsystems' NCCL_DEBUG=INFO lines are printed: a comma list, or '^' first to exclude.",
       "nccl_subsys", default="INIT,BOOTSTRAP,ENV",
       source=f"{_NCCL_DOC}; {_NCCL_SRC}src/debug.cc ncclParamDebugSubsys, src/include/param/parser_bitset.h",
       notes="Names match in any case. NCCL 2.30+ ignores the whole value when one name is unknown "
             "(and keeps INIT,BOOTSTRAP,ENV); older NCCL skips the unknown name."),
    _v("NCCL_SOCKET_IFNAME", "NCCL",
       "Network interfaces NCCL may use: prefixes, '^' to exclude, '=' for exact names.",
       "free", source=_NCCL_DOC),
    _v("NCCL_IB_DISABLE", "NCCL",
       "1 stops NCCL from using InfiniBand/RoCE (falls back to IP sockets).",
       "enum", default="0", choices=("0", "1"), source=_NCCL_DOC),
    _v("NCCL_P2P_DISABLE", "NCCL",
       "1 disables the peer-to-peer transport (direct GPU-to-GPU access over NVLink or PCI).",
       "enum", default="0", choices=("0", "1"),
       source=f"{_NCCL_DOC}; {_NCCL_SRC}src/graph/paths.cc (ncclGetLevel NCCL_P2P_DISABLE/NCCL_P2P_LEVEL)",
       notes="Traffic then goes through host memory or the network: a debugging switch, not a tuning knob."),
    _v("NCCL_ALGO", "NCCL",
       "Which algorithms NCCL may use: a comma list, '^' to exclude, and per-collective "
       "overrides such as 'ring;allreduce:tree'.",
       "nccl_algo",
       source=f"{_NCCL_DOC}; {_NCCL_SRC}src/graph/tuning.cc parseList, src/init.cc ncclAlgoStr",
       notes="Restricting it disables NCCL's size/topology-based selection; NCCL's docs list it under "
             "debugging. An unknown name makes communicator creation fail (ncclInvalidUsage)."),
    _v("NCCL_PROTO", "NCCL",
       "Which protocols NCCL may use (LL, LL128, Simple), same list syntax as NCCL_ALGO.",
       "nccl_proto",
       source=f"{_NCCL_DOC}; {_NCCL_SRC}src/graph/tuning.cc parseList, src/init.cc ncclProtoStr",
       notes="LL128 is enabled by default only where NCCL knows it is safe; forcing it elsewhere can "
             "corrupt data. A debugging setting."),
    _v("NCCL_BUFFSIZE", "NCCL",
       "Size of the buffer NCCL uses per connection between a pair of ranks (Simple protocol).",
       "int", default="4194304", minimum=1, unit="bytes",
       source=f"{_NCCL_DOC}; {_NCCL_SRC}src/init.cc DEFAULT_BUFFSIZE (1 << 22)",
       notes="Bytes, not MB (unlike HCCL_BUFFSIZE). NCCL's docs recommend powers of two."),
    _v("NCCL_NTHREADS", "NCCL",
       "CUDA threads per block NCCL uses for its kernels.",
       "int", minimum=64, maximum=512, unit="threads",
       source=f"{_NCCL_DOC}; {_NCCL_SRC}src/graph/tuning.cc getNthreads (multiple of 32, 64..512)",
       notes="NCCL replaces a value that is not a multiple of 32, or out of range, by its own choice "
             "(with an INFO line only). The default depends on the GPU."),
    _v("NCCL_MIN_NCHANNELS", "NCCL",
       "Lowest number of channels (parallel rings/trees, one CUDA block each) NCCL may use.",
       "int", minimum=1, maximum=NCCL_MAX_CHANNELS, unit="channels",
       source=f"{_NCCL_DOC}; {_NCCL_SRC}src/graph/connect.cc ncclMinNchannels, MAXCHANNELS=64",
       notes="Older name NCCL_MIN_NRINGS. More channels use more SMs that compute could use."),
    _v("NCCL_MAX_NCHANNELS", "NCCL",
       "Highest number of channels NCCL may use.",
       "int", minimum=1, maximum=NCCL_MAX_CHANNELS, unit="channels",
       source=f"{_NCCL_DOC}; {_NCCL_SRC}src/graph/connect.cc ncclMaxNchannels, MAXCHANNELS=64",
       notes="Older name NCCL_MAX_NRINGS. Must not be below NCCL_MIN_NCHANNELS."),
    # ---- torch's ProcessGroupNCCL ------------------------------------------
    _v("TORCH_NCCL_ASYNC_ERROR_HANDLING", "torch",
       "What ProcessGroupNCCL's watchdog does on a failed or timed-out collective: 0 nothing, "
       "1 abort communicators and tear the process down, 2 abort only, 3 tear down without "
       "cleaning up (the default).",
       "enum", default="3", choices=("0", "1", "2", "3"),
       source=f"{_TORCH_PG}: enum ErrorHandlingMode {{NoHandling=0, TearDown=1, CleanUpOnly=2, SkipCleanUp=3}}",
       notes="0 lets a hung collective block forever. The old name NCCL_ASYNC_ERROR_HANDLING is deprecated."),
    _v("TORCH_NCCL_BLOCKING_WAIT", "torch",
       "1 makes work.wait() block the CPU until the collective finishes or times out, raising an "
       "exception on timeout.",
       "torch_bool", default="0",
       source=_TORCH_PG,
       notes="For debugging: it serialises the host with every collective. The old name NCCL_BLOCKING_WAIT "
             "is deprecated."),
    # ---- threads ----------------------------------------------------------
    _v("OMP_NUM_THREADS", "threads",
       "OpenMP threads per parallel region (torch's intra-op thread pool follows it).",
       "thread_list", source=_OMP_DOC,
       notes="Per process: with several ranks or DataLoader workers per machine, "
             "threads x processes should not exceed the cores."),
    _v("MKL_NUM_THREADS", "threads",
       "Threads used by Intel MKL.",
       "int", minimum=1, source="Intel oneMKL developer guide, 'MKL_NUM_THREADS'"),
)

#: The catalog: name -> :class:`EnvVar`.
CATALOG: dict[str, EnvVar] = {entry.name: entry for entry in _ENTRIES}

#: Real names the workbook does not validate, so that they are not reported as
#: unknown: name -> (scope, source).
RECOGNISED: dict[str, tuple[str, str]] = {
    **{n: ("torch_npu", _NPU_DOC + "env_variable_list.md") for n in (
        "PER_STREAM_QUEUE", "TORCH_NPU_FALLBACK_CPU_DISABLE", "TORCH_NPU_USE_COMPATIBLE_IMPL",
        "TORCH_NPU_LEGACY_IMPL_LIST", "TORCH_ACL_INIT_CONFIG_PATH", "ACL_OP_COMPILER_CACHE_DIR",
        "ACL_OP_COMPILER_CACHE_MODE", "PYTORCH_NO_NPU_MEMORY_CACHING", "OOM_SNAPSHOT_ENABLE",
        "OOM_SNAPSHOT_PATH", "TORCH_NPUGRAPH_GC", "TORCH_HCCL_BLOCKING_WAIT",
        "TORCH_HCCL_ASYNC_ERROR_HANDLING", "TORCH_HCCL_DESYNC_DEBUG", "HCCL_EVENT_TIMEOUT",
        "P2P_HCCL_BUFFSIZE", "RANK_TABLE_FILE", "TORCH_HCCL_ZERO_COPY", "TORCH_NPU_WARNING_DISABLE",
        "TORCH_NPU_DISABLED_WARNING", "TORCH_NPU_COMPACT_ERROR_OUTPUT", "TORCH_NPU_LOGS_FILTER",
        "ACL_DEVICE_SYNC_TIMEOUT", "NPU_ASD_ENABLE", "NPU_ASD_UPPER_THRESH", "NPU_ASD_SIGMA_THRESH",
        "NPU_ASD_CONFIG", "PROF_CONFIG_PATH", "KINETO_USE_DAEMON", "TORCH_NPU_LAZY_FUSION",
        "STREAMS_PER_DEVICE", "TORCH_NPU_DEVICE_CAPABILITY", "TORCH_TRANSFER_TO_NPU",
        "TORCHINDUCTOR_NPU_BACKEND", "NPU_INDUCTOR_FALLBACK_LIST",
    )},
    # Set by CANN's set_env.sh (install paths).
    **{n: ("CANN", "exported by CANN's set_env.sh (ascend-toolkit)") for n in (
        "ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME", "ASCEND_AICPU_PATH", "ASCEND_OPP_PATH",
        "ASCEND_LATEST_INSTALL_PATH", "TOOLCHAIN_HOME",
    )},
    "ASCEND_WORK_PATH": ("CANN", "torch_npu/profiler/_profiler_path_creator.py (Constant.ASCEND_WORK_PATH)"),
    **{n: ("HCCL", _CANN_ENV + "; " + _FC + " / HCCL API reference)") for n in (
        "HCCL_WHITELIST_DISABLE", "HCCL_WHITELIST_FILE", "HCCL_IF_IP", "HCCL_SOCKET_IFNAME",
        "HCCL_SOCKET_FAMILY", "HCCL_IF_BASE_PORT", "HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_RDMA_TC",
        "HCCL_RDMA_SL", "HCCL_DETERMINISTIC", "HCCL_LOGIC_SUPERPOD_ID",
    )},
    **{n: ("NCCL", _NCCL_DOC) for n in (
        "NCCL_P2P_LEVEL", "NCCL_P2P_DIRECT_DISABLE", "NCCL_SHM_DISABLE",
        "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_CROSS_NIC",
        "NCCL_CHECK_POINTERS", "NCCL_LAUNCH_MODE", "NCCL_IB_HCA", "NCCL_IB_TIMEOUT",
        "NCCL_IB_RETRY_CNT", "NCCL_IB_GID_INDEX", "NCCL_IB_SL", "NCCL_IB_TC", "NCCL_IB_AR_THRESHOLD",
        "NCCL_IB_QPS_PER_CONNECTION", "NCCL_IB_PCI_RELAXED_ORDERING",
        "NCCL_NET", "NCCL_NET_PLUGIN", "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ",
        "NCCL_NET_SHARED_BUFFERS", "NCCL_NET_SHARED_COMMS", "NCCL_LL_BUFFSIZE", "NCCL_LL128_BUFFSIZE",
        "NCCL_LL128_NTHREADS", "NCCL_MIN_NRINGS", "NCCL_MAX_NRINGS",
        "NCCL_IGNORE_CPU_AFFINITY", "NCCL_DEBUG_FILE", "NCCL_COLLNET_ENABLE",
        "NCCL_COLLNET_NODE_THRESHOLD", "NCCL_TOPO_FILE", "NCCL_TOPO_DUMP_FILE", "NCCL_NVB_DISABLE",
        "NCCL_PXN_DISABLE", "NCCL_P2P_PXN_LEVEL", "NCCL_GRAPH_REGISTER", "NCCL_SET_STACK_SIZE",
        "NCCL_SET_THREAD_NAME", "NCCL_GRAPH_MIXING_SUPPORT", "NCCL_DMABUF_ENABLE",
        "NCCL_P2P_NET_CHUNKSIZE", "NCCL_P2P_LL_THRESHOLD", "NCCL_ALLOC_P2P_NET_LL_BUFFERS",
        "NCCL_COMM_BLOCKING",
    )},
    **{n: ("torch", "torch 2.13 Python sources (os.environ reads)") for n in (
        "TORCH_LOGS", "TORCH_COMPILE_DEBUG", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_DISTRIBUTED_DEBUG", "TORCH_SHOW_CPP_STACKTRACES", "TORCH_HOME", "TORCH_CUDA_ARCH_LIST",
        "TORCH_EXTENSIONS_DIR", "TORCH_USE_CUDA_DSA", "PYTORCH_NO_CUDA_MEMORY_CACHING",
        "PYTORCH_NVML_BASED_CUDA_CHECK", "PYTORCH_HIP_ALLOC_CONF",
    )},
    **{n: ("torch", _TORCH_PG) for n in (
        "TORCH_NCCL_AVOID_RECORD_STREAMS", "TORCH_NCCL_BCAST_UNIQUEID", "TORCH_NCCL_COORD_CHECK_MILSEC",
        "TORCH_NCCL_CUDA_EVENT_CACHE", "TORCH_NCCL_DESYNC_DEBUG", "TORCH_NCCL_ENABLE_MONITORING",
        "TORCH_NCCL_ENABLE_TIMING", "TORCH_NCCL_EXTRA_DUMP_ON_EXEC", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
        "TORCH_NCCL_HIGH_PRIORITY", "TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN", "TORCH_NCCL_NAN_CHECK",
        "TORCH_NCCL_PROPAGATE_ERROR", "TORCH_NCCL_RANKS_PER_ROOT", "TORCH_NCCL_RETHROW_CUDA_ERRORS",
        "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC",
    )},
    **{n: ("threads", _OMP_DOC) for n in (
        "OMP_SCHEDULE", "OMP_DYNAMIC", "OMP_PROC_BIND", "OMP_PLACES", "OMP_STACKSIZE",
        "OMP_WAIT_POLICY", "OMP_MAX_ACTIVE_LEVELS", "OMP_THREAD_LIMIT", "OMP_DISPLAY_ENV",
    )},
}

#: Names that appear in circulating advice but exist nowhere (fact-check §3),
#: with what to use instead.
INVENTED: dict[str, str] = {
    "HCCL_OP_BLOCK_LIST": (
        "does not exist in CANN, HCCL or torch_npu. Real near-names: HCCL_WHITELIST_DISABLE "
        "(HCCL communication whitelist) and torch_npu's NPU_FUZZY_COMPILE_BLACKLIST option "
        "(operator binary blacklist, set with torch.npu.set_option)."),
    "PT_DEBUG": (
        "does not exist in torch_npu or CANN. For debugging use ASCEND_LAUNCH_BLOCKING=1, "
        "TORCH_NPU_LOGS (e.g. memory,+dispatch), TORCH_NPU_COMPACT_ERROR_OUTPUT or "
        "ASCEND_GLOBAL_LOG_LEVEL."),
    "ASCEND_COMPRESS_LEVEL": (
        "does not exist anywhere in CANN or torch_npu; remove it."),
}


#: Real but deprecated names: old name -> (current name, source). torch still
#: reads them (``getCvarBool``/``getCvarInt`` try the later names of each list
#: first, so the current name wins when both are set) and warns "Environment
#: variable <old> is deprecated; use <new> instead".
DEPRECATED: dict[str, tuple[str, str]] = {
    "NCCL_ASYNC_ERROR_HANDLING": ("TORCH_NCCL_ASYNC_ERROR_HANDLING", _TORCH_PG),
    "NCCL_BLOCKING_WAIT": ("TORCH_NCCL_BLOCKING_WAIT", _TORCH_PG),
    "NCCL_DESYNC_DEBUG": ("TORCH_NCCL_DESYNC_DEBUG", _TORCH_PG),
    "NCCL_ENABLE_TIMING": ("TORCH_NCCL_ENABLE_TIMING", _TORCH_PG),
    "NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": ("TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK", _TORCH_PG),
}

#: Real names that current versions of their reader no longer read, so setting
#: them does nothing: name -> (when it went, what to do instead or "", source).
#: Each is reported as a warning. The NCCL versions are those in NCCL's env.rst;
#: checked against the source of all 62 v2.* tags of NVIDIA/nccl (v2.3.5-5 to
#: v2.30.7-1) and commit 5067397c: each ``NCCL_PARAM`` is absent from the version
#: named on, and none of these names is read anywhere at 5067397c.
REMOVED: dict[str, tuple[str, str, str]] = {
    "NCCL_SINGLE_RING_THRESHOLD": (
        "removed in NCCL 2.3", "",
        f"{_NCCL_ENV_RST} ('since 2.1, removed in 2.3'); in no public NVIDIA/nccl source (v2.3.5-5 on)"),
    "NCCL_LL_THRESHOLD": (
        "removed in NCCL 2.5", "NCCL 2.5+ picks algorithms and protocols itself; NCCL_PROTO (since 2.5) "
        "restricts protocols, for debugging only",
        f"{_NCCL_ENV_RST} ('since 2.1, removed in 2.5'); NCCL_PARAM(LlThreshold) is in v2.4.8-1, not in v2.5.6-1"),
    "NCCL_TREE_THRESHOLD": (
        "removed in NCCL 2.5", "NCCL 2.5+ picks algorithms itself; NCCL_ALGO (since 2.5) restricts them, "
        "for debugging only",
        f"{_NCCL_ENV_RST} ('since 2.4, removed in 2.5'); NCCL_PARAM(TreeThreshold) is in v2.4.8-1, not in v2.5.6-1"),
    "NCCL_IB_CUDA_SUPPORT": (
        "removed in NCCL 2.4.0", "use NCCL_NET_GDR_LEVEL to control GPU Direct RDMA",
        f"{_NCCL_ENV_RST} ('removed in 2.4.0, see NCCL_NET_GDR_LEVEL'); NCCL_PARAM(IbCudaSupport) is in "
        "v2.3.7-1, not in v2.4.2-1"),
    "NCCL_CHECKS_DISABLE": (
        "deprecated in NCCL 2.2.12 and not read by any NCCL whose source is public (2.3.5 and later)",
        "since NCCL 2.29.7 NCCL_CHECK_MODE controls argument checks (default DEFAULT: no checks)",
        f"{_NCCL_ENV_RST} ('since 2.0.5, deprecated in 2.2.12'); no CHECKS_DISABLE in NVIDIA/nccl src "
        "from v2.3.5-5 on"),
}

#: Real names whose *value* is commonly wrong in circulating advice, with the
#: check that catches it (each is also validated by its catalog entry).
INVENTED_VALUES: dict[str, str] = {
    "HCCL_ALGO": "'tree' (or any bare algorithm name): HCCL has no tree algorithm and the value must name "
                 "levels, e.g. level0:NA;level1:ring",
    "HCCL_OP_EXPANSION_MODE": "integers 0..3: the variable takes AI_CPU, AIV, HOST, HOST_TS, CCU_MS or CCU_SCHED; "
                              "integers belong to torch_npu's per-group hccl_config",
}


def lookup(name: str) -> EnvVar | None:
    """Return the catalog entry for ``name``, or None if the catalog does not validate it."""
    return CATALOG.get(name)


# --------------------------------------------------------------------------
# Value validators: each returns a list of (severity, message, fix)
# --------------------------------------------------------------------------

_Issue = tuple[str, str, str]


def _parse_int(text: str) -> int | None:
    text = text.strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    return None


def _parse_float(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _check_enum(var: EnvVar, value: str) -> list[_Issue]:
    text = value.strip()
    if text in var.choices or (var.case_insensitive and text.upper() in {c.upper() for c in var.choices}):
        return []
    if var.name == "NCCL_DEBUG":
        return [("error", f"not one of {var.allowed}: NCCL ignores an unknown value without a message, "
                          "so no debug output appears",
                 "set NCCL_DEBUG=WARN (or INFO for details) or unset it")]
    return [("error", f"not one of {var.allowed}", f"set {var.name} to one of {', '.join(var.choices)} or unset it")]


def _check_int(var: EnvVar, value: str) -> list[_Issue]:
    number = _parse_int(value)
    unit = f" {var.unit}" if var.unit else ""
    if number is None:
        return [("error", f"not an integer (expected {var.allowed})", f"set {var.name} to an {var.allowed}")]
    if (var.minimum is not None and number < var.minimum) or (
            var.maximum is not None and number > var.maximum):
        return [("error", f"{number}{unit} is out of range (expected {var.allowed})",
                 f"set {var.name} to an {var.allowed}")]
    return []


_SECONDS_RE = re.compile(r"[+-]?(\d+)(?:\.(\d+))?")


def _parse_seconds(text: str) -> Decimal | None:
    """A decimal number of seconds (``1836``, ``0.05``), or None; no exponent, no bare ``.5``."""
    text = text.strip()
    return Decimal(text) if _SECONDS_RE.fullmatch(text) else None


def _check_hccl_exec_timeout(var: EnvVar, value: str) -> list[_Issue]:
    """Seconds, whole or to 10 ms (CANN 9.0.0 envref_07_0078: "支持十毫秒级精度配置(例如...0.05)").

    Which products and expansion modes take the fraction is a cross-variable
    matter (see :func:`_cross_checks`); here a value is refused only when it is
    not a number, has more than two decimals, or is outside the entry's bounds.
    """
    text = value.strip()
    fix = f"set {var.name} to whole seconds (e.g. 1836) or to 10 ms steps (e.g. 0.05)"
    m = _SECONDS_RE.fullmatch(text)
    if not m:
        return [("error", f"not a number of seconds (expected {var.allowed})", fix)]
    if m.group(2) is not None and len(m.group(2)) > 2:
        return [("error", f"{text} s is finer than HCCL's 10 ms precision (at most two decimals)", fix)]
    number = Decimal(text)
    if (var.minimum is not None and number < var.minimum) or (var.maximum is not None and number > var.maximum):
        return [("error", f"{text} s is out of range (expected {var.allowed})", fix)]
    return []


def _check_port_list(var: EnvVar, value: str) -> list[_Issue]:
    """``auto`` or ``port|a-b[,port|a-b...]`` in [1, 65535] without overlaps (CANN 9.0.0 hcclenvref_07_0021)."""
    text = value.strip()
    fix = f'e.g. {var.name}="61000-61050" or "61000,61050-61100" or auto'
    if text == "auto":
        return []
    if not text:
        return [("error", f"{var.name} is set but empty", f"unset {var.name} (port 16666) or {fix}")]
    issues: list[_Issue] = []
    spans: list[tuple[int, int, str]] = []
    for entry in (e.strip() for e in text.split(",")):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", entry)
        if not m:
            issues.append(("error", f"{entry!r} is not a port or a port range a-b (or the word auto)", fix))
            continue
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if not (1 <= lo <= 65535 and 1 <= hi <= 65535):
            issues.append(("error", f"{entry!r}: ports must be in [1, 65535]", fix))
        elif lo > hi:
            issues.append(("error", f"{entry!r}: the range starts above its end", fix))
        else:
            spans.append((lo, hi, entry))
    spans.sort()
    for (lo1, hi1, e1), (lo2, hi2, e2) in zip(spans, spans[1:]):
        if lo2 <= hi1:
            issues.append(("error", f"{e1!r} and {e2!r} overlap; HCCL does not allow overlapping entries",
                           "list each port once"))
    if any(lo <= 1023 for lo, _, _ in spans):
        issues.append(("warning", "uses ports in 1-1023, which are reserved for the system",
                       "use ports above 1023, e.g. 61000-61050"))
    return issues


def _split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside square brackets."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch == sep and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def parse_alloc_conf(value: str) -> tuple[dict[str, str], list[str]]:
    """Split an allocator configuration string into key/value pairs.

    Parameters
    ----------
    value : str
        e.g. ``"max_split_size_mb:128,expandable_segments:False"`` or
        ``"roundup_power2_divisions:[256:1,512:2,>:8]"``.

    Returns
    -------
    (pairs, problems)
        ``pairs`` maps each key to its raw value string (later duplicates win);
        ``problems`` lists syntax errors as messages.
    """
    pairs: dict[str, str] = {}
    problems: list[str] = []
    value = "".join(value.split())  # torch's ConfigTokenizer ignores all whitespace
    if not value:
        return pairs, problems
    for item in _split_top_level(value):
        item = item.strip()
        if not item:
            problems.append("empty entry (a stray comma)")
            continue
        key, sep, raw = item.partition(":")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            problems.append(f"{item!r} is not of the form key:value")
            continue
        pairs[key] = raw
    return pairs, problems


def _check_alloc_value(name: str, key: str, raw: str) -> list[_Issue]:
    """Validate one allocator key's value (constants from the sources named in the catalog).

    Booleans must be exactly ``True`` or ``False``: both torch's
    ``ConfigTokenizer::toBool`` and torch_npu's parsers refuse anything else.
    """
    issues: list[_Issue] = []
    where = f"{name} {key}:{raw}"
    if key in _ALLOC_BOOL_KEYS:
        if raw not in ("True", "False"):
            issues.append(("error", f"{where}: expected exactly True or False",
                           f"write {key}:True or {key}:False (capitalised)"))
        return issues
    if key == "max_split_size_mb":
        n = _parse_int(raw)
        if n is None or n <= 20:
            issues.append(("error", f"{where}: must be an integer number of MB greater than 20",
                           f"use e.g. {key}:128, or remove it"))
    elif key == "garbage_collection_threshold":
        x = _parse_float(raw)
        if x is None or not (0.0 < x < 1.0):
            issues.append(("error", f"{where}: must be a fraction strictly between 0 and 1",
                           f"use e.g. {key}:0.8, or remove it"))
    elif key == "per_process_memory_fraction":
        x = _parse_float(raw)
        if x is None or not (0.0 <= x <= 1.0):
            issues.append(("error", f"{where}: must be a fraction in [0, 1]", f"use e.g. {key}:0.5"))
    elif key == "base_addr_aligned_kb":
        n = _parse_int(raw)
        if n is None or not (0 <= n <= 16):
            issues.append(("error", f"{where}: must be an integer in [0, 16] (KB)", f"use {key}:16 (default)"))
    elif key == "page_size":
        if raw != "1g":
            issues.append(("error", f"{where}: the only supported value is 1g", "use page_size:1g or remove it"))
    elif key == "segment_size_mb":
        n = _parse_int(raw)
        if n is None or not (20 <= n <= 512):
            issues.append(("error", f"{where}: must be an integer in [20, 512] (MB)",
                           "use large_segment_size_mb instead (segment_size_mb is deprecated)"))
        else:
            issues.append(("warning", f"{where}: segment_size_mb is deprecated",
                           "use large_segment_size_mb instead"))
    elif key == "large_segment_size_mb":
        n = _parse_int(raw)
        if n is None or n <= 10:
            issues.append(("error", f"{where}: must be an integer number of MB greater than 10",
                           f"use e.g. {key}:20 (the default) or remove it"))
    elif key in ("max_non_split_rounding_mb", "pinned_max_round_threshold_mb",
                 "pinned_max_cached_size_mb", "pinned_num_register_threads"):
        n = _parse_int(raw)
        if n is None or n < 1:
            issues.append(("error", f"{where}: must be a positive integer", f"fix or remove {key}"))
    elif key == "pinned_reserve_segment_size_mb":
        n = _parse_int(raw)
        if n is None or n < 0:
            issues.append(("error", f"{where}: must be a non-negative integer (MB)", f"fix or remove {key}"))
    elif key == "roundup_power2_divisions":
        ok = _parse_int(raw) is not None and _parse_int(raw) >= 0
        if not ok and raw.startswith("[") and raw.endswith("]"):
            entries = [e.strip() for e in raw[1:-1].split(",")]
            ok = bool(entries) and all(
                re.fullmatch(r"(\d+|>):\d+", e) for e in entries)
        if not ok:
            issues.append(("error", f"{where}: expected an integer or a list like [256:1,512:2,>:8]",
                           f"use e.g. {key}:4"))
    elif key == "backend":
        if raw not in ("native", "cudaMallocAsync"):
            issues.append(("error", f"{where}: backend must be native or cudaMallocAsync",
                           "use backend:native (default) or backend:cudaMallocAsync"))
    return issues


def _check_alloc_conf(var: EnvVar, value: str, *, npu: bool | None = None) -> list[_Issue]:
    """Validate an allocator configuration string for one of the three variables."""
    issues: list[_Issue] = []
    pairs, problems = parse_alloc_conf(value)
    for problem in problems:
        issues.append(("error", f"{var.name}={value!r}: {problem}",
                       f"write {var.name} as key:value pairs separated by commas"))
    if var.kind == "alloc_conf_npu":
        known = ALLOC_KEYS_GENERIC | ALLOC_KEYS_NPU
        known_text = "torch_npu's allocator"
    elif var.kind == "alloc_conf_cuda":
        known = ALLOC_KEYS_GENERIC | ALLOC_KEYS_CUDA
        known_text = "PyTorch's CUDA allocator"
    else:
        known = ALLOC_KEYS_GENERIC | ALLOC_KEYS_CUDA | ALLOC_KEYS_NPU
        known_text = "PyTorch or torch_npu"
    for key, raw in pairs.items():
        if var.kind == "alloc_conf_npu" and key in ALLOC_KEYS_CUDA - known:
            issues.append(("error", f"{var.name}: {key} is a CUDA-only key; torch_npu refuses it "
                                    "('torch_npu not support key')", f"remove {key}"))
            continue
        if var.kind == "alloc_conf_cuda" and key in ALLOC_KEYS_NPU - known:
            issues.append(("error", f"{var.name}: {key} is a torch_npu key that PyTorch's CUDA allocator "
                                    "does not recognise", f"move {key} to PYTORCH_NPU_ALLOC_CONF or remove it"))
            continue
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(close)}?" if close else f"known keys: {', '.join(sorted(known))}"
            issues.append(("error", f"{var.name}: unknown key {key!r} for {known_text} (torch_npu and "
                                    "PyTorch refuse to start with an unrecognised key)", hint))
            continue
        issues.extend(_check_alloc_value(var.name, key, raw))
    # torch_npu's constraint (NPUAllocatorConfig.cpp): expandable segments exclude the two others.
    expandable = pairs.get("expandable_segments") == "True"
    splitters = [k for k in ("max_split_size_mb", "garbage_collection_threshold") if k in pairs]
    if expandable and splitters and var.kind != "alloc_conf_cuda":
        severity = "error" if (var.kind == "alloc_conf_npu" or npu) else "warning"
        issues.append((severity,
                       f"{var.name}: expandable_segments:True together with {' and '.join(splitters)} "
                       "is refused by torch_npu ('cannot be enabled with expandable_segments')",
                       f"set expandable_segments:False, or remove {' and '.join(splitters)}"))
    if "max_split_size_mb" in pairs and "large_segment_size_mb" in pairs:
        ms, ls = _parse_int(pairs["max_split_size_mb"]), _parse_int(pairs["large_segment_size_mb"])
        if ms is not None and ls is not None and ms < ls and var.kind != "alloc_conf_cuda":
            issues.append(("error", f"{var.name}: max_split_size_mb ({ms}) must be >= large_segment_size_mb ({ls})",
                           "raise max_split_size_mb or lower large_segment_size_mb"))
    if pairs.get("pinned_mem_register") == "True" and pairs.get("pin_memory_expandable_segments") == "True":
        issues.append(("warning", f"{var.name}: pinned_mem_register is switched off by torch_npu when "
                                  "pin_memory_expandable_segments is True",
                       "keep only one of pinned_mem_register and pin_memory_expandable_segments"))
    return issues


def _check_levels(spec: str, op: str | None) -> list[_Issue]:
    """Validate one ``level0:NA;level1:<algo>[;level2:<algo>]`` block of HCCL_ALGO."""
    issues: list[_Issue] = []
    where = f"in the {op} block" if op else "HCCL_ALGO"
    levels: dict[str, str] = {}
    for part in spec.split(";"):
        part = part.strip()
        if not part:
            continue
        level, sep, algo = part.partition(":")
        level, algo = level.strip(), algo.strip()
        if not sep or not re.fullmatch(r"level[0-2]", level) or not algo:
            issues.append(("error", f"{where}: {part!r} is not of the form levelN:<algo> (N = 0, 1, 2)",
                           _HCCL_ALGO_FIX))
            continue
        levels[level] = algo
    if issues:
        return issues
    if "level0" in levels and levels["level0"] != "NA":
        issues.append(("warning", f"{where}: level0:{levels['level0']} - current CANN docs accept only NA "
                                  "for level0 (intra-server)", "use level0:NA"))
    if "level1" not in levels:
        issues.append(("warning", f"{where}: no level1 algorithm given, so the setting chooses nothing",
                       _HCCL_ALGO_FIX))
    for level in ("level1", "level2"):
        algo = levels.get(level)
        if algo is None:
            continue
        if algo.lower() == "tree":
            issues.append(("error", f"{where}: {level}:{algo} - HCCL has no 'tree' algorithm", _HCCL_ALGO_FIX))
        elif algo not in HCCL_ALGOS:
            issues.append(("warning", f"{where}: {level}:{algo} is not a documented algorithm "
                                      f"({', '.join(HCCL_ALGOS)})", _HCCL_ALGO_FIX))
        elif algo == "pairwise" and op != "alltoall":
            issues.append(("warning", f"{where}: pairwise applies to AlltoAll only",
                           'use it per operator: HCCL_ALGO="alltoall=level0:NA;level1:pairwise"'))
    return issues


def _check_hccl_algo(var: EnvVar, value: str) -> list[_Issue]:
    text = value.strip()
    if not text:
        return [("error", "HCCL_ALGO is set but empty", "unset HCCL_ALGO to keep adaptive selection")]
    if "level" not in text:
        word = text.split(";")[0]
        reason = "HCCL has no 'tree' algorithm, and " if "tree" in text.lower() else ""
        return [("error", f"{reason}the value must name levels "
                          f"(e.g. level0:NA;level1:ring), not a bare algorithm {word!r}", _HCCL_ALGO_FIX)]
    issues: list[_Issue] = []
    if "=" in text:
        for block in text.split("/"):
            block = block.strip()
            if not block:
                issues.append(("error", f"HCCL_ALGO={value!r}: empty operator block (stray '/')",
                               'separate operators with single "/": allreduce=...;.../alltoall=...'))
                continue
            op, sep, spec = block.partition("=")
            op = op.strip()
            if not sep:
                issues.append(("error", f"HCCL_ALGO: {block!r} lacks '<op>=' in the per-operator form",
                               'write e.g. "allreduce=level0:NA;level1:ring/alltoall=level0:NA;level1:pairwise"'))
                continue
            if op not in HCCL_ALGO_OPS:
                issues.append(("warning", f"HCCL_ALGO: operator {op!r} is not one of {', '.join(HCCL_ALGO_OPS)}",
                               "check the operator name"))
            issues.extend(_check_levels(spec, op))
    else:
        issues.extend(_check_levels(text, None))
    return issues


def _check_cpu_affinity(var: EnvVar, value: str) -> list[_Issue]:
    fix = "e.g. CPU_AFFINITY_CONF=2 or CPU_AFFINITY_CONF=1,npu0:0-15,npu1:16-31"
    parts = [p.strip() for p in value.split(",")]
    if parts[0] not in ("0", "1", "2"):
        return [("error", f"CPU_AFFINITY_CONF={value!r}: the first field is the mode and must be 0, 1 or 2", fix)]
    issues: list[_Issue] = []
    for part in parts[1:]:
        m_force = re.fullmatch(r"(force|npu_affine):(\d+)", part)
        m_npu = re.fullmatch(r"npu(\d+):(\d+)-(\d+)", part)
        if m_force:
            if m_force.group(2) not in ("0", "1"):
                issues.append(("error", f"CPU_AFFINITY_CONF: {part!r} - {m_force.group(1)} takes 0 or 1", fix))
        elif m_npu:
            lo, hi = int(m_npu.group(2)), int(m_npu.group(3))
            if lo > hi:
                issues.append(("error", f"CPU_AFFINITY_CONF: {part!r} - range start is above its end", fix))
        else:
            issues.append(("error", f"CPU_AFFINITY_CONF: {part!r} is not force:0|1, npu<N>:<a>-<b> or npu_affine:0|1", fix))
    if parts[0] == "0" and len(parts) > 1:
        issues.append(("warning", "CPU_AFFINITY_CONF: mode 0 turns binding off, so the options after it do nothing",
                       "use mode 2 (fine-grained, recommended) or 1"))
    return issues


def _check_device_list(var: EnvVar, value: str) -> list[_Issue]:
    text = value.strip()
    if not text:
        return [("warning", f"{var.name} is set but empty: no device is visible to this process",
                 f"unset {var.name} or list device indices, e.g. 0,1")]
    entries = [e.strip() for e in text.split(",")]
    issues: list[_Issue] = []
    for entry in entries:
        if entry.isdigit():
            continue
        if var.name == "CUDA_VISIBLE_DEVICES" and (entry.startswith("GPU-") or entry.startswith("MIG-")):
            continue
        issues.append(("error", f"{var.name}={value!r}: {entry!r} is not a device index",
                       f"list device indices separated by commas, e.g. {var.name}=0,1"))
    if len(set(entries)) != len(entries):
        issues.append(("warning", f"{var.name}={value!r} lists a device twice", "list each device once"))
    return issues


def _check_thread_list(var: EnvVar, value: str) -> list[_Issue]:
    entries = [e.strip() for e in value.split(",")]
    numbers = [_parse_int(e) for e in entries]
    if any(n is None or n < 1 for n in numbers):
        return [("error", f"{var.name}={value!r} is not a positive integer",
                 f"set {var.name} to the number of threads per process, e.g. 4")]
    return []


def _check_npu_log_modules(var: EnvVar, value: str) -> list[_Issue]:
    issues: list[_Issue] = []
    for entry in (e.strip() for e in value.split(",")):
        module = entry.lstrip("+-")
        if module not in NPU_LOG_MODULES:
            issues.append(("warning", f"TORCH_NPU_LOGS: module {module!r} is not one of "
                                      f"{', '.join(NPU_LOG_MODULES)}", "check the module name"))
    return issues


def _check_nccl_list(var: EnvVar, value: str) -> list[_Issue]:
    """Mirror NCCL's ``parseList`` (src/graph/tuning.cc): ``[^]e,...[;func:[^]e,...]``, names case-insensitive.

    NCCL fails communicator creation (ncclInvalidUsage) on an unknown element,
    on a prefix-less entry after the first, and on an unknown function prefix.
    """
    elems = NCCL_ALGOS if var.kind == "nccl_algo" else NCCL_PROTOS
    lower = {e.lower(): e for e in elems}
    funcs = {f.lower() for f in NCCL_FUNCS}
    example = "Ring,Tree" if var.kind == "nccl_algo" else "^LL128"
    fix = (f"use names from {', '.join(elems)}, e.g. {var.name}={example} or "
           f"{var.name}=\"{'ring;allreduce:tree' if var.kind == 'nccl_algo' else 'LL,Simple;allreduce:^LL'}\"; "
           f"or unset {var.name} to let NCCL choose")
    text = value.strip()
    if not text:
        return [("error", f"{var.name} is set but empty", f"unset {var.name} to let NCCL choose")]
    issues: list[_Issue] = []
    for i, entry in enumerate(text.split(";")):
        entry = entry.strip()
        if not entry:
            continue
        prefix, sep, elem_list = entry.partition(":")
        if not sep:
            prefix, elem_list = None, entry
            if i > 0:
                issues.append(("error", f"{var.name}={value!r}: entry {entry!r} needs a '<collective>:' prefix "
                                        "(only the first entry may omit it)", fix))
                continue
        elif prefix.strip().lower() not in funcs:
            issues.append(("error", f"{var.name}={value!r}: {prefix.strip()!r} is not a collective "
                                    f"({', '.join(NCCL_FUNCS)})", fix))
            continue
        elem_list = elem_list.strip()
        if elem_list.startswith("^"):
            elem_list = elem_list[1:]
        for elem in (e.strip() for e in elem_list.split(",")):
            if elem.lower() not in lower:
                hint = ""
                if var.kind == "nccl_algo" and elem.lower() in ("nhr", "h-d_r", "pipeline", "pairwise", "nb", "ahc"):
                    hint = " (that is an HCCL algorithm: set it in HCCL_ALGO on Ascend)"
                issues.append(("error", f"{var.name}={value!r}: {elem!r} is not one of {', '.join(elems)}{hint}",
                               fix))
    return issues


def _check_nccl_subsys(var: EnvVar, value: str) -> list[_Issue]:
    """Mirror NCCL's bitset parser (``src/include/param/parser_bitset.h``, commit 5067397c).

    One optional leading ``^`` inverts the whole list; names are comma-separated,
    trimmed and matched ignoring case; empty items are skipped. NCCL 2.30+ rejects
    the whole value when a name is unknown and keeps its default INIT,BOOTSTRAP,ENV
    (``ncclParam::loadValue``); NCCL <= 2.29 (``src/debug.cc`` strcasecmp chain)
    skips just that name.
    """
    text = value.strip()
    body = text[1:] if text.startswith("^") else text
    names = {n.upper(): n for n in NCCL_DEBUG_SUBSYSTEMS}
    unknown = [item.strip() for item in body.split(",") if item.strip() and item.strip().upper() not in names]
    if not unknown:
        return []
    hint = " ('^' may only start the whole list: ^INIT,COLL excludes both)" if any(
        u.startswith("^") for u in unknown) else ""
    return [("error", f"unknown subsystem {', '.join(repr(u) for u in unknown)}{hint}: NCCL 2.30+ then "
                      f"ignores the whole value and keeps INIT,BOOTSTRAP,ENV",
             f"use names from {', '.join(NCCL_DEBUG_SUBSYSTEMS)}, e.g. NCCL_DEBUG_SUBSYS=INIT,COLL or ^PROXY")]


def _check_torch_bool(var: EnvVar, value: str) -> list[_Issue]:
    if value.strip().lower() in _TORCH_TRUE + _TORCH_FALSE:
        return []
    return [("error", f"{var.name}={value!r} is not a boolean torch accepts: torch stops with "
                      f"'Invalid value for environment variable: {var.name}'",
             f"set {var.name}=1 or {var.name}=0")]


_VALIDATORS: dict[str, Callable[..., list[_Issue]]] = {
    "enum": _check_enum,
    "int": _check_int,
    "alloc_conf_npu": _check_alloc_conf,
    "alloc_conf_cuda": _check_alloc_conf,
    "alloc_conf_any": _check_alloc_conf,
    "hccl_algo": _check_hccl_algo,
    "hccl_exec_timeout": _check_hccl_exec_timeout,
    "port_list": _check_port_list,
    "cpu_affinity": _check_cpu_affinity,
    "device_list": _check_device_list,
    "thread_list": _check_thread_list,
    "npu_log_modules": _check_npu_log_modules,
    "nccl_algo": _check_nccl_list,
    "nccl_proto": _check_nccl_list,
    "nccl_subsys": _check_nccl_subsys,
    "torch_bool": _check_torch_bool,
    "free": lambda var, value: [],
}


def _advice(var: EnvVar, value: str) -> list[_Issue]:
    """Warnings about valid values that are known to cost performance or do nothing."""
    v = value.strip()
    name = var.name
    if name == "TASK_QUEUE_ENABLE" and v == "0":
        return [("warning", "TASK_QUEUE_ENABLE=0 turns the operator-dispatch queue off",
                 "use TASK_QUEUE_ENABLE=2 (recommended by Ascend) or 1 (default)")]
    if name == "ASCEND_LAUNCH_BLOCKING" and v == "1":
        return [("warning", "ASCEND_LAUNCH_BLOCKING=1 runs every operator synchronously (debugging only) "
                            "and disables the task queue", "unset ASCEND_LAUNCH_BLOCKING when not debugging")]
    if name == "MULTI_STREAM_MEMORY_REUSE" and v == "2":
        return [("warning", "MULTI_STREAM_MEMORY_REUSE=2 holds strong references and may extend tensor "
                            "lifetimes; the torch_npu docs do not recommend it", "use 1 (default) or 3")]
    if name == "TORCH_NCCL_ASYNC_ERROR_HANDLING" and v == "0":
        return [("warning", "TORCH_NCCL_ASYNC_ERROR_HANDLING=0 turns the watchdog's error handling off: a failed "
                            "or hung collective then blocks the job until something else kills it",
                 "unset it (default 3) or set 1 to tear the process down on errors")]
    if name == "TORCH_NCCL_BLOCKING_WAIT" and v.lower() in _TORCH_TRUE:
        return [("warning", f"TORCH_NCCL_BLOCKING_WAIT={v} makes the host wait for every collective "
                            "(debugging only; it removes communication/computation overlap)",
                 "unset TORCH_NCCL_BLOCKING_WAIT when not debugging")]
    if name == "NCCL_NTHREADS":
        n = _parse_int(v)
        if n is not None and n % 32:
            return [("error", f"NCCL_NTHREADS={n} is not a multiple of 32 (the warp size): NCCL ignores it "
                              "and uses its maximum instead", "use 64, 128, 256 or 512, or unset it")]
    if name == "NCCL_BUFFSIZE":
        n = _parse_int(v)
        if n is not None and n & (n - 1):
            return [("warning", "not a power of two (NCCL's docs recommend one; the unit is bytes)",
                     "use e.g. 4194304 (4 MiB, the default) or 8388608")]
        if n is not None and n < 65536:
            return [("warning", f"{n} bytes is very small: the unit is bytes, not MB "
                                "(HCCL_BUFFSIZE is the one in MB)", "use e.g. 4194304 (4 MiB, the default)")]
    if name == "HCCL_OP_EXPANSION_MODE" and v == "CCU_MS":
        return [("warning", "CCU_MS is documented for the Atlas 350 only, and CANN 9.0.0 says the current version "
                            "does not support it yet (other products keep their default mode)",
                 "use CCU_SCHED or AI_CPU on the Atlas 350, or unset it to keep the adaptive choice")]
    if name == "HCCL_RDMA_TIMEOUT":
        n = _parse_int(v)
        if n is not None and n > 20:
            return [("warning", f"{n} is above 20, the maximum on Atlas A2/A3 ([5, 20]); only the Atlas 350, "
                                "910A and 300I Duo accept up to 24", "use at most 20 on A2/A3 (20 is the default)")]
    if name in ("NCCL_ALGO", "NCCL_PROTO"):
        return [("warning", f"{name}={v} overrides NCCL's own per-size choice; NCCL's docs list it with the "
                            "debugging settings that should not be kept in production",
                 f"measure with and without it, and unset {name} unless it is faster")]
    return []


#: Short remarks attached to "ok" findings: (name, value or None for any value) -> text.
_OK_NOTES: dict[tuple[str, str | None], str] = {
    ("TASK_QUEUE_ENABLE", "1"): "2 is recommended by Ascend (binary kernels; may raise peak memory)",
    ("TASK_QUEUE_ENABLE", "2"): "may raise peak NPU memory",
    ("HCCL_ALGO", None): "this disables HCCL's adaptive algorithm selection",
    ("HCCL_INTRA_ROCE_ENABLE", "1"): "only for Atlas 300T Pro and A2 200T Box16 (A3: LLM-DataDist only)",
    ("HCCL_EXEC_TIMEOUT", "0"): "on A2/A3, 0 means collectives never time out (in AIV mode it means 1091 s)",
    ("HCCL_OP_EXPANSION_MODE", "CCU_SCHED"): "Atlas 350 only; other products keep their default mode",
    ("HCCL_NPU_SOCKET_PORT_RANGE", None): "every card of the communicator must set it (root-info communicators)",
    ("TORCH_DEVICE_BACKEND_AUTOLOAD", "0"): "torch_npu is not loaded by `import torch`; import it explicitly",
    ("CPU_AFFINITY_CONF", "0"): "core binding is off; 2 (fine-grained) is recommended",
    ("NCCL_DEBUG", "INFO"): "debug output; remove it for production runs",
    ("NCCL_DEBUG", "TRACE"): "debug output; remove it for production runs",
    ("NCCL_P2P_DISABLE", "1"): "GPU-to-GPU traffic then goes through host memory or the network",
    ("NCCL_IB_DISABLE", "1"): "inter-node traffic then uses IP sockets",
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"): "the default since torch 2.2",
}


#: Where HCCL_EXEC_TIMEOUT's 10 ms precision applies (CANN 9.0.0 envref_07_0078).
_EXEC_TIMEOUT_FRACTION_NOTE = ("fractions of a second count only in AIV mode and on A3 in AI_CPU mode; "
                               "A2's HOST/HOST_TS modes, the Atlas 350 and 910A/inference parts take whole seconds")


def validate_value(name: str, value: str, *, npu: bool | None = None) -> list[Finding]:
    """Check one variable's value against the catalog.

    Parameters
    ----------
    name : str
        Variable name; must be in :data:`CATALOG`.
    value : str
        The value as set in the environment.
    npu : bool or None
        Whether torch_npu is in play; changes how PYTORCH_ALLOC_CONF is judged
        (None: unknown, judged leniently).

    Returns
    -------
    list of Finding
        One "ok" finding when the value is valid and unremarkable, otherwise
        one finding per problem.

    Raises
    ------
    KeyError
        If ``name`` is not in the catalog.
    """
    var = CATALOG[name]
    validator = _VALIDATORS[var.kind]
    if var.kind.startswith("alloc_conf"):
        issues = validator(var, value, npu=npu)
    else:
        issues = validator(var, value)
    # Specific fixes for common mistakes.
    if name == "HCCL_OP_EXPANSION_MODE" and value.strip() in ("0", "1", "2", "3"):
        issues = [("error", f"HCCL_OP_EXPANSION_MODE={value!r}: the environment variable takes strings "
                            "(AI_CPU, AIV, HOST, HOST_TS, CCU_MS, CCU_SCHED); integers 0..3 belong to torch_npu's "
                            'hccl_config={"hccl_op_expansion_mode": N}',
                   "set HCCL_OP_EXPANSION_MODE=AI_CPU (or AIV, HOST, HOST_TS, CCU_SCHED)")]
    if name == "ACLNN_CACHE_LIMIT" and value.strip() == "0":
        issues = [("warning", "ACLNN_CACHE_LIMIT=0 (cache off) is accepted only by some CANN 9.1 betas; "
                              "the documented range is [1, 10000000]", "set a value >= 1 (default 10000)")]
    if name == "TORCH_DEVICE_BACKEND_AUTOLOAD" and issues:
        issues = [("error", f"TORCH_DEVICE_BACKEND_AUTOLOAD={value!r}: torch autoloads backends only when the "
                            "value is exactly '1', so this value disables autoloading",
                   "set TORCH_DEVICE_BACKEND_AUTOLOAD=1 to autoload torch_npu, or 0 to disable it")]
    if not issues:
        issues = _advice(var, value)
    if not issues:
        key = value.strip().upper() if var.case_insensitive else value.strip()
        note = _OK_NOTES.get((name, key), _OK_NOTES.get((name, None), ""))
        if name == "HCCL_EXEC_TIMEOUT" and "." in key:
            note = _EXEC_TIMEOUT_FRACTION_NOTE
        return [Finding(name, value, "ok", "valid" + (f"; {note}" if note else ""), "")]
    return [Finding(name, value, sev, _without_subject(name, value, msg), fix) for sev, msg, fix in issues]


def _without_subject(name: str, value: str, message: str) -> str:
    """Drop a leading ``NAME=value`` / ``NAME:`` / ``NAME is`` from ``message``.

    :func:`format_finding` prints ``NAME=value:`` before the message and the
    findings table has name and value columns, so the message need not repeat them.
    """
    values = sorted({repr(value), repr(value.strip()), value, value.strip()} - {""}, key=len, reverse=True)
    alternatives = "|".join(re.escape(v) for v in values)
    pattern = rf"{re.escape(name)}(?:=(?:{alternatives}))?" if alternatives else re.escape(name)
    m = re.match(rf"{pattern}(?::\s+|\s+-\s+|\s+(?=[a-z(]))", message)
    if not m:
        return message
    rest = message[m.end():]
    return rest[3:] if rest.startswith("is ") else rest


def _watched(name: str, prefixes: Iterable[str]) -> bool:
    return any(name.startswith(p) for p in prefixes)


def _npu_in_play(environ: Mapping[str, str]) -> bool:
    """Guess whether torch_npu is in use from the environment alone."""
    return "PYTORCH_NPU_ALLOC_CONF" in environ or any(
        k.startswith(("ASCEND_", "HCCL_")) for k in environ)


def check_env(
    environ: Mapping[str, str],
    *,
    prefixes: Iterable[str] = WATCHED_PREFIXES,
    npu: bool | None = None,
    usable_cores: int | None = None,
) -> list[Finding]:
    """Check an environment against the catalog.

    Parameters
    ----------
    environ : mapping of str to str
        The environment to check; pass ``os.environ`` for the current process.
        It is only read.
    prefixes : iterable of str
        Name prefixes to watch: a set variable with one of these prefixes that
        is in none of :data:`CATALOG`, :data:`RECOGNISED`, :data:`INVENTED`,
        :data:`DEPRECATED` and :data:`REMOVED` is reported as a warning with
        spelling suggestions (difflib).
    npu : bool or None
        Whether torch_npu is in play. None (default) infers it: true when
        PYTORCH_NPU_ALLOC_CONF or any ASCEND_* / HCCL_* variable is set.
    usable_cores : int or None
        Cores this process may use (e.g. ``system_info()["usable_cores"]``);
        when given, OMP_NUM_THREADS above it is reported.

    Returns
    -------
    list of Finding
        Per-variable findings in name order, then cross-variable findings.
        An empty environment gives an empty list.
    """
    prefixes = tuple(prefixes)
    if npu is None:
        npu = _npu_in_play(environ)
    findings: list[Finding] = []
    candidates = sorted(set(CATALOG) | set(RECOGNISED) | set(DEPRECATED) | set(REMOVED))

    for name in sorted(environ):
        value = environ[name]
        if name in INVENTED:
            findings.append(Finding(name, value, "error", INVENTED[name], f"unset {name}"))
        elif name in CATALOG:
            findings.extend(validate_value(name, value, npu=npu))
        elif name in DEPRECATED:
            new, _ = DEPRECATED[name]
            problems = [f for f in validate_value(new, value, npu=npu) if f.severity == "error"] \
                if new in CATALOG else []
            extra = f"; and the value is wrong: {problems[0].message}" if problems else ""
            findings.append(Finding(name, value, "error" if problems else "warning",
                                    f"deprecated; torch reads it but warns and prefers {new}{extra}",
                                    f"rename it: export {new}={value}" if not problems else problems[0].fix))
        elif name in REMOVED:
            when, instead, _ = REMOVED[name]
            reader = name.split("_", 1)[0]
            findings.append(Finding(name, value, "warning",
                                    f"setting it does nothing in current {reader}: {when}",
                                    f"unset {name}" + (f"; {instead}" if instead else "")))
        elif name in RECOGNISED:
            continue  # real, but not validated: nothing to say
        elif _watched(name, prefixes):
            close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.75)
            fix = f"did you mean {', '.join(close)}?" if close else "check the spelling against the vendor docs"
            findings.append(Finding(name, value, "warning",
                                    "not in the workbook's catalog (unknown or unchecked name); check "
                                    "the spelling", fix))

    cross = _cross_checks(environ, npu=npu, usable_cores=usable_cores)
    flagged = {part for f in cross for part in f.name.split("+")}
    # A variable that a cross-check flags should not also be reported as plainly "ok".
    findings = [f for f in findings if not (f.severity == "ok" and f.name in flagged)]
    findings.extend(cross)
    return findings


def _cross_checks(environ: Mapping[str, str], *, npu: bool, usable_cores: int | None) -> list[Finding]:
    """Constraints that involve more than one variable."""
    out: list[Finding] = []
    get = environ.get

    if "PYTORCH_NPU_ALLOC_CONF" in environ and "PYTORCH_ALLOC_CONF" in environ:
        value = f"PYTORCH_NPU_ALLOC_CONF={get('PYTORCH_NPU_ALLOC_CONF')}; PYTORCH_ALLOC_CONF={get('PYTORCH_ALLOC_CONF')}"
        if npu:
            out.append(Finding("PYTORCH_NPU_ALLOC_CONF+PYTORCH_ALLOC_CONF", value, "error",
                               "both allocator variables are set: torch_npu (26.2.0+ with PyTorch >= 2.10) "
                               "stops with 'Both PYTORCH_NPU_ALLOC_CONF and PYTORCH_ALLOC_CONF have been set'",
                               "keep only one of them (torch_npu's docs prefer PYTORCH_ALLOC_CONF)"))
        else:
            out.append(Finding("PYTORCH_NPU_ALLOC_CONF+PYTORCH_ALLOC_CONF", value, "warning",
                               "both allocator variables are set; without torch_npu PYTORCH_NPU_ALLOC_CONF "
                               "has no effect, and with torch_npu the pair is an error",
                               "keep only one of them"))
    if "PYTORCH_CUDA_ALLOC_CONF" in environ and "PYTORCH_ALLOC_CONF" in environ:
        out.append(Finding("PYTORCH_CUDA_ALLOC_CONF+PYTORCH_ALLOC_CONF",
                           f"PYTORCH_CUDA_ALLOC_CONF={get('PYTORCH_CUDA_ALLOC_CONF')}; "
                           f"PYTORCH_ALLOC_CONF={get('PYTORCH_ALLOC_CONF')}", "warning",
                           "both set: torch 2.13's CUDA allocator reads PYTORCH_CUDA_ALLOC_CONF first and "
                           "then ignores PYTORCH_ALLOC_CONF (c10/cuda/CUDAAllocatorConfig.h)",
                           "keep only PYTORCH_ALLOC_CONF (the current name)"))
    roce, pcie = get("HCCL_INTRA_ROCE_ENABLE", "").strip(), get("HCCL_INTRA_PCIE_ENABLE", "").strip()
    if roce == "1" and pcie == "1":
        out.append(Finding("HCCL_INTRA_ROCE_ENABLE+HCCL_INTRA_PCIE_ENABLE",
                           "HCCL_INTRA_ROCE_ENABLE=1; HCCL_INTRA_PCIE_ENABLE=1", "error",
                           "both intra-server links are set to 1, which HCCL does not allow",
                           "set only one of them to 1 (PCIe is the default)"))
    # CANN 9.0.0 hcclenvref_07_0006 table 1: an explicit 0 needs the other variable set (unset = empty here).
    elif pcie == "0" and not roce:
        out.append(Finding("HCCL_INTRA_ROCE_ENABLE+HCCL_INTRA_PCIE_ENABLE",
                           "HCCL_INTRA_ROCE_ENABLE=(unset); HCCL_INTRA_PCIE_ENABLE=0", "error",
                           "HCCL_INTRA_PCIE_ENABLE=0 with HCCL_INTRA_ROCE_ENABLE unset is a combination HCCL "
                           "does not support (CANN 9.0.0)",
                           "for RoCE also set HCCL_INTRA_ROCE_ENABLE=1; for PCIe (the default) unset "
                           "HCCL_INTRA_PCIE_ENABLE"))
    elif roce == "0" and not pcie:
        out.append(Finding("HCCL_INTRA_ROCE_ENABLE+HCCL_INTRA_PCIE_ENABLE",
                           "HCCL_INTRA_ROCE_ENABLE=0; HCCL_INTRA_PCIE_ENABLE=(unset)", "error",
                           "HCCL_INTRA_ROCE_ENABLE=0 with HCCL_INTRA_PCIE_ENABLE unset is a combination HCCL "
                           "does not support (CANN 9.0.0)",
                           "unset HCCL_INTRA_ROCE_ENABLE (PCIe is the default), or also set "
                           "HCCL_INTRA_PCIE_ENABLE=1"))
    if get("INF_NAN_MODE_ENABLE", "").strip() == "0" and get("INF_NAN_MODE_FORCE_DISABLE", "").strip() != "1":
        out.append(Finding("INF_NAN_MODE_ENABLE+INF_NAN_MODE_FORCE_DISABLE",
                           f"INF_NAN_MODE_ENABLE=0; INF_NAN_MODE_FORCE_DISABLE={get('INF_NAN_MODE_FORCE_DISABLE', '(unset)')}",
                           "warning",
                           "INF_NAN_MODE_ENABLE=0 is intercepted on Atlas A2/A3 unless INF_NAN_MODE_FORCE_DISABLE=1",
                           "on A2/A3 also set INF_NAN_MODE_FORCE_DISABLE=1 (Inf/NaN then become max/0), "
                           "or keep INF_NAN mode (unset INF_NAN_MODE_ENABLE)"))
    if get("ASCEND_LAUNCH_BLOCKING", "").strip() == "1" and "TASK_QUEUE_ENABLE" in environ:
        out.append(Finding("ASCEND_LAUNCH_BLOCKING+TASK_QUEUE_ENABLE",
                           f"ASCEND_LAUNCH_BLOCKING=1; TASK_QUEUE_ENABLE={get('TASK_QUEUE_ENABLE')}", "warning",
                           "TASK_QUEUE_ENABLE has no effect while ASCEND_LAUNCH_BLOCKING=1",
                           "unset ASCEND_LAUNCH_BLOCKING when not debugging"))
    exec_text = get("HCCL_EXEC_TIMEOUT", "").strip()
    exec_timeout = _parse_seconds(exec_text)
    mode = get("HCCL_OP_EXPANSION_MODE", "").strip()
    pair = f"HCCL_EXEC_TIMEOUT={exec_text}; HCCL_OP_EXPANSION_MODE={mode}"
    if mode == "AIV" and exec_timeout is not None and exec_timeout > 1091:
        out.append(Finding("HCCL_EXEC_TIMEOUT+HCCL_OP_EXPANSION_MODE", pair, "warning",
                           "in AIV expansion mode HCCL_EXEC_TIMEOUT is limited to [0, 1091] s "
                           "(larger values are taken as 1091)",
                           "set HCCL_EXEC_TIMEOUT to at most 1091"))
    elif mode == "AIV" and exec_timeout == 0:
        out.append(Finding("HCCL_EXEC_TIMEOUT+HCCL_OP_EXPANSION_MODE", pair, "warning",
                           "in AIV expansion mode 0 does not mean 'never time out': HCCL takes it as 1091 s",
                           "set the timeout you want, at most 1091 s"))
    elif (mode in ("HOST", "HOST_TS", "CCU_MS", "CCU_SCHED") and exec_timeout is not None
          and exec_timeout != exec_timeout.to_integral_value()):
        out.append(Finding("HCCL_EXEC_TIMEOUT+HCCL_OP_EXPANSION_MODE", pair, "warning",
                           f"in {mode} mode HCCL takes whole seconds: CANN 9.0.0 (envref_07_0078) documents 10 ms "
                           "precision only for AIV mode and A3's AI_CPU mode",
                           "set HCCL_EXEC_TIMEOUT to a whole number of seconds"))
    lo, hi = _parse_int(get("NCCL_MIN_NCHANNELS", "")), _parse_int(get("NCCL_MAX_NCHANNELS", ""))
    if lo is not None and hi is not None and lo > hi:
        out.append(Finding("NCCL_MIN_NCHANNELS+NCCL_MAX_NCHANNELS",
                           f"NCCL_MIN_NCHANNELS={lo}; NCCL_MAX_NCHANNELS={hi}", "error",
                           f"the minimum channel count ({lo}) is above the maximum ({hi})",
                           "set NCCL_MIN_NCHANNELS <= NCCL_MAX_NCHANNELS, or unset both"))
    for old, (new, _) in DEPRECATED.items():
        if old in environ and new in environ and environ[old].strip() != environ[new].strip():
            out.append(Finding(f"{old}+{new}", f"{old}={environ[old]}; {new}={environ[new]}", "warning",
                               f"both names are set with different values; torch uses {new}={environ[new]!r} "
                               f"and ignores {old}", f"unset {old}"))
    omp = _parse_int(get("OMP_NUM_THREADS", "").split(",")[0]) if "OMP_NUM_THREADS" in environ else None
    if usable_cores is not None and omp is not None and omp > usable_cores:
        out.append(Finding("OMP_NUM_THREADS", get("OMP_NUM_THREADS", ""), "warning",
                           f"{omp} threads is more than the {usable_cores} cores this process may use: "
                           "threads will oversubscribe the cores",
                           f"set OMP_NUM_THREADS to at most {usable_cores} (divided by processes per machine)"))
    return out


def findings_frame(findings: Iterable[Finding]):
    """Put findings in a table, errors first.

    Parameters
    ----------
    findings : iterable of Finding

    Returns
    -------
    pandas.DataFrame
        Columns ``name``, ``value``, ``severity``, ``message``, ``fix`` (all str),
        sorted by severity (error, warning, ok) then name; an empty frame with
        these columns when there are no findings.
    """
    import pandas as pd

    rows = [(f.name, f.value, f.severity, f.message, f.fix) for f in findings]
    rows.sort(key=lambda r: (_SEVERITY_RANK[r[2]], r[0]))
    return pd.DataFrame(rows, columns=["name", "value", "severity", "message", "fix"])


def format_catalog(width: int = 100) -> str:
    """The catalog as plain text for a terminal: one block per entry, wrapped to ``width``.

    Each block is the name and scope, then ``what``, ``allowed``, ``default``
    ("unset" when none is documented), ``notes`` (when any) and ``source``, each
    wrapped with a hanging indent; blocks are separated by a blank line and
    sorted by scope then name.

    Parameters
    ----------
    width : int
        Line width in characters (at least 40 is used).

    Returns
    -------
    str
        The text, ending with a newline.
    """
    import textwrap

    width = max(40, int(width))
    label_w = len("default: ")
    blocks = []
    for var in sorted(CATALOG.values(), key=lambda v: (SCOPES.index(v.scope), v.name)):
        lines = [f"{var.name}  ({var.scope})"]
        fields = [("what", var.description), ("allowed", var.allowed),
                  ("default", "unset" if var.default is None else var.default),
                  ("notes", var.notes), ("source", var.source)]
        for label, text in fields:
            if not text:
                continue
            head = f"  {label + ':':<{label_w}}"
            lines.append(textwrap.fill(text, width=width, initial_indent=head,
                                       subsequent_indent=" " * len(head), break_on_hyphens=False,
                                       break_long_words=False))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


# --------------------------------------------------------------------------
# Env files: read a proposed set, write a validated one for torchrun
# --------------------------------------------------------------------------

_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env_file(path: str | Path) -> dict[str, str]:
    """Read ``KEY=VALUE`` settings from a shell-style env file.

    Accepted lines: ``KEY=VALUE``, ``export KEY=VALUE``, values in single or
    double quotes (shell quoting rules, via :mod:`shlex`), blank lines, whole-line
    ``#`` comments and trailing ``# comments`` after a value. A later setting of
    the same name wins, as in a shell. Nothing is expanded (``$HOME`` stays as
    written) and nothing is executed.

    Parameters
    ----------
    path : str or pathlib.Path
        The file to read (UTF-8).

    Returns
    -------
    dict of str to str
        Name -> value, in file order.

    Raises
    ------
    ParameterError
        If the file cannot be read, or a line is not a setting; the message
        names the file, the line number and the line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ParameterError(f"cannot read env file {path}: {exc}; pass a readable UTF-8 file of "
                             "KEY=VALUE lines") from exc
    settings: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}: {raw.strip()!r}"
        body = line[len("export"):].lstrip() if re.match(r"export\s", line) else line
        name, sep, rest = body.partition("=")
        if not sep or not _NAME_RE.fullmatch(name):
            raise ParameterError(f"{where} is not a setting; write KEY=VALUE or export KEY=VALUE "
                                 "(no spaces around '=')")
        if rest[:1].isspace():
            raise ParameterError(f"{where}: the value starts with a space, which a shell reads as an empty "
                                 f"value; write {name}=VALUE or quote it: {name}=\" VALUE\"")
        try:
            tokens = shlex.split(rest, comments=True, posix=True)
        except ValueError as exc:
            raise ParameterError(f"{where}: {exc} (unbalanced quotes?); close the quote") from exc
        if len(tokens) > 1:
            raise ParameterError(f"{where}: the value has unquoted spaces; quote it: "
                                 f"{name}={shlex.quote(' '.join(tokens))}")
        if name in settings:
            logger.info("%s sets %s again; the later value wins", where, name)
        settings[name] = tokens[0] if tokens else ""
    return settings


def _implicated(finding: Finding) -> list[str]:
    return finding.name.split("+")


def write_env_file(
    environ: Mapping[str, str],
    path: str | Path,
    *,
    npu: bool | None = None,
    skip_invalid: bool = False,
) -> tuple[Path, list[Finding]]:
    """Check settings and write the valid ones as an env file torchrun's shell can ``source``.

    Only names the catalog validates (:data:`CATALOG`) and whose value passed
    are written, one ``export NAME=value`` line each (values quoted with
    :func:`shlex.quote`), under a header comment saying what wrote the file and
    when. Names the catalog only recognises, unknown names and everything else in
    ``environ`` (``PATH``, ``HOME``...) are left out; so is a name whose value is
    an error, or that takes part in an error between variables. Warnings do not
    stop a setting from being written; they are listed in the header.

    Parameters
    ----------
    environ : mapping of str to str
        The settings to check (``os.environ``, or :func:`parse_env_file`'s result).
    path : str or pathlib.Path
        The file to write; its parent folder is created.
    npu : bool or None
        Passed to :func:`check_env` (None: inferred from the settings).
    skip_invalid : bool
        False (default): raise when any setting is invalid or invented. True:
        leave those out, write the rest, and log what was left out.

    Returns
    -------
    (pathlib.Path, list of Finding)
        The file written and every finding of :func:`check_env`.

    Raises
    ------
    ParameterError
        When ``skip_invalid`` is False and there are error findings; the message
        lists each one with its fix. Nothing is written then.
    OutputDirError
        If the file cannot be written.
    """
    path = Path(path)
    findings = check_env(environ, npu=npu)
    errors = [f for f in findings if f.severity == "error"]
    if errors and not skip_invalid:
        lines = "\n".join(f"  - {format_finding(f)}" for f in errors)
        raise ParameterError(f"{len(errors)} invalid or invented setting(s); nothing was written to {path}:\n"
                             f"{lines}\nFix them, or pass skip_invalid=True to write only the valid ones.")
    rejected = {name for f in errors for name in _implicated(f)}
    keep = {name: environ[name] for name in sorted(environ) if name in CATALOG and name not in rejected}
    warnings = [f for f in findings if f.severity == "warning"]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    header = [
        f"# Written by helpers.diagnose.envcatalog.write_env_file ({stamp}).",
        "# Every setting below was validated against the workbook's catalog of real HCCL, NCCL,",
        "# torch_npu, CANN and torch settings. Load it before torchrun:  source THIS_FILE && torchrun ...",
    ]
    if rejected:
        header.append(f"# Left out as invalid or invented: {', '.join(sorted(rejected))}")
    for f in warnings:
        header.append(f"# warning: {f.name}: {f.message}".replace("\n", " "))
    body = [f"export {name}={shlex.quote(value)}" for name, value in keep.items()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(header + body) + "\n", encoding="utf-8")
    except OSError as exc:
        raise OutputDirError(f"cannot write env file {path}: {exc}; choose a writable path") from exc
    if rejected:
        logger.warning("left out of %s: %s", path, ", ".join(sorted(rejected)))
    return path, findings


def format_finding(finding: Finding) -> str:
    """One finding on one line: ``SEVERITY name=value: message | fix: ...``.

    Parameters
    ----------
    finding : Finding

    Returns
    -------
    str
        A single line (newlines in the parts are replaced by spaces).
    """
    value = finding.value if "+" in finding.name else shlex.quote(finding.value)
    head = finding.name if "+" in finding.name else f"{finding.name}={value}"
    text = f"{finding.severity.upper():<7} {head}: {finding.message}"
    if finding.fix:
        text += f" | fix: {finding.fix}"
    return " ".join(text.split("\n"))
