"""The slow-rank rule (helpers.stragglers) on synthetic per-step phase times: one rank slow, a node slow, none,
one rank only, noise that exceeds 5% but not the spread, and the others' wait in communication."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from helpers import stragglers
from helpers.errors import ParameterError
from helpers.stragglers import RankPhases, find


def _steps(rng, n, base, jitter):
    return [max(0.0, base + rng.uniform(-jitter, jitter)) for _ in range(n)]


def ddp_job(n_ranks=4, slow=(2,), extra_data=0.040, steps=8, seed=0, nodes=None, jitter=0.001):
    """A synchronous DDP job: every step lasts as long as the slowest rank's work; the others wait in comm."""
    rng = random.Random(seed)
    work = 0.008  # compute + optimizer of every rank, s
    ranks = []
    data = {r: _steps(rng, steps, 0.0002 + (extra_data if r in slow else 0.0), 0.0001) for r in range(n_ranks)}
    step = [max(data[r][i] for r in range(n_ranks)) + work + 0.004 + rng.uniform(0, jitter) for i in range(steps)]
    for r in range(n_ranks):
        comm = [step[i] - data[r][i] - work for i in range(steps)]
        node = None if nodes is None else nodes[r]
        ranks.append(RankPhases(label=f"rank {r}" + (f" ({node})" if node else ""), rank=r, node=node,
                                phases={"step_s": step, "data": data[r], "optimizer": [0.001] * steps,
                                        "comm": comm}))
    return ranks


