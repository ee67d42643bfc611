"""Notebook 03's result texts: what the cells of :class:`helpers.experiments.loader_sweep.LoaderChecks` and
:class:`~helpers.experiments.loader_sweep.LoaderResult` print, and the verdict's context sentence.

Two mixins without fields, read by the result classes, which hold the measurement: :class:`LoaderChecksTexts`
(sections 1, 2 and 5) and :class:`LoaderResultTexts` (the sweep, its ranking, the worker memory growth and the
confirmation).
"""

from __future__ import annotations

from helpers.pipeline.loader_timing import speedup_plausibility

__all__ = ["LoaderChecksTexts", "LoaderResultTexts"]


class LoaderChecksTexts:
    """The texts of :class:`helpers.experiments.loader_sweep.LoaderChecks` (sections 1, 2 and 5)."""

    @property
    def machine_text(self) -> str:
        """Cores and start method (section 1)."""
        m = self.method
        return (f"{self.cores} usable CPU core(s); workers start with {m.method!r} ({m.source})\n"
                f"what that means: {m.explanation}")

    @property
    def data_text(self) -> str:
        """The dataset swept (section 2)."""
        if not self.builtin:
            return f"your job: {dict(self.job_describe)}; {self.n_items} items in batches of {self.batch_size}"
        d = self.data
        lines = [f"{d['images']} images, {d['classes']} class(es), {len(d['skipped'])} file(s) skipped"]
        lines += [f"  skipped {name}: {reason}" for name, reason in d["skipped"][:10]]
        return "\n".join(lines)

    @property
    def probe_text(self) -> str:
        """Repeated draws before and after worker_init_fn (section 5)."""
        from helpers.pipeline.randomness import VARIANTS

        r = self.probe
        return (f"{r.items} items x {r.epochs} epochs x {r.ranks} ranks, 2 workers: {r.duplicates(VARIANTS[0])} "
                f"repeated draws before the fix, {r.duplicates(VARIANTS[1])} after")


class LoaderResultTexts:
    """The texts of :class:`helpers.experiments.loader_sweep.LoaderResult`: the sweep and what follows it."""

    @property
    def sweep_text(self) -> str:
        """How the sweep timed, and which settings had short windows (section 6)."""
        p, settings, summary = self.params, self.settings, self.summary
        lines = []
        if 0 not in p["num_workers_list"]:
            lines.append("num_workers=0 added to the sweep: it is the reference of the verdict")
        lines += [f"{len(settings)} settings x {p['trials']} trials, {p['batches_per_trial']} timed batches of "
                  f"{self.batch_size} items each, after draining up to {max(s.in_flight for s in settings)} batches "
                  "in flight",
                  f"batches finished before the clock started (not counted): up to "
                  f"{int(summary['prepared_ahead_max'].max())} in one trial"]
        short = self.sweep.short_windows()
        if short:
            lines.append(f"note: {len(short)} setting(s) timed fewer than two batches per worker ({'; '.join(short)}): "
                         "their throughput depends on how the workers' batches happened to line up; raise "
                         f"batches_per_trial to {max(s.min_timed_batches for s in settings)} or more for a steadier "
                         "figure")
        return "\n".join(lines)

    @property
    def sweep_table(self):
        """The sweep's summary, rounded for display."""
        return self.summary.round({"images_per_s": 0, "images_per_s_p25": 0, "images_per_s_p75": 0,
                                   "first_batch_s": 3, "first_batch_max_s": 3})

    @property
    def peak_text(self) -> str:
        """Where the fastest setting stands against the core count."""
        w, cores = self.best_setting.num_workers, self.cores
        if w == 0:
            return (f"the fastest setting used no workers: on {cores} core(s) the main process with {cores} decode "
                    "thread(s) was not beaten by worker processes")
        if w <= cores:
            return f"the fastest setting used {w} worker(s) on {cores} core(s): within the core count"
        return (f"the fastest setting used {w} workers on {cores} core(s), more than the cores: extra processes can "
                "gain a little when some of them wait (reading files, handing batches to the main process) while "
                "others compute, but such a lead is small and easily noise; the held-out confirmation below "
                "measures it again")

    @property
    def ranking_text(self) -> str:
        """The best setting, its margin over the runner-up and over num_workers=0 in the sweep."""
        best, cores = self.best, self.cores
        lines = [f"fastest here: {best} at {self._rate(self.sweep, best):.0f} images/s (median of "
                 f"{self.params['trials']} trials)"]
        if self.margin is not None:
            lines.append(f"margin over the next: {self.margin.verdict_text()}")
        c = self.sweep_over_zero
        if c is not None:
            lines.append(f"against num_workers=0 ({self._rate(self.sweep, 'workers=0'):.0f} images/s): "
                         f"{c.verdict_text()}")
            odd = speedup_plausibility(c.ratio, cores, ci_low=c.ci_low)
            if odd:
                lines.append(f"IMPLAUSIBLE: {odd}")
        else:
            lines.append(f"num_workers=0 was the fastest setting: worker processes did not pay for themselves on "
                         f"{cores} core(s)")
        return "\n".join(lines)

    @property
    def growth_text(self) -> str:
        """Median worker USS growth per loader."""
        return "median worker USS growth over the epoch: " + "; ".join(
            f"{label}: {value:+.1f} MiB" for label, value in self.worker_growth.items())

    @property
    def confirmation_text(self) -> str:
        """The held-out confirmation (section 8)."""
        c = self.over_zero
        if c is None:
            return "num_workers=0 won the sweep: there is nothing to confirm"
        best_rate, zero_rate = self.rates
        text = (f"confirmation, {self.params['trials']} new trials of {self.confirm_batches} timed batches: "
                f"{self.best} at {best_rate:.0f} images/s, num_workers=0 at {zero_rate:.0f} images/s; "
                f"{c.verdict_text()}")
        return text + (f"\nIMPLAUSIBLE: {self.implausible}" if self.implausible else "")

    @property
    def context(self) -> str:
        """What was measured, in one sentence (the verdict's context)."""
        p = self.params
        what = (f"batched pipeline (helpers.pipeline.fast.BatchedDataset, cores/num_workers decode threads per "
                f"process), batch {p['batch_size']} of {p['image_size']} px from {self.n_items} images" if self.builtin
                else f"your job's dataset ({self.job_describe.get('job')}), batch {self.batch_size} of "
                     f"{self.n_items} items")
        return (f"{what}; settings: num_workers {sorted({s.num_workers for s in self.settings})} x prefetch_factor "
                f"{sorted(set(p['prefetch_factor_list']))} x persistent_workers; {p['batches_per_trial']} timed "
                "batches per trial after draining the batches in flight, counting only batches finished after the "
                f"clock started, {p['trials']} trials in rotated order; the verdict from {p['trials']} held-out "
                f"confirmation trials of {self.best} against num_workers=0 ({self.confirm_batches} timed batches "
                f"each); {self.cores} usable cores, start method {self.method.method}, device {self.device_kind}")
