"""The trace readers on further public traces (issue 44): steps without ProfilerStep#N, DeepEP's communication, an
Ascend rank whose metadata names its group.

The files are listed, with their sources, commits and SHA-256, under "Further traces" in
tests/data/public_traces/README.md. They are not committed here: each is looked for under ``$PUBLIC_TRACES_DIR``,
then ../shared/public_traces, and a test skips (saying which file) where its file is absent.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from helpers.traces import read
from helpers.traces.analysis import analyze

HERE = Path(__file__).resolve().parent
#: Each file's path under the traces root and its SHA-256 (README, "Further traces").
FILES = {
    "tb_plugin/resnet50_autograd_api_num_workers_0/worker0.pt.trace.json.gz":
        "f45f18f171e996603e705239f8d3f4f9424710671a956c4357fa1161b6475f09",
    "tb_plugin/resnet50_autograd_api_num_workers_4/worker0.pt.trace.json.gz":
        "22cb5915bc9ce7018c3e130a248d967959159f229646777b8ee45f63f8d551de",
    "tracelens/mi300/ddp_resnet18_no_pool/train_resnet18.json.gz":
        "0e9ad539e9d802f76f88c88c4780ad76489626382707d91b7dfcf19c364764b7",
    "deepseek_profile_data/train.json": "d7b7232efa7708990df5973a0558cf07394ec3f9387ac5d705a607960f2467c1",
    "npu_mfu_analyzer/ascend_sample_rank0/profiler_metadata.json":
        "582f19ab375901f3839329fad4f8b2b517aaa9b09a805d6e2b75581e4c435485",
    "npu_mfu_analyzer/ascend_sample_rank0/ASCEND_PROFILER_OUTPUT/op_statistic.csv":
        "d7fb7e449f00c968ba8bcde87d2c0d7c46fd462fbcd98458fce818b9f35f08df",
}


def _path(key: str) -> Path:
    """The file under the first traces root that holds it, checked against its SHA-256; skips where none does."""
    for root in (os.environ.get("PUBLIC_TRACES_DIR"), HERE.parent.parent / "shared" / "public_traces"):
        p = Path(root) / key if root else None
        if p is not None and p.is_file():
            assert hashlib.sha256(p.read_bytes()).hexdigest() == FILES[key], f"{p} is not the published file"
            return p
    pytest.skip(f"{key} is not on this machine (tests/data/public_traces/README.md, 'Further traces', says where "
                "it comes from)")


@pytest.mark.parametrize("workers", [0, 4])
def test_kinetos_autograd_api_samples_are_read_from_their_optimizer_steps(workers):
    key = f"tb_plugin/resnet50_autograd_api_num_workers_{workers}/worker0.pt.trace.json.gz"
    (t,) = read([_path(key)])
    assert t.provenance["step_marker"] == "Optimizer.step#SGD.step" and len(t.steps) == 5  # 6 spans
    assert all(s.data is not None and s.compute > 0 for s in t.steps)
    a = analyze([t])
    assert "5 steps marked by Optimizer.step#SGD.step" in a.verdict().context
    # num_workers=4 hides the loader; num_workers=0 exposes it (the plugin's own samples: 0.8% and 33%)
    assert (a.job.exposed_fraction > 0.15) == (workers == 0)


def test_an_mi300x_trace_without_profiler_steps_is_read_from_its_optimizer_steps():
    (t,) = read([_path("tracelens/mi300/ddp_resnet18_no_pool/train_resnet18.json.gz")])
    assert t.device_kind == "rocm" and t.provenance["step_marker"] == "Optimizer.step#SGD.step"
    assert len(t.steps) == 4  # 5 optimizer steps


def test_deepseeks_deepep_kernels_are_communication_and_limit_the_compute_lever():
    (t,) = read([_path("deepseek_profile_data/train.json")])
    taken = t.provenance["communication"]
    deep_ep = [k for k in taken if k["rule"] == "DeepEP"]
    assert {k["name"].split("<")[0] for k in deep_ep} >= {"void dpsk::ep::internode::dispatch",
                                                           "void dpsk::ep::internode::combine",
                                                           "void dpsk::ep::internode::notify_dispatch"}
    assert sum(k["ms"] for k in deep_ep) > 100  # of the 244 ms of kernel time
    a = analyze([t])
    assert a.job.shares.comm_overlapped > 0.5  # DeepEP runs under the GEMMs on its own stream
    assert a.bottleneck.compute_saving < 0.25  # not the 49% that compute / 2 alone would give
    assert "DeepEP's internode/intranode kernels" in a.verdict().reason


def test_the_npu_mfu_analyzer_sample_is_rank_0_of_4_with_its_whole_run_operators():
    _path("npu_mfu_analyzer/ascend_sample_rank0/ASCEND_PROFILER_OUTPUT/op_statistic.csv")
    folder = _path("npu_mfu_analyzer/ascend_sample_rank0/profiler_metadata.json").parent
    (t,) = read([folder])
    assert (t.rank, t.world_size) == (0, 4)
    assert t.top_ops[0]["name"] == "MatMulV2" and t.top_ops[0]["calls"] == 32689
    assert any("top operators from op_statistic.csv" in x for x in t.limits)
    a = analyze([t])
    assert a.missing_ranks == 3 and "single-process" not in a.headline()
