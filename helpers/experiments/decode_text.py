"""Notebook 02's result texts: what the cells of :class:`helpers.experiments.decode.DecodeChecks` and
:class:`~helpers.experiments.decode.DecodeResult` print (sentences and display tables).

Two mixins without fields, read by the result classes, which hold the measurement and the figures derived from it:
:class:`DecodeChecksTexts` (sections 1-3) and :class:`DecodeResultTexts` (sections 4-10).
"""

from __future__ import annotations

__all__ = ["DecodeChecksTexts", "DecodeResultTexts"]

_ONE_THREAD = "one decode thread (one usable core or threads=1): thread scaling cannot be measured here"


class DecodeChecksTexts:
    """The texts of :class:`helpers.experiments.decode.DecodeChecks` (sections 1-3)."""

    @property
    def setup_text(self) -> str:
        """Decode threads, usable cores, pinned buffers (and why not pinned)."""
        text = f"decode threads: {self.threads} (usable cores: {self.cores}); batch buffers pinned: {self.pinned}"
        return text + (f"\npinned memory: {self.pinned_note}" if self.pinned_note else "")

    @property
    def scaling_text(self) -> str:
        """The routes taken and the DCT scales chosen over one epoch (section 2)."""
        n_turbo = sum(self.scales.values())
        n_reference = self.n_plans - n_turbo
        if n_reference:
            lines = [f"{n_turbo} of {self.n_plans} images take the libjpeg-turbo path; the other {n_reference} take "
                     "the reference path (CMYK JPEGs and other formats)"]
        else:
            lines = [f"all {self.n_plans} images take the libjpeg-turbo path"]
        lines.append("decoded at: " + ", ".join(f"{'full size' if d == 1 else f'1/{d}'}: {self.scales.get(d, 0)}"
                                                for d in (1, 2, 4, 8)))
        if self.full_px:
            lines.append(f"pixels produced by the decoder: {self.pixel_fraction:.0%} of a full-resolution decode")
        return "\n".join(lines)

    @property
    def pixels_text(self) -> str:
        """The batched vs reference PSNR summary (section 3)."""
        median = self.check["psnr_db"].median()
        return (f"{len(self.check)} images: PSNR min {self.min_psnr:.1f} dB, median {median:.1f} "
                f"dB (threshold {self.params['psnr_min_db']:g} dB): "
                f"{'same pictures' if self.pixels_ok else 'SOME IMAGES DIFFER'}")

    @property
    def fixtures_text(self) -> str:
        """The fixtures' verdict line (every file alike on both paths)."""
        return (f"{len(self.routes)} fixture files: every one decodes to the same picture on both paths or is "
                "rejected by both for the same reason; channel order RGB on every path")

    @property
    def fixture_table(self):
        """The fixtures: file, route, reference's outcome, same picture."""
        return self.routes[["file", "route", "reference", "same picture"]]

    @property
    def fixtures_recorded_text(self) -> str:
        """How many fixture files the fixtures record counts as handled alike."""
        return (f"recorded: {int(self.routes['agree'].sum()):.0f} of {len(self.routes)} fixture files handled alike "
                "on both paths")


class DecodeResultTexts:
    """The texts of :class:`helpers.experiments.decode.DecodeResult` (sections 4-10)."""

    @property
    def gil_text(self) -> str:
        """Thread scaling of the raw decode (section 4)."""
        if self.gil is None:
            return _ONE_THREAD
        return (f"{self.gil.verdict_text()}: {self.threads} threads give {self.gil.ratio:.2f}x the decode rate of one "
                f"({self.gil.ratio / self.threads:.0%} of linear scaling)")

    @property
    def flags_text(self) -> str:
        """The decoder flags' comparison (section 5)."""
        adopt = "worth enabling (DecodeConfig(fastdct=True, fastupsample=True))" if self.adopt_flags else "kept off"
        return f"fastdct + fastupsample: {self.flags.verdict_text()}; PSNR min {self.flag_psnr:.1f} dB -> {adopt}"

    @property
    def preprocess_text(self) -> str:
        """The preprocessing speedup and its two rates (section 6)."""
        pre, p = self.pre, self.params
        return (f"{pre.verdict_text()}\n{pre.a.name} {pre.a.rate:,.0f} images/s, {pre.b.name} {pre.b.rate:,.0f} "
                f"images/s ({p['batch_size']} images per batch, {self.threads} decode thread(s), {p['repeats']} "
                "batches each)")

    @property
    def efficiency_text(self) -> str:
        """The decode efficiency and its two rates (section 7)."""
        eff, pre = self.eff, self.pre
        return (f"{eff.a.name} {eff.a.rate:,.0f} images/s, {eff.b.name} {eff.b.rate:,.0f} images/s: decode efficiency "
                f"{eff.ratio:.0%} (95% CI {eff.ci_low:.0%}-{eff.ci_high:.0%}); the other {1 - eff.ratio:.0%} is file "
                "reading, headers, crop draws, resize, copies and tokenization\n"
                f"(the device copy and normalization are outside this figure: {pre.b.name} ran at {pre.b.rate:,.0f} "
                "images/s in section 6's own comparison)")

    @property
    def tokenize_text(self) -> str:
        """Batched vs per-sample tokenization and its share of a batch's time (section 8)."""
        s = self.share
        return (f"encode_batch vs per-sample encode: {self.tok.verdict_text()}\n"
                f"tokenization is {s['batched_share']:.1%} of a {self.eff.b.name} batch's time (section 7) "
                f"and {s['per_sample_share']:.1%} of a {self.pre.a.name} batch's (section 6)")

    @property
    def tokenize_split(self):
        """Seconds per batch spent tokenizing and on the images, per-image baseline and batched (host)."""
        import pandas as pd

        s = self.share
        return pd.DataFrame({"tokenize": [s["tokenize_per_sample_s"], s["tokenize_batch_s"]],
                             "images": [s["baseline_s"] - s["tokenize_per_sample_s"],
                                        s["host_s"] - s["tokenize_batch_s"]]},
                            index=[self.pre.a.name, self.eff.b.name])

    @property
    def cache_text(self) -> str:
        """The decode-once cache: size, build, speedup and pixels, or why it was not measured (section 9)."""
        c = self.cache
        if c.cmp is None:
            return f"decode-once cache not measured: {c.why}"
        built = (f"built in {c.build_s:.1f} s ({c.rebuilt_because})" if c.build_s is not None
                 else "already built, opened after checking every source file")
        return (f"cache: {c.images} images, {c.mib:.1f} MiB, {built}; {c.failed} file(s) could not be decoded\n"
                f"{c.cmp.verdict_text()}; cached crops vs reference: PSNR min {min(c.psnr):.1f} dB, median "
                f"{sorted(c.psnr)[len(c.psnr) // 2]:.1f} dB")

    @property
    def gpu_text(self) -> str:
        """GPU decode's comparison or why it was not measured, then the NPU note (section 10)."""
        if self.gpu is not None:
            head = (f"{self.gpu.verdict_text()}; GPU-decoded pixels vs reference: PSNR min {min(self.gpu_psnr):.1f} "
                    "dB")
        else:
            head = f"GPU decode: not applicable here: {self.gpu_why}"
        return f"{head}\n{self.npu_note}"
