"""``diagnose --job`` under torchrun: every rank's three-run test, one report for the job on rank 0.

Every rank runs :func:`helpers.experiments.three_run.three_run` on its own shard of the job
(:class:`helpers.jobs.distributed.DistributedJob`: DDP around the model, a batch order per rank) and hands its
figures to rank 0 (:func:`helpers.comm.gather.gather_to_root`, through the process group's store, with a
timeout that names the ranks that did not report). Rank 0 prints one line per rank (its verdict, exposed input,
the three runs' step times and its free-input ceiling), the job's verdict and the job's free-input ceiling:

A synchronous job's step lasts as long as its slowest rank's, so the job's ceiling is the ratio of the slowest
rank's real step to the slowest rank's input-free step, and the job is as host-bound as its most exposed rank
(rank 0's own figures in a DDP job whose other node waits for its loader show rank 0 waiting in the allreduce,
not free input). The interval printed with the job's ceiling is that of the rank whose real step is the longest.
The slow-rank rule (:func:`helpers.stragglers.find`) runs on the real run's per-step phases, the compute phase
compared as waiting (it holds each rank's wait in the gradient allreduce).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from helpers import bottleneck, stragglers

__all__ = ["job_summary", "rank_payload"]


def rank_payload(result: Any, identity: Any, *, device_kind: str = "") -> dict[str, Any]:
    """What one rank sends to rank 0: its :meth:`ThreeRunResult.as_dict`, its rank and node, and the real run's
    per-step phases (seconds).

    Parameters
    ----------
    result : helpers.experiments.three_run.ThreeRunResult
    identity : helpers.comm.gather.RankIdentity
    device_kind : str
        "cpu", "cuda" or "npu" (how the verdict's sentence names the device).
    """
    real = result.steps["real"]
    return {**result.as_dict(), "rank": identity.rank, "node": identity.node, "device_kind": device_kind,
            "real_steps": {c: [float(v) for v in real[c]] for c in ("data", "h2d", "compute", "step_s")
                           if c in real}}


def job_summary(payloads: Mapping[int, Mapping[str, Any]], *, world_size: int, missing: Sequence[int] = (),
                threshold: float = 0.10) -> dict[str, Any]:
    """The job's figures from every rank's :func:`rank_payload`: per rank, the job's verdict and ceiling.

    Parameters
    ----------
    payloads : mapping of int to dict
        Rank -> its payload (rank 0's included).
    world_size : int
        Ranks in the job.
    missing : sequence of int
        Ranks that did not report within the timeout.
    threshold : float
        Exposed-input share above which a step is host-bound (``diagnose --threshold``).

    Returns
    -------
    dict
        JSON types: ``ranks`` (rank, node, recommendation, exposed_input_fraction, step_ms, free_input_speedup),
        ``missing``, ``exposed_input_fraction`` (the largest rank's), ``bound_by``, ``recommendation``,
        ``reason``, ``free_input_speedup`` (the job's: ratio, the slowest rank's interval, ``slowest_rank``),
        ``slow`` (:meth:`helpers.stragglers.SlowRanks.as_dict` or None) and ``lines`` (what rank 0 prints).
    """
    ranks = [payloads[r] for r in sorted(payloads)]
    rows = [{"rank": p["rank"], "node": p.get("node"), "recommendation": p["recommendation"],
             "exposed_input_fraction": p["exposed_input_fraction"], "step_ms": p["step_ms"],
             "free_input_speedup": p["free_input_speedup"]} for p in ranks]
    top = max(ranks, key=lambda p: p["exposed_input_fraction"])
    slowest = max(ranks, key=lambda p: p["step_ms"]["real"])
    synth = max(p["step_ms"]["synthetic"] for p in ranks)
    ratio = slowest["step_ms"]["real"] / synth if synth > 0 else float("nan")
    b = bottleneck.classify(min(1.0, max(0.0, float(top["exposed_input_fraction"]))), threshold,
                            device_kind=str(top.get("device_kind", "")))
    found = None
    if len(ranks) >= 2:
        found = stragglers.find([stragglers.RankPhases(
            label=f"rank {p['rank']}", rank=p["rank"], node=p.get("node"),
            phases={("comm" if k == "compute" else k): v for k, v in p["real_steps"].items() if v})
            for p in ranks if p.get("real_steps", {}).get("step_s")])
    if found is not None and found.findings and found.phase in ("data", "h2d"):
        fs = sorted((f for f in found.findings if f.phase in ("data", "h2d")), key=lambda f: f.rank)
        who = (f"node {found.node}, ranks {' and '.join(str(f.rank) for f in fs)}" if found.node else
               " and ".join(f"rank {f.rank} on node {f.node}" for f in fs))
    else:
        who = f"rank {top['rank']} on node {top.get('node')}"
    busy = any(p["recommendation"] == "inconclusive" and p["measured_recommendation"] != "inconclusive"
               for p in ranks)
    ci = slowest["free_input_speedup"]
    lines = [f"the job: {len(ranks)} of {world_size} ranks reported, each ran the three-run test on its own shard"]
    for p in ranks:
        s, f = p["step_ms"], p["free_input_speedup"]
        lines.append(f"  rank {p['rank']} (node {p.get('node')}): {p['recommendation']}, input exposed "
                     f"{p['exposed_input_fraction']:.0%}; real {s['real']:.1f} ms, cached {s['cached']:.1f}, "
                     f"synthetic {s['synthetic']:.1f}; free input {f['ratio']:.2f}x (95% CI {f['ci_low']:.2f}-"
                     f"{f['ci_high']:.2f})")
    if missing:
        lines.append(f"  rank(s) {', '.join(map(str, missing))} did not report within the timeout: left out")
    lines.append(f"job: {'inconclusive (a rank measured on a busy machine); what it measured: ' if busy else ''}"
                 f"{b.label}, set by {who} (input exposed up to {top['exposed_input_fraction']:.0%} of the step): "
                 f"{b.reason}")
    lines.append(f"the job's free-input ceiling: {ratio:.2f}x (the slowest rank's real step, rank {slowest['rank']}'s "
                 f"{slowest['step_ms']['real']:.1f} ms, over the slowest input-free step, {synth:.1f} ms; rank "
                 f"{slowest['rank']}'s own interval {ci['ci_low']:.2f}-{ci['ci_high']:.2f}): the slowest rank "
                 "bounds a synchronous job, so every rank's input must be made free for the job to gain it")
    if found is not None:
        lines.append(f"slow: {found.sentence()}")
    return {"ranks": rows, "missing": list(missing), "world_size": int(world_size),
            "exposed_input_fraction": float(top["exposed_input_fraction"]), "bound_by": who,
            "recommendation": "inconclusive" if busy else b.label, "measured_recommendation": b.label,
            "reason": b.reason,
            "free_input_speedup": {"ratio": ratio, "ci_low": ci["ci_low"], "ci_high": ci["ci_high"],
                                   "slowest_rank": slowest["rank"]},
            "slow": found.as_dict() if found is not None else None, "lines": lines}
