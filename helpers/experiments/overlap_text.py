"""Notebook 05's result texts: what the cells of :class:`helpers.experiments.overlap.OverlapChecks` and
:class:`~helpers.experiments.overlap.StreamOverlapResult` print (sentences and display tables), and the verdict's
context sentence.

Two mixins without fields, read by the result classes, which hold the measurement: :class:`OverlapChecksTexts`
(sections 1 and 2) and :class:`StreamOverlapResultTexts` (sections 3, 4 and 6).
"""

from __future__ import annotations

import pandas as pd

from helpers.experiments.overlap_decision import FEW_BATCHES_PER_EPOCH

__all__ = ["OverlapChecksTexts", "StreamOverlapResultTexts"]


class OverlapChecksTexts:
    """The texts of :class:`helpers.experiments.overlap.OverlapChecks` (sections 1 and 2)."""

    def dataset_text(self) -> str:
        """Section 1: the data, its batches per epoch, and a note where they are too few to prefetch."""
        if self.job.is_builtin:
            lines = [f"{self.n_items} images, {self.dataset['classes']} class(es), {self.dataset['skipped']} file(s) "
                     f"skipped, {self.per_epoch} batch(es) of {self.batch_size} per epoch"]
        else:
            lines = [f"your job: {self.job.summary()}; {self.per_epoch} batch(es) of {self.batch_size} per epoch"]
        if self.per_epoch <= 1:
            lines.append("only 1 batch per epoch: there is nothing to prefetch (a loader starts every epoch empty), "
                         "so no overlap can hide this input; lower batch_size or add images to see one work")
        elif self.per_epoch < FEW_BATCHES_PER_EPOCH:
            lines.append(f"few batches per epoch: the first batch of every epoch (1 step in {self.per_epoch}) cannot "
                         "be prefetched")
        return "\n".join(lines)

    def correctness_text(self) -> str:
        """Section 2: the side stream, and what was compared where the dataset cannot be read twice alike."""
        c = self.check
        lines = [f"side stream: {'yes, 1 stream for all epochs' if c['side_stream'] else 'none on ' + self.device + ' (synchronous copies)'}"]
        if c["identical"] != c["batches"] and not c["reproducible"]:
            lines.append("your dataset gives different values when the same batch is read twice (its randomness "
                         "comes from a source the workbook cannot seed): compared shapes, dtypes and labels instead")
        return "\n".join(lines)

    def identical_text(self) -> str:
        """Section 2: how many prefetched batches equal the synchronous copy."""
        return (f"{self.check['identical']} of {self.check['batches']} prefetched batches are bit-identical to the "
                "synchronous copy")


