"""Notebook 08's result texts: what the cells of :class:`helpers.experiments.collectives.CollectivesChecks` and
:class:`~helpers.experiments.collectives.CollectivesResult` print (sentences and display tables), and the verdict's
context sentence.

Two mixins without fields, read by the result classes, which hold the measurement: :class:`CollectivesChecksTexts`
(section 3) and :class:`CollectivesResultTexts` (sections 4 and 5: the allreduce sweep, the published figures,
DDP's buckets, hooks and overlap).
"""

from __future__ import annotations

from helpers.units import format_bytes

__all__ = ["CollectivesChecksTexts", "CollectivesResultTexts"]


def _n_buckets(n: int) -> str:
    """``"1 bucket"``, ``"3 buckets"``."""
    return f"{n} bucket" + ("" if n == 1 else "s")


class CollectivesChecksTexts:
    """The texts of :class:`helpers.experiments.collectives.CollectivesChecks` (section 3)."""

    def ddp_check_text(self) -> str:
        """Section 3: plain DDP equals the fp32 reference, every gradient byte is in a bucket."""
        c = self.ddp_check
        if c is None:
            return f"DDP not run: {self.plan.why_not}"
        plain = c["plain"]
        exact = str(plain["max_abs_err"] == 0.0) if plain is not None else c["grad_check"]
        return (f"plain DDP allreduce equals the fp32 reference exactly: {exact}\n"
                f"every gradient byte is in a bucket: {c['in_buckets']}")


