"""The instrument's per-step overhead under torchrun: the example image job as DDP ranks (gloo), its loop timed
plain and instrumented in interleaved blocks (the order reversed every round), as ``bench instrument`` does for
one process (:func:`helpers.workbook.bench.instrument_overhead`). Every rank runs the same blocks in the same
order (DDP keeps them in step); each rank's ratio (median instrumented block / median plain block) carries a
95% bootstrap interval (:class:`helpers.timing.Comparison`), and the instrument's own calls are timed alone
(``instrument_cost_per_step_s``, and its share of the plain step); rank 0 gathers them and writes JSON to
``argv[1]``.

Usage: ``torchrun --nproc-per-node 2 tests/instrument_overhead_job.py OUT.json [ROUNDS] [STEPS_PER_BLOCK] [JOB]``,
JOB ``image`` (the example image job, PIL decode and a small CNN: about 250 ms a step on 2 busy cores) or ``tiny``
(a two-layer MLP on batches held in memory: a few ms a step, so the instrument's cost is a larger share of it).
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.distributed as dist

from helpers import machine
from helpers.comm import gather
from helpers.device import get_accelerator
from helpers.jobs.distributed import DistributedJob
from helpers.jobs.load import load_job
from helpers.pipeline.loader import LoaderConfig, close_loader
from helpers.timing import Comparison, Measurement
from helpers.workbook.instrument import InstrumentedLoader
from helpers.workbook.bench import interleaved_overhead
from helpers.workbook.paths import examples_dir

torch.set_num_threads(1)
out_path, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 10
per_block = int(sys.argv[3]) if len(sys.argv) > 3 else 4
which = sys.argv[4] if len(sys.argv) > 4 else "image"
dist.init_process_group("gloo")
ident = gather.RankIdentity.from_env()
acc = get_accelerator("cpu")
if which == "image":
    job = DistributedJob(load_job(f"{examples_dir() / 'image_classifier.py'}:make_job",
                                  {"batch_size": 16, "max_images": 128}), ident.rank, ident.world_size)
    loader = job.make_loader(job.make_dataset(), LoaderConfig(batch_size=16, num_workers=0, seed=0), acc)
    step = job.make_step(job.make_model(acc), acc)
else:
    from types import SimpleNamespace

    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(ident.rank)
    loader = [(torch.randn(32, 128, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(16)]

    def step(batch):
        x, y = batch
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()

    job = SimpleNamespace(to_device=lambda batch, acc: batch)


before = machine.snapshot()
plain, inst = interleaved_overhead(loader, lambda b: job.to_device(b, acc), step, acc, blocks=rounds,
                                   steps_per_block=per_block, name="overhead")
if which == "image":
    close_loader(loader)
# the instrument's own calls per step, alone (no step around them): the floor the interleaved ratio cannot resolve
# on a busy machine
bare = InstrumentedLoader(range(20000), device=acc, warmup=0)
t0 = time.perf_counter()
for _ in bare:
    bare.copied()
bare.end_step()
cost = (time.perf_counter() - t0) / 20000
c = Comparison.from_measurements(Measurement("instrumented", tuple(inst), 1), Measurement("plain", tuple(plain), 1))
mine = {"rank": ident.rank, "overhead": c.ratio, "ci_low": c.ci_low, "ci_high": c.ci_high,
        "plain_block_s": sorted(plain)[len(plain) // 2], "instrumented_block_s": sorted(inst)[len(inst) // 2],
        "machine": machine.check(before, machine.snapshot()).sentence(), "instrument_cost_per_step_s": cost,
        "cost_share_of_step": cost / (sorted(plain)[len(plain) // 2] / per_block)}
got = gather.gather_to_root(mine, ident, name=f"{gather.job_key()}-overhead")
if got is not None:
    res = {"ranks": [got.payloads[r] for r in sorted(got.payloads)], "rounds": rounds, "steps_per_block": per_block,
           "world_size": ident.world_size, "target": "<= 1.03", "job": which}
    res["worst_overhead"] = max(r["overhead"] for r in res["ranks"])
    with open(out_path, "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res, indent=2))
dist.destroy_process_group()