class StreamOverlapResultTexts:
    """The texts of :class:`helpers.experiments.overlap.StreamOverlapResult` (sections 3, 4 and 6) and its context."""

    def splits_text(self) -> str:
        """Section 3: the cores and the splits tried, each with its torch threads and reason, and that the kept one
        is compared with a *before* at its torch thread count."""
        return "\n".join([f"{self.cores} usable core(s); splits to try (the faster after is compared with a before "
                          "at its own torch thread count):"]
                         + [f"  {s['label']} ({s['torch_threads']} torch thread(s)): {s['reason']}"
                            for s in self.splits])

    def scaling_table(self) -> pd.DataFrame:
        """Section 3: ms per step (compute alone) per torch thread count."""
        return self.scaling.assign(ms_per_step=1e3 * self.scaling["median_s"])[["torch_threads", "ms_per_step"]]

    def workload_text(self) -> str:
        """Section 3: this notebook's workload beside notebook 01's, and the compute per step at each width."""
        here = self.compute_here_s * 1e3
        if not self.job.is_builtin:
            return "\n".join([f"your job's own model and batch of {self.batch_size}, as in notebook 01: no "
                              "model_width to change here",
                              f"compute per step, {self.cores} torch thread(s), on your job's first batch: "
                              f"{here:.1f} ms"])
        mine = {**self.settings, "batch_size": self.batch_size}
        return "\n".join([
            "this notebook:   " + ", ".join(f"{k} {mine[k]}" for k in self.base),
            "notebook 01:     " + ", ".join(f"{k} {v}" for k, v in self.base.items()) + f" ({self.base_source})",
            f"compute per step, {self.cores} torch thread(s), this notebook's batch: {here:.1f} ms at model_width "
            f"{self.settings['model_width']} (this notebook), {self.compute_01_s * 1e3:.1f} ms at model_width "
            f"{self.base['model_width']} (notebook 01's)"])

    def variants_text(self) -> str:
        """Section 4: each variant's medians, the one kept, and whether the compute covers the input work."""
        lines = ["medians over the measured steps (they need not add up: each is the median of its own column)"]
        width = max(len(v.label) for v in self.overlap.variants)
        for v in self.overlap.variants:
            s = v.stats
            lines.append(f"{v.label:{width}s} step {s.median_step_s * 1e3:7.1f} ms: compute "
                         f"{s.median_compute_s * 1e3:7.1f} ms, exposed input {s.median_exposed_s * 1e3:6.1f} ms, input "
                         f"work {s.median_input_work_s * 1e3:6.1f} ms")
        before, after = self.overlap.before, self.overlap.after
        lines.append(f"kept as 'after' (shortest median step): {after.label}, against {before.label}: "
                     f"{self.sides_text()}")
        lines.extend(self.thread_effect_lines())

        def covers(compute_s):
            return "covers" if compute_s * 1e3 >= self.work_ms else "does NOT cover"

        here, width, width_01 = self.compute_here_s, self.settings["model_width"], self.base["model_width"]
        if not self.job.is_builtin:
            lines.append(f"input work per step {self.work_ms:.1f} ms (the synchronous run's data + h2d: your batches "
                         f"do not time their own preparation); compute per step ({self.cores} torch threads) "
                         f"{here * 1e3:.1f} ms, which {covers(here)} it")
        else:
            lines.append(f"input work per step {self.work_ms:.1f} ms; compute per step ({self.cores} torch threads) "
                         f"{here * 1e3:.1f} ms at this notebook's model_width {width}, which {covers(here)} it"
                         + (f"; {self.compute_01_s * 1e3:.1f} ms at notebook 01's {width_01}, which "
                            f"{covers(self.compute_01_s)} it" if width_01 != width else " (the same width as notebook 01)"))
        return "\n".join(lines)

    def sides_text(self) -> str:
        """What the verdict's two sides ran with: ``"both at 1 torch thread(s), batch 32"`` (each side's where they
        differ)."""
        from helpers.experiments.overlap_decision import ran_alike

        return ran_alike(self.overlap.before, self.overlap.after) or "torch threads and batch not stated"

    def thread_effect_lines(self) -> list[str]:
        """Section 4: the thread split's own effect on the step, per variant (the same variant at two torch thread
        counts), said apart from the overlap's gain; none with one split."""
        out = []
        for name, c in self.overlap.thread_effect.items():
            faster, slower, ratio, lo, hi = c.b.name, c.a.name, c.ratio, c.ci_low, c.ci_high
            if ratio < 1:
                faster, slower, ratio, lo, hi = c.a.name, c.b.name, 1 / ratio, 1 / c.ci_high, 1 / c.ci_low
            measurable = "" if lo > 1 or hi < 1 else ", not measurably"
            out.append(f"thread split alone ({name}, same variant at two torch thread counts): {faster} "
                       f"{ratio:.2f}x faster per step than {slower}{measurable} (95% CI {lo:.2f}-{hi:.2f}); the "
                       "threads' effect, not the overlap's")
        return out

    def overlap_table(self) -> pd.DataFrame:
        """Section 6: per variant its workers, torch threads, batch and medians (ms), and both fractions (%)."""
        rows = []
        for v in self.overlap.variants:
            s = v.stats
            rows.append({"variant": v.label, "workers": v.settings["num_workers"],
                         "torch threads": v.settings["torch_threads"], "batch": v.settings.get("batch_size"),
                         "step ms": 1e3 * s.median_step_s,
                         "compute ms": 1e3 * s.median_compute_s, "input work ms": 1e3 * s.median_input_work_s,
                         "exposed ms": 1e3 * s.median_exposed_s, "exposed % of step": 100 * s.exposed_fraction,
                         "hidden % of input": 100 * s.hidden_fraction})
        return pd.DataFrame(rows)

    def context(self) -> str:
        """What was measured, in the verdict's one sentence."""
        here, s = self.compute_here_s * 1e3, self.settings
        if not self.job.is_builtin:
            what = (f"your job {self.job.name!r} ({here:.0f} ms compute vs {self.work_ms:.0f} ms input work per step, "
                    f"the input work read from the synchronous run), batch {self.batch_size} from {self.n_items} "
                    f"items ({self.per_epoch} batch(es) per epoch), its own dataset")
        else:
            what = (f"PPO on a multimodal policy ({s['model_width']}-channel conv stem, d_model {s['d_model']}; "
                    f"notebook 01 trains model_width {self.base['model_width']} ({self.base_source}): this notebook "
                    f"needs compute per step >= input work per step, here {here:.0f} ms compute vs "
                    f"{self.work_ms:.0f} ms input work, {self.compute_01_s * 1e3:.0f} ms at 01's width), batch "
                    f"{self.batch_size} of {s['image_size']} px from {self.n_items} images ({self.per_epoch} "
                    "batch(es) per epoch), batched pipeline")
        before, after = self.overlap.before.settings, self.overlap.after.settings
        copy = "side stream" if after["side_stream"] else "synchronous copy"
        return (f"{what}; before: num_workers=0, synchronous copy, {before['torch_threads']} torch thread(s), batch "
                f"{before.get('batch_size', self.batch_size)}; after: {s['num_workers']} worker(s), prefetch_factor "
                f"{s['prefetch_factor']}, DevicePrefetcher ({copy}), {after['torch_threads']} torch thread(s), batch "
                f"{after.get('batch_size', self.batch_size)}; "
                f"{s['steps']} measured steps each on {self.device}; figures are medians over the steps, fractions "
                "ratios of those medians")