def test_one_slow_rank_is_named_with_its_data_phase_and_the_others_wait():
    ranks = ddp_job()
    naive = max(ranks, key=lambda r: sorted(r.phases["comm"])[len(r.phases["comm"]) // 2])
    assert naive.rank != 2  # the "most communication" rank is a fast one
    res = find(ranks)
    assert res.slow_ranks == ("rank 2",) and res.ranks == (2,)
    assert res.phase == "data" and res.node is None
    assert res.excess_s == pytest.approx(0.040, abs=0.0005)
    assert res.excess_pct == pytest.approx(100 * res.excess_s / res.primary.mean_step_s)
    assert res.spread_s < 0.001
    assert res.wait.phase == "comm" and res.wait.coverage >= stragglers.WAIT_COVERAGE
    assert res.wait.others_extra_s == pytest.approx(0.040, abs=0.002)
    s = res.sentence()
    assert s.startswith("rank 2 is the slow rank: its data phase")
    assert "more communication per step" in s and "is their wait for rank 2" in s
    d = res.as_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["slow_ranks"] == ["rank 2"] and d["phase"] == "data" and d["wait"]["phase"] == "comm"
    assert set(d["medians"]) == {f"rank {r}" for r in range(4)}


def test_a_whole_node_slower_in_the_same_phase_is_named_as_the_node():
    nodes = ["a"] * 4 + ["b"] * 4
    res = find(ddp_job(n_ranks=8, slow=(4, 5, 6, 7), extra_data=0.030, nodes=nodes))
    assert res.node == "b" and res.phase == "data"
    assert sorted(res.ranks) == [4, 5, 6, 7]
    assert res.excess_s == pytest.approx(0.030, abs=0.0005)
    s = res.sentence()
    assert s.startswith("Node b is slower than the others") and "no rank on another node is slow" in s
    assert f"of the other nodes' ranks' {stragglers._ms(res.primary.mean_step_s)} mean step" in s
    assert "is their wait for node b" in s


def test_one_slow_rank_on_a_node_is_a_rank_not_the_node():
    res = find(ddp_job(n_ranks=8, slow=(5,), nodes=["a"] * 4 + ["b"] * 4))
    assert res.node is None and res.slow_ranks == ("rank 5 (b)",) and res.phase == "data"


def test_no_slow_rank():
    res = find(ddp_job(slow=()))
    assert res.findings == () and res.phase is None and res.wait is None
    s = res.sentence()
    assert s.startswith("No rank is slower than the others: across 4 ranks")
    assert "more than both the per-step spread and 5% of the" in s


def test_one_rank_only_says_no_comparison_is_possible():
    res = find(ddp_job(n_ranks=1, slow=()))
    assert res.n_ranks == 1 and res.findings == ()
    assert "no other rank to compare" in res.sentence()
    assert res.as_dict()["n_ranks"] == 1


def _independent(extra, jitter, steps=12, seed=3):
    """Four unsynchronized ranks; rank 1's steps are `extra` s longer, each step +-`jitter` s."""
    rng = random.Random(seed)
    out = []
    for r in range(4):
        st = _steps(rng, steps, 0.100 + (extra if r == 1 else 0.0), jitter)
        out.append(RankPhases(label=f"rank {r}", rank=r, phases={"step_s": st}))
    return out


def test_noise_above_five_percent_but_within_the_spread_is_not_a_slow_rank():
    noisy = find(_independent(extra=0.008, jitter=0.040))  # 8% of the step; per-step IQR about 40 ms
    assert noisy.findings == ()
    assert noisy.closest is not None and noisy.closest.excess_s > noisy.closest.threshold_s  # 5% exceeded
    assert noisy.closest.excess_s < noisy.closest.spread_s  # ... but not the spread
    quiet = find(_independent(extra=0.008, jitter=0.0005))  # the same excess with quiet steps is slow
    assert quiet.slow_ranks == ("rank 1",) and quiet.phase is None
    assert "no phase the trace measures explains it" in quiet.sentence()


def test_an_excess_above_the_spread_but_under_five_percent_is_not_a_slow_rank():
    res = find(_independent(extra=0.003, jitter=0.0002))  # 3% of the step, far above a 0.2 ms spread
    assert res.findings == ()
    assert res.closest.excess_s > res.closest.spread_s and res.closest.excess_s < res.closest.threshold_s


def test_a_compute_slow_rank_whose_peers_do_not_wait_in_communication():
    rng = random.Random(1)
    ranks = []
    for r in range(4):
        comp = _steps(rng, 8, 0.050 + (0.020 if r == 3 else 0.0), 0.0005)
        ranks.append(RankPhases(label=f"rank {r}", rank=r, phases={
            "step_s": [c + 0.010 for c in comp], "compute": comp, "comm": _steps(rng, 8, 0.005, 0.0005)}))
    res = find(ranks)
    assert res.slow_ranks == ("rank 3",) and res.phase == "compute"
    assert abs(res.wait.others_extra_s) < 0.002
    assert "do not spend longer in communication than rank 3" in res.sentence()


def test_wait_phases_are_never_the_culprits_phase():
    ranks = ddp_job(slow=())
    bumped = ranks[0].phases["comm"]
    ranks[0] = RankPhases(label="rank 0", rank=0, phases={**ranks[0].phases, "comm": [c + 0.03 for c in bumped]})
    assert find(ranks).findings == ()


def test_a_rank_trace_is_accepted_as_it_is():
    from helpers.traces.model import RankTrace, StepPhases

    traces = []
    for r in range(3):
        steps = tuple(StepPhases(step=i, step_s=0.06, data=0.041 if r == 1 else 0.001 + i * 1e-5, comm=None)
                      for i in range(5))
        traces.append(RankTrace(source=Path(f"r{r}.pt.trace.json"), format="kineto", device_kind="cpu",
                                steps=steps, rank=r, world_size=3, node="vm"))
    res = find(traces)
    assert res.slow_ranks == ("rank 1 (vm)",) and res.phase == "data"
    assert res.wait is None and "measure no communication" in res.sentence()


@pytest.mark.parametrize("ranks, match", [
    ([], "no rank given"),
    ([RankPhases("a", {"step_s": [0.1]}), RankPhases("a", {"step_s": [0.1]})], "unique"),
    ([RankPhases("a", {"step_s": [0.1, -1.0]})], "finite and >= 0"),
    ([RankPhases("a", {"data": [0.1]})], "no step times"),
    ([object()], "RankPhases"),
])
def test_bad_input_is_named(ranks, match):
    with pytest.raises(ParameterError, match=match):
        find(ranks)


def test_min_excess_must_be_a_share():
    with pytest.raises(ParameterError, match="min_excess"):
        find(ddp_job(), min_excess=5)


def test_the_share_is_printed_with_the_mean_it_divides_by_the_other_ranks():
    """Issue 31: "158 % of the 46.1 ms mean step" divided by the other ranks' mean and printed all ranks'. The
    sentence prints the other ranks' mean, and says so."""
    ranks = [RankPhases(label=f"rank {r}", rank=r, phases={"step_s": [0.0292 + (0.0461 if r == 3 else 0.0)] * 8})
             for r in range(4)]
    res = find(ranks)
    s = res.sentence()
    assert res.slow_ranks == ("rank 3",) and res.primary.mean_step_s == pytest.approx(0.0292)
    assert "158% of the other ranks' 29.2 ms mean step" in s and "5% of that mean (1.46 ms)" in s
    assert res.mean_step_s == pytest.approx(statistics.fmean([0.0292] * 3 + [0.0753]))  # all ranks' 40.7 ms ...
    assert "40.7 ms" not in s  # ... is not the mean the share is of
    assert res.as_dict()["findings"][0]["mean_step_s"] == pytest.approx(0.0292)
    quiet = find(_independent(extra=0.003, jitter=0.0002))
    assert "5% of the other ranks' mean step (all ranks' mean step:" in quiet.sentence()


def test_the_caller_says_what_its_phases_hold_and_what_it_cannot_see():
    """Live ranks without communication measured pass the compute column (which holds the wait) as waiting: the
    sentence names it as the caller says, never as communication; without a wait phase, the caller's sentence."""
    res = find(ddp_job(), source="the instrument",
               words={"comm": "compute-column time (which holds the wait)"})
    s = res.sentence()
    assert res.slow_ranks == ("rank 2",) and "communication" not in s
    assert "more compute-column time (which holds the wait) per step" in s
    assert "so the rank with the most compute-column time is not the culprit" in s
    alone = find(_independent(extra=0.008, jitter=0.0005), source="the instrument",
                 no_wait="The ranks do not synchronize: the others do not wait for {culprit}.")
    s = alone.sentence()
    assert "no phase the instrument measures explains it" in s
    assert s.endswith("The ranks do not synchronize: the others do not wait for rank 1.")


def test_a_rank_last_at_a_majority_that_chance_explains_is_not_named():
    from helpers.traces.arrival import CHANCE, Arrival, chance_of

    # 4 ranks alike: some rank is last at 6 or more of 10 about 8% of the time; at 10 of 10, almost never
    assert chance_of(6, 10, 4) == pytest.approx(0.0789, abs=1e-3) and chance_of(6, 10, 4) > CHANCE
    assert chance_of(10, 10, 4) < 1e-5 and chance_of(3, 3, 2) == pytest.approx(0.25)
    a = Arrival(matched=10, late=10, step_s=0.0077, last_counts={"rank 0": 2, "rank 1": 1, "rank 2": 1, "rank 3": 6},
                straggler=None, lateness_s=None, ranks=("rank 0", "rank 1", "rank 2", "rank 3"))
    text = a.sentence()
    assert text.startswith("rank 3 arrived last at 6 of 10 late collectives") and "8% of the time" in text
    assert "profile more steps" in text
