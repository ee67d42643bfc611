"""An Ascend folder's communication.json and communication_matrix.json (``CommunicationParser``, when HCCL ran):
per step, each HCCL operator's elapse, wait, transit, synchronization and idle times and its bandwidth per transport,
summed per step (:func:`_read_hccl`, into ``provenance["hccl"]``); the slowest rank-to-rank link
(:func:`_read_matrix`); and ``comm`` per step from the operators' elapse where the device timeline is missing
(:func:`_comm_from_hccl`). :mod:`helpers.traces.ascend` reads them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from helpers.traces.ascend_format import (
    COMM_BANDWIDTH_INFO,
    COMM_GROUPS,
    COMM_STEP_PREFIX,
    COMM_TIME_INFO,
    COMMUNICATION_FILE,
    COMMUNICATION_MATRIX_FILE,
    ELAPSE_TIME_MS,
    IDLE_TIME_MS,
    MATRIX_TOTAL,
    SLOW_LINK_RATIO,
    SYNC_TIME_MS,
    TRANSIT_SIZE_MB,
    TRANSIT_TIME_MS,
    TRANSPORT_TYPE,
    WAIT_TIME_MS,
    _load_json,
    _ranges,
    _us,
)
from helpers.traces.model import StepPhases

@dataclass
class _Hccl:
    summary: dict[str, Any]
    elapse_ms: dict[int | None, float]  # per step number (None: "step", no steps marked)


_HCCL_TIMES = (("elapse_ms", ELAPSE_TIME_MS), ("wait_ms", WAIT_TIME_MS), ("transit_ms", TRANSIT_TIME_MS),
               ("sync_ms", SYNC_TIME_MS), ("idle_ms", IDLE_TIME_MS))


def _read_hccl(out: Path, limits: list[str]) -> tuple[_Hccl | None, list[Path]]:
    """communication.json summed per step over its HCCL operators (p2p and collective), its transports'
    bandwidth, and communication_matrix.json's slowest link; (None, []) without the file."""
    path = out / COMMUNICATION_FILE
    if not path.is_file():
        return None, []
    data = _load_json(path, limits)
    if not isinstance(data, dict):
        if data is not None:
            limits.append(f"{COMMUNICATION_FILE} is not a JSON object of steps; HCCL times unknown")
        return None, []
    per_step: list[dict[str, Any]] = []
    links: dict[str, list[float]] = {}
    for key, groups in data.items():
        rest = key[len(COMM_STEP_PREFIX):] if isinstance(key, str) and key.startswith(COMM_STEP_PREFIX) else None
        if rest is None or not isinstance(groups, dict) or (rest and not rest.isdigit()):
            continue
        row: dict[str, Any] = {"step": int(rest) if rest else None, "ops": 0}
        row.update({k: 0.0 for k, _c in _HCCL_TIMES})
        for group in COMM_GROUPS:
            ops = groups.get(group)
            for name, info in (ops.items() if isinstance(ops, dict) else ()):
                if not isinstance(info, dict) or str(name).lower().startswith("total"):
                    continue  # TOTAL_OP_INFO: the writer's sum of the ops of the group
                row["ops"] += 1
                times = info.get(COMM_TIME_INFO)
                for k, column in _HCCL_TIMES:
                    row[k] += _num(times.get(column)) if isinstance(times, dict) else 0.0
                bandwidth = info.get(COMM_BANDWIDTH_INFO)
                for transport, b in (bandwidth.items() if isinstance(bandwidth, dict) else ()):
                    if isinstance(b, dict):
                        acc = links.setdefault(str(transport), [0.0, 0.0])
                        acc[0] += _num(b.get(TRANSIT_SIZE_MB))
                        acc[1] += _num(b.get(TRANSIT_TIME_MS))
        per_step.append(row)
    if not per_step:
        limits.append(f"{COMMUNICATION_FILE} holds no {COMM_STEP_PREFIX}<N> entry; HCCL times unknown")
        return None, [path]
    per_step.sort(key=lambda r: (r["step"] is None, r["step"] or 0))
    summary: dict[str, Any] = {k: statistics.median(r[k] for r in per_step) for k, _c in _HCCL_TIMES}
    wait, transit = sum(r["wait_ms"] for r in per_step), sum(r["transit_ms"] for r in per_step)
    summary["wait_ratio"] = round(wait / (wait + transit), 4) if wait + transit > 0 else None
    bw = {t: {"bandwidth_gb_s": size / ms, "transit_size_mb": size, "transit_time_ms": ms}
          for t, (size, ms) in sorted(links.items()) if size > 0 and ms > 0}  # MB/ms = GB/s (compute_ratio)
    summary["links"] = bw
    summary["slow_link"] = None
    if bw:
        slow = min(bw, key=lambda t: bw[t]["bandwidth_gb_s"])
        summary["slow_link"] = {"type": slow, **bw[slow]}
        others = {t: v["bandwidth_gb_s"] for t, v in bw.items() if t != slow}
        if others:
            fast = max(others, key=others.get)
            if bw[slow]["bandwidth_gb_s"] < SLOW_LINK_RATIO * others[fast]:
                s = bw[slow]
                limits.append(
                    f"HCCL's slow link is {slow}: {s['bandwidth_gb_s']:.2f} GB/s ({s['transit_size_mb']:.1f} MB in "
                    f"{s['transit_time_ms']:.1f} ms over the recorded steps), far below {fast} at "
                    f"{others[fast]:.2f} GB/s ({COMMUNICATION_FILE}); the communication over {slow} is what waits "
                    "on the wire. Small transfers measure latency more than bandwidth, so compare the sizes too")
    summary["steps"] = per_step
    files = [path]
    pair = _read_matrix(out / COMMUNICATION_MATRIX_FILE, limits)
    if pair is not None:
        summary["slow_pair"] = pair
        files.append(out / COMMUNICATION_MATRIX_FILE)
    return _Hccl(summary=summary, elapse_ms={r["step"]: r["elapse_ms"] for r in per_step}), files


