"""One rank of a collective job: ``python -m helpers.comm.worker --task T --backend B --config C --out D``.

Started by torchrun (see :mod:`helpers.comm.launch`), which sets ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``. The rank
initializes the default process group with ``init_method="env://"``, runs
the task, and rank 0 writes ``result.json`` into the output folder. A rank
that raises writes ``error_rank<R>.json`` ({rank, type, message}) and exits
with status 1. The process group is destroyed on the way out.

Tasks: ``allreduce`` (:func:`helpers.comm.allreduce.run_allreduce`); any
``module:function`` whose function takes ``(config, rank_context)`` and runs
inside the process group (e.g. ``helpers.experiments.collectives:run_ddp``,
notebook 08's DDP experiment: named by its caller, so this layer imports no
experiment); and the self-tests used by the test suite
to check the launcher's failure handling: ``selftest_hang`` (every rank waits
forever after joining the group) and ``selftest_exit`` (rank 1 exits with
status 3 while rank 0 waits in an allreduce).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from pathlib import Path

from helpers.process import die_with_parent, register_child, unregister_child

if __name__ == "__main__":  # a rank: die with torchrun, asked before the slow imports below (torch)
    die_with_parent(parent_must_contain="torch.distributed")
    _RECORD = register_child(role=f"rank {os.environ.get('RANK', '?')}")  # a resumed run ends it if it is left
    import atexit

    atexit.register(unregister_child, _RECORD)

from helpers.comm.allreduce import run_allreduce  # noqa: E402 (after die_with_parent)
from helpers.fsutil import write_atomic  # noqa: E402
from helpers.comm.rank import RankContext, init_rank  # noqa: E402

log = logging.getLogger(__name__)


def run_task(task: str, cfg: dict, rc: RankContext) -> dict | None:
    """Run ``task`` on this rank; rank 0's return value is the job's result."""
    import torch.distributed as dist

    if task == "allreduce":
        return run_allreduce(rank=rc.rank, world_size=rc.world_size, device=rc.device, sizes=cfg["sizes"],
                             repeats=cfg["repeats"], warmup=cfg["warmup"], sync=rc.sync,
                             bare_bytes=cfg.get("bare_bytes"))
    if ":" in task:
        module, _, name = task.partition(":")
        return getattr(importlib.import_module(module), name)(cfg, rc)
    if task == "selftest_hang":
        dist.barrier()
        while True:
            time.sleep(1.0)
    if task == "selftest_exit":
        import torch

        dist.barrier()
        if rc.rank == 1:
            print("selftest_exit: rank 1 leaves with status 3", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(3)
        t = torch.ones(4)
        dist.all_reduce(t)  # waits for rank 1, which is gone
        return {"unexpected": True}
    if task == "selftest_ok":
        import torch

        t = torch.full((4,), float(rc.rank + 1))
        dist.all_reduce(t)
        return {"sum": t.tolist(), "world_size": rc.world_size, "pid": os.getpid()}
    raise ValueError(f"unknown task {task!r}; expected allreduce, module:function, selftest_hang, selftest_exit or "
                     "selftest_ok")


def main(argv: list[str] | None = None) -> int:
    """Entry point of one rank; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", required=True)
    p.add_argument("--backend", required=True, choices=("gloo", "nccl", "hccl"))
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    rank = int(os.environ.get("RANK", "0"))
    cfg = json.loads(args.config.read_text())
    try:
        rc = init_rank(args.backend, timeout_s=float(cfg.get("pg_timeout_s", 600.0)))
        result = run_task(args.task, cfg, rc)
        if rc.rank == 0:
            write_atomic(args.out / "result.json", json.dumps(result))
    except Exception as exc:  # report, then fail the rank so torchrun stops the job
        (args.out / f"error_rank{rank}.json").write_text(
            json.dumps({"rank": rank, "type": type(exc).__name__, "message": str(exc)}))
        log.error("rank %d failed: %s: %s", rank, type(exc).__name__, exc)
        return 1
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
