"""The DDP call's keywords, read and set by tune's hook on DDP's own signature (a world of one, gloo, in-process)."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from helpers.tune.hook import Recorder
from helpers.tune.hook_ddp import _watch_ddp

USER = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


def build():
    return DDP(torch.nn.Linear(4, 2), find_unused_parameters=True)
"""


def test_the_hook_reads_the_scripts_keywords_and_sets_the_candidates(tmp_path, monkeypatch):
    monkeypatch.setattr(DistributedDataParallel, "__init__", DistributedDataParallel.__init__)
    script = tmp_path / "train.py"
    script.write_text(USER)
    rec = Recorder({"warmup": 1, "steps": 5, "user_roots": [str(tmp_path)], "script": str(script),
                    "apply": {"ddp": {"static_graph": True, "gradient_as_bucket_view": True}}})
    _watch_ddp(rec)
    ns: dict = {}
    exec(compile(USER, str(script), "exec"), ns)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ddp = ns["build"]()
    finally:
        dist.destroy_process_group()
    assert rec.ddp_watch.info["given"] == {"find_unused_parameters": True}
    assert ddp.find_unused_parameters is True  # the script's own keyword kept
    assert ddp.static_graph is True and ddp.gradient_as_bucket_view is True  # the candidates' applied
    assert isinstance(ddp.module, torch.nn.Linear)