def _read_matrix(path: Path, limits: list[str]) -> dict[str, Any] | None:
    """The slowest rank-to-rank link of communication_matrix.json (its ``<type>-total@<group>`` entries summed per
    link ``"<src>-<dst>"``, a rank's copy to itself left out): the link furthest below the median of the other
    links of its transport (else the slowest); a limit when it is far below that median."""
    if not path.is_file():
        return None
    data = _load_json(path, limits)
    if not isinstance(data, dict):
        return None
    pairs: dict[str, list[Any]] = {}
    for groups in data.values():
        for group in (groups.get(g) for g in COMM_GROUPS) if isinstance(groups, dict) else ():
            for op, by_link in (group.items() if isinstance(group, dict) else ()):
                if MATRIX_TOTAL not in str(op) or not isinstance(by_link, dict):
                    continue
                for link, d in by_link.items():
                    src, _, dst = str(link).partition("-")
                    if not isinstance(d, dict) or src == dst:
                        continue
                    acc = pairs.setdefault(str(link), [d.get(TRANSPORT_TYPE), 0.0, 0.0])
                    acc[1] += _num(d.get(TRANSIT_SIZE_MB))
                    acc[2] += _num(d.get(TRANSIT_TIME_MS))
    rated = {k: (t, size / ms, size, ms) for k, (t, size, ms) in pairs.items() if size > 0 and ms > 0}
    if not rated:
        return None
    peers = {k: [v[1] for j, v in rated.items() if j != k and v[0] == rated[k][0]] for k in rated}
    compared = {k: rated[k][1] / statistics.median(p) for k, p in peers.items() if p and statistics.median(p) > 0}
    # the link furthest below the other links of its transport; without such peers, the slowest
    link = min(compared, key=compared.get) if compared else min(rated, key=lambda k: rated[k][1])
    kind, gbs, size, ms = rated[link]
    pair = {"link": link, "type": kind, "bandwidth_gb_s": gbs, "transit_size_mb": size, "transit_time_ms": ms}
    if link in compared:
        median = statistics.median(peers[link])
        pair["peer_median_gb_s"] = median
        if compared[link] < SLOW_LINK_RATIO:
            limits.append(f"link {link} ({kind}) moved {gbs:.2f} GB/s against a median {median:.2f} GB/s of this "
                          f"rank's {len(peers[link])} other {kind} links ({COMMUNICATION_MATRIX_FILE}): a slow link "
                          "between those two ranks")
    return pair


def _num(v: Any) -> float:
    x = _us(v)
    return x if x is not None and x >= 0 else 0.0


def _comm_from_hccl(steps: list[StepPhases], hccl: _Hccl | None, limits: list[str]) -> list[StepPhases]:
    """comm from communication.json's Elapse per step, for the steps whose trace does not say."""
    if hccl is None:
        return steps
    elapse = dict(hccl.elapse_ms)
    if None in elapse and len(steps) == 1:
        elapse.setdefault(steps[0].step, elapse[None])
    filled = [s.step for s in steps if s.comm is None and s.step in elapse]
    if not filled:
        return steps
    limits.append(f"comm of steps {_ranges(filled)} is the sum of {COMMUNICATION_FILE}'s {ELAPSE_TIME_MS} over the "
                  "step's HCCL operators (the device timeline is missing): overlapped communication counts too, and "
                  "operators on parallel streams add up; comm_exposed is unknown")
    return [replace(s, comm=elapse[s.step] / 1000.0) if s.step in filled else s for s in steps]