class CollectivesResultTexts:
    """The texts of :class:`helpers.experiments.collectives.CollectivesResult` (sections 4 and 5)."""

    def allreduce_table(self):
        """Section 4: per size, its calls, times (us, median and quartiles) and bandwidths (None without a run)."""
        import pandas as pd

        if self.bench is None:
            return None
        df = pd.DataFrame(self.bench["sizes"])
        show = df.assign(size=[f"{b / 2**20:g} MiB" if b >= 2**20 else f"{b} B" for b in df["bytes"]],
                         median_us=df["time_s"] * 1e6, p25_us=df["time_p25_s"] * 1e6, p75_us=df["time_p75_s"] * 1e6)
        return show[["size", "repeats", "median_us", "p25_us", "p75_us", "algbw_gbps", "busbw_gbps"]].round(4)

    def allreduce_text(self) -> str:
        """Section 4: the small-message time, the noisy sizes, the plateau, the largest size and the bare loop."""
        if self.bench is None:
            return f"allreduce benchmark not run: {self.plan.why_not}"
        bench, reg, flags = self.bench, self.regimes, self.flags
        small = [r for r in bench["sizes"] if r["bytes"] in reg["small_sizes"]]
        lines = [f"median small-message time: {reg['small_time_s'] * 1e6:.0f} us per allreduce (median of the "
                 f"per-size medians of the {len(small)} smallest sizes, {small[0]['bytes']} to {small[-1]['bytes']} "
                 "B; a typical value, single sizes lie above and below it)"]
        if flags:
            lines.append(f"flagged: {len(flags)} of {len(bench['sizes'])} sizes look noisy (ringed in the plot; a "
                         "loaded machine gives millisecond scheduler pauses: rerun on an idle machine or raise "
                         "repeats):")
            lines += [f"  {format_bytes(f['bytes'])}: {'; '.join(f['reasons'])}" for f in flags]
        else:
            lines.append("steady: no size has a 75th percentile above 5x its median, a median off its neighbours' "
                         "trend, or (in the bandwidth-bound part) a time that does not grow with size")
        lines.append(f"plateau: {reg['plateau_busbw_gbps']:.2f} GB/s busbw (median of the {len(reg['plateau_bytes'])} "
                     f"largest sizes, {reg['plateau_bytes'][0] / 2**20:g} MiB and up); from "
                     f"{reg['crossover_bytes']:,} bytes on (the crossover), every size reaches at least half of it "
                     f"(highest single point: {reg['peak_busbw_gbps']:.2f} GB/s at {reg['peak_bytes'] / 2**20:g} MiB)")
        largest, b = bench["sizes"][-1], bench["bare"]
        row = next((r for r in bench["sizes"] if r["bytes"] == b["bytes"]), None)
        lines.append(f"largest size {largest['bytes'] / 2**20:g} MiB: busbw {largest['busbw_gbps']:.2f} GB/s. At "
                     f"{b['bytes'] / 2**20:g} MiB, {b['chunks']} interleaved rounds of {b['chunk_calls']} calls: bare "
                     f"loop {b['busbw_gbps']:.2f} GB/s, benchmark {b['bench_busbw_gbps']:.2f} GB/s (both the median "
                     f"chunk mean, slowest rank); the sweep's own {b['bytes'] / 2**20:g} MiB point above: "
                     f"{row['busbw_gbps'] if row else float('nan'):.2f} GB/s")
        lines.append(f"overhead_vs_bare {bench['overhead_vs_bare']:.3f}: {bench['overhead_note']}")
        return "\n".join(lines)

    def references_text(self) -> str:
        """Section 4: published figures beside this run's (empty without a run)."""
        if self.bench is None:
            return ""
        bench, reg = self.bench, self.regimes
        at40 = min(bench["sizes"], key=lambda r: abs(r["bytes"] - 40e6))
        refs = [
            ("localhost gloo allreduce latency (tiny messages)", "about 0.2 ms",
             f"median small-message time {reg['small_time_s'] * 1e3:.3f} ms",
             "https://github.com/meta-pytorch/torchft/pull/199"),
            ("localhost gloo allreduce at 40 MB", "about 2.4 GB/s",
             f"{at40['algbw_gbps']:.2f} GB/s algbw at {format_bytes(at40['bytes'])}",
             "https://github.com/meta-pytorch/torchft/pull/199"),
            ("8x H100 nccl allreduce busbw, NVLink SHARP (ring: about 370 GB/s)", "about 480 GB/s",
             f"plateau busbw {reg['plateau_busbw_gbps']:.2f} GB/s ({self.plan.backend}, {self.plan.world_size} ranks "
             f"on {bench['device']})", "https://github.com/NVIDIA/nccl-tests/issues/212"),
        ]
        return "\n".join(f"{what}: published {published}; this run: {here}\n    source: {url}"
                         for what, published, here, url in refs)

    def ddp_text(self) -> str:
        """Section 5: the job under DDP, each bucket layout and the bucket comparison's note."""
        d, cmp_ = self.ddp, self.buckets
        if d is None:
            return f"DDP not run: {self.plan.why_not}"
        lines = [f"{d['job']}: {d['params']:,} parameters, {d['grad_bytes'] / 2**20:.2f} MiB of fp32 gradients per "
                 f"backward, {d['backward_passes']} backward pass(es) per step; {d['world_size']} ranks x "
                 f"{d['batch_per_rank']} samples; {d['samples']} samples in the data"]
        for g in cmp_["groups"]:
            caps = ", ".join(f"{c:g}" for c in g["caps"])
            lines.append(f"bucket layout {g['n_buckets']} bucket(s) from cap(s) {caps}: {g['time_s'] * 1e3:.1f} ms "
                         "per step"
                         + (f", the caps' medians {g['spread_s'] * 1e3:.1f} ms apart (same work: noise)"
                            if len(g["caps"]) > 1 else ""))
        return "\n".join(lines + [f"buckets: {cmp_['note']}"])

    def buckets_table(self):
        """Section 5: per ``bucket_cap_mb``, the buckets DDP made and the step time (None without DDP)."""
        import pandas as pd

        if self.ddp is None:
            return None
        return pd.DataFrame([{"bucket_cap_mb": b["cap_mb"], "buckets made": b["n_buckets"],
                              "bucket sizes (KiB)": ", ".join(f"{s / 1024:.0f}" for s in b["bucket_sizes"]),
                              "step ms": b["time_s"] * 1e3, "p25 ms": b["time_p25_s"] * 1e3,
                              "p75 ms": b["time_p75_s"] * 1e3} for b in self.ddp["buckets"]]).round(2)

    def hooks_text(self) -> str:
        """Section 5: the hooks not supported here, and where the hooks were measured."""
        d = self.ddp
        if d is None:
            return f"DDP not run: {self.plan.why_not}"
        lines = [f"{name}: not supported with {self.plan.backend} here ({why})"
                 for name, why in d["unsupported_hooks"].items()]
        cap = d["hooks"][0]["cap_mb"] if d["hooks"] else float("nan")
        lines.append(f"hooks measured at bucket_cap_mb {cap:g}; the 'none' row is the same run as the bucket_cap_mb "
                     f"{cap:g} row of the table above; gradient error from {d['grad_check']}")
        return "\n".join(lines)

    def hooks_table(self):
        """Section 5: per hook, the bytes sent (three significant digits: a small model sends a few KiB), the step
        time (rounded like :meth:`buckets_table`) and the gradient error (two significant digits, "0" when exact)
        (None without DDP)."""
        import pandas as pd

        if self.ddp is None:
            return None
        err = lambda x: f"{x:.1e}" if x else "0"  # noqa: E731  (errors span decades: two significant digits)
        return pd.DataFrame([{"hook": h["hook"], "MiB per step": float(f"{h['bytes_per_step'] / 2**20:.3g}"),
                              "step ms": h["time_s"] * 1e3, "p25 ms": h["time_p25_s"] * 1e3,
                              "p75 ms": h["time_p75_s"] * 1e3, "max abs err": err(h["max_abs_err"]),
                              "rel err": err(h["rel_err"]), "elements differing": h["mismatched"]}
                             for h in self.ddp["hooks"]]).round({"step ms": 2, "p25 ms": 2, "p75 ms": 2})

    def overlap_text(self) -> str:
        """Section 5: communication hidden behind the backward pass, and the cost per bucket where measurable."""
        d, cmp_ = self.ddp, self.buckets
        if d is None:
            return f"DDP not run: {self.plan.why_not}"
        ov = d["overlap"]
        line = (f"overlap at bucket_cap_mb {ov['cap_mb']:g} ({_n_buckets(ov['n_buckets'])}, {ov['steps']} interleaved "
                f"steps each): step with DDP {ov['t_ddp_s'] * 1e3:.1f} ms, without communication (no_sync) "
                f"{ov['t_nosync_s'] * 1e3:.1f} ms, the allreduces alone {ov['t_allreduce_s'] * 1e3:.1f} ms: "
                f"communication adds {ov['exposed_s'] * 1e3:.1f} ms to the step; {ov['note']}.")
        if cmp_["measurable"]:
            extra = cmp_["per_bucket_s"]
            return line + (f"\n{'fewer' if extra > 0 else 'more'} buckets were measurably faster here: "
                           f"{extra * 1e3:+.2f} ms per extra bucket per backward pass ({d['backward_passes']} "
                           "backward passes per step)"
                           + (f"; the allreduce curve above puts one small allreduce at about "
                              f"{self.regimes['small_time_s'] * 1e3:.2f} ms" if self.bench is not None else ""))
        return line + (f"\nbucket size: no measurable difference between the layouts (noise "
                       f"{(cmp_['noise_s'] or 0) * 1e3:.1f} ms between caps with the same buckets), so no per-bucket "
                       "cost is computed")

    @property
    def context(self) -> str:
        """What was measured, in the verdict's one sentence."""
        P, plan, d = self.params, self.plan, self.ddp
        if self.bench is None or d is None:
            return f"backend {P['backend']}, world_size {P['world_size']} on {self.device_kind}"
        trained = (f"PPO DDP {P['batch_size']} samples per rank, image {P['image_size']} px, width {P['model_width']}"
                   if d.get("builtin", True) else
                   f"your job {d['job']!r} under DDP, {d['batch_per_rank']} samples per rank")
        return (f"{plan.backend}, {P['world_size']} ranks on {self.bench['device']}; allreduce {P['min_bytes']} B to "
                f"{P['max_size_mib']} MiB, {P['repeats']} repeats; {trained}, {P['steps']} steps per variant, "
                "interleaved")
