"""One tune session: probe the script, measure the candidates, write the winners as code, prove the rewritten file.

:func:`tune` is what ``workbook tune`` calls. The steps, each in separate processes of the user's script:

1. the probe: the unmodified script once, for its call sites, its model and device, and a first timing (this
   run is not measured: its file cache and allocator are cold);
2. the candidates (:func:`helpers.tune.candidates.choose`, and where a framework owns a setting
   :func:`helpers.tune.candidates.framework_candidates`, run as a copy of the script with the framework's call
   edited) and the unmodified script, interleaved, ``rounds`` times; each judged against the unmodified runs
   (:func:`helpers.tune.engine.judge`);
3. the winners (the fastest "faster" setting of each technique) written into a copy of the script
   (:mod:`helpers.tune.rewrite`);
4. the proof: the rewritten copy, as written, against the original file, interleaved, ``rounds`` times. Where it
   does not reproduce the gain, the best winner that can be written into the script is written alone and proven;
   where that fails too, no change is proposed.

Nothing is written for a script that fails on its own, and the diff and the rewritten file are written only
once their proof is done, so an interrupted session never leaves a diff that looks complete.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from helpers.device import usable_cores
from helpers.errors import ParameterError
from helpers.tune import candidates as cand_mod
from helpers.tune import candidates_cpu as cpu_mod
from helpers.tune import candidates_device as dev_mod
from helpers.tune.candidates import Candidate
from helpers.tune.candidates_compile import COMPILE_TIMEOUT_S, cannot_pay, compile_edits, compile_judgement
from helpers.tune.engine import (GIVE_UP_RATIO, PROBE_STALL_FLOOR_S, Command, Judgement, Run, ScriptError, exploding,
                                 judge, measure, nonfinite_step, run_once)
from helpers.tune.report import write_report
from helpers.tune.rewrite import (Edit, apply_edits, float16_part, framework_calls, loader_elsewhere, loader_label,
                                  techniques_of, unified_diff)

__all__ = ["TuneOptions", "TuneResult", "tune", "plan_edits", "call_edits"]



#: What to do about a script whose loss diverges unmodified (tune cannot judge a change's results then).
FIX_DIVERGENCE = ("so tune cannot check that a change keeps the results; fix the divergence first (a learning rate "
                  "too high for the model, or NaN or inf in the data)")



#: Every technique tune may try, by the name the report uses (``--skip`` takes these).
TECHNIQUES = frozenset(cand_mod.NOTEBOOK) | frozenset(cand_mod.GENERAL) | frozenset(dev_mod.DEVICE) | frozenset(
    cpu_mod.GUIDE)


@dataclass(frozen=True)
class TuneOptions:
    """The session's settings (the command line's flags).

    Attributes
    ----------
    warmup : int
        Untimed optimizer steps per run (>= 1): the first steps carry one-off costs (allocation, worker start).
    steps : int
        Timed optimizer steps per run (>= 5).
    rounds : int
        Runs per variant (>= 2).
    timeout_s : float
        The probe's limit, seconds; later runs get 3 x the probe's time + 60 s.
    skip : tuple of str
        Techniques (names of :data:`TECHNIQUES`) not to try: each is listed under "Not tried" as left out by you
        (``--skip compile`` where you know the job is too short for its compile time, say).

    Raises
    ------
    ParameterError
        A setting out of range, or a technique name tune does not know (the known ones are listed).
    """

    warmup: int = 5
    steps: int = 20
    rounds: int = 3
    timeout_s: float = 600.0
    skip: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, low in (("warmup", 1), ("steps", 5), ("rounds", 2)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ParameterError(f"tune: --{name} must be an integer >= {low}, got {v!r}")
        if not self.timeout_s > 0:
            raise ParameterError(f"tune: --timeout must be > 0 seconds, got {self.timeout_s!r}")
        unknown = [t for t in self.skip if t not in TECHNIQUES]
        if unknown:
            raise ParameterError(f"tune: --skip {', '.join(unknown)}: no such technique; the techniques are "
                                 f"{', '.join(sorted(TECHNIQUES))}")


@dataclass
class TuneResult:
    """What a session found (``summary.json`` is :meth:`as_dict`)."""

    command: str
    out_dir: Path
    probe: dict[str, Any]
    candidates: list[Candidate] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    judgements: list[Judgement] = field(default_factory=list)
    winners: list[str] = field(default_factory=list)
    edits_made: list[Edit] = field(default_factory=list)
    edits_skipped: list[tuple[Edit, str]] = field(default_factory=list)
    diff: str = ""
    rewritten: str = ""
    proof: Judgement | None = None
    proven: list[str] = field(default_factory=list)
    busy: str = ""
    applied_to: str = ""
    backup: str = ""
    script_dir: str = ""
    runs: list[Run] = field(default_factory=list)
    seconds: float = 0.0
    framework_calls: list[dict[str, Any]] = field(default_factory=list)
    proof_tries: int = 0
    options: Any = None
    python: str = ""
    job: dict[str, Any] = field(default_factory=dict)
    proof_runs: dict[str, list[Run]] = field(default_factory=dict)
    proof_failures: list[str] = field(default_factory=list)
    launch: str = ""  # the proven launch command (an allocator through LD_PRELOAD), "" where none
    launch_tried: str = ""  # the launch command the last proof ran with no edit of the script, "" where it had one
    cores: int = 0  # usable cores per process, as the candidates were chosen for

    @property
    def user_files(self) -> list[dict[str, str]]:
        """The user's files that tune's runs changed and that were put back after each run (``{"path", "action"}``,
        :func:`helpers.tune.engine.restore_user_files`), each path once."""
        seen: dict[str, str] = {}
        for files in [self.probe.get("user_files")] + [r.result.get("user_files") for r in self.runs]:
            for f in files or []:
                seen.setdefault(f["path"], f["action"])
        return [{"path": p, "action": a} for p, a in seen.items()]

    @property
    def headline(self) -> str:
        """One sentence: the proven speedup of the rewritten script, or why there is no change."""
        if self.proof is not None and self.proof.verdict == "faster" and self.launch and not self.diff:
            return (f"Your script launched as `{self.launch}` is {self.proof.figure} faster per step than as you run "
                    f"it, measured against it ({', '.join(self.proven)}).")
        if self.proof is not None and self.proof.verdict == "faster":
            launched = f", launched as `{self.launch}`," if self.launch else ""
            return (f"The rewritten script{launched} is {self.proof.figure} faster per step than yours, measured as "
                    f"written against the original ({', '.join(self.proven)}).")
        if not self.winners:
            unsure = [j for j in self.judgements if j.verdict == "inconclusive"]
            if unsure:
                return (f"No change was proven faster, but {len(unsure)} of {len(self.judgements)} could not be "
                        f"judged (the machine was busy, or the rounds disagreed): rerun tune when the machine is "
                        f"quiet; the report gives each reason.")
            return "No change made this script faster here: nothing to rewrite."
        if self.proof_failures:  # a rewritten script that failed: its error, even where a smaller proof followed
            then = (f"; the best change alone then gave {self.proof.figure} ({self.proof.verdict})"
                    if self.proof is not None and self.proof.verdict != "rejected" else "")
            return (f"The rewritten script was rejected when it ran as written ({'; '.join(self.proof_failures)})"
                    f"{then}: no change is proposed.")
        if not self.edits_made and self.proof is None:
            return "Changes won at runtime, but none could be written into the script (see 'Not written')."
        if self.proof is not None and self.proof.verdict == "rejected":
            return (f"The rewritten script was rejected when it ran as written ({self.proof.reason.splitlines()[0]}): "
                    f"no change is proposed.")
        figure = self.proof.figure_inline if self.proof else "not measured"
        if self.launch_tried:
            return (f"The runtime gain did not hold when your script was launched as `{self.launch_tried}` "
                    f"({figure}): no change is proposed.")
        return (f"The runtime gain did not hold when the rewritten script ran as written ({figure}): no change is "
                f"proposed.")

    def not_written(self) -> list[str]:
        """One line per reason a winner could not be written, ``"technique: reason"``; edits skipped for one reason
        (float16 and its GradScaler, two changes of one call) make one line, ``"a, b: reason"``."""
        by_why: dict[str, list[str]] = {}
        for e, why in self.edits_skipped:
            names = by_why.setdefault(why, [])
            if (e.technique or e.kind) not in names:
                names.append(e.technique or e.kind)
        return [f"{', '.join(names)}: {why}" for why, names in by_why.items()]

    def figure(self, j: Judgement) -> str:
        """``j``'s figure, with what it was judged against where that is not the unmodified script (a follow-up)."""
        against = next((c.against for c in self.candidates if c.name == j.variant and c.against), "")
        return f"{j.figure} against {against}" if against else j.figure

    def as_dict(self) -> dict[str, Any]:
        return {
            "command": self.command, "out_dir": str(self.out_dir), "headline": self.headline,
            "candidates": [c.name for c in self.candidates],
            "not_tried": [{"technique": t, "reason": r} for t, r in self.skipped],
            "judgements": [j.as_dict() for j in self.judgements], "winners": self.winners,
            "edits": [{"kind": e.kind, "line": e.line, "technique": e.technique} for e in self.edits_made],
            "not_written": [{"kind": e.kind, "line": e.line, "reason": r} for e, r in self.edits_skipped],
            "proof": self.proof.as_dict() if self.proof else None, "proven": self.proven,
            "busy": self.busy, "applied_to": self.applied_to, "backup": self.backup,
            "device": (self.probe.get("model") or {}).get("param_device"), "seconds": self.seconds,
            "diff": "change.diff" if self.diff else None, "python": self.python, "job": self.job,
            "user_files": self.user_files, "launch": self.launch,
        }


def interpreter_text(command: Command, probe: dict[str, Any] | None = None) -> str:
    """Which interpreter runs the user's command: ``"your `python` is /path/bin/python (Python 3.11.7, torch
    2.13.0): the interpreter tune runs under, as in an activated environment"``; the version and torch's once the
    probe has run (``probe``, its result)."""
    info = (probe or {}).get("python") or {}
    versions = ", ".join(x for x in (f"Python {info['version']}" if info.get("version") else "",
                                     f"torch {info['torch']}" if info.get("torch") else "") if x)
    exe = f"{command.python}{f' ({versions})' if versions else ''}"
    if command.launcher:
        return f"torchrun's processes run {exe} (torch.distributed.run of the interpreter tune runs under)"
    word = command.python_word or Path(command.python).name
    if "/" not in word and "\\" not in word:
        return f"your `{word}` is {exe}: the interpreter tune runs under, as in an activated environment"
    return f"with {exe}"


def files_text(files: Sequence[dict[str, str]]) -> str:
    """One line: the user's files a run changed and that were put back (``[{"path", "action"}]``)."""
    restored = [f["path"] for f in files if f["action"] == "restored"]
    removed = [f["path"] for f in files if f["action"] == "removed"]
    other = [f"{f['path']} ({f['action']})" for f in files if f["action"] not in ("restored", "removed")]
    parts = ([f"restored {', '.join(restored)} as it was before the run"] if restored else []) + \
        ([f"removed {', '.join(removed)}, which the run created"] if removed else []) + other
    return "your script wrote files outside tune's folder: " + "; ".join(parts)


def job_steps(probe: dict[str, Any]) -> tuple[int | None, str]:
    """The optimizer steps the command would run, projected from the probe (see :func:`job_effect`), and how they
    were counted; (None, why not) where the probe does not show them."""
    loops = [x for x in probe.get("loop_sites") or [] if x.get("batches")]
    loop = next((x for x in loops if x.get("epochs")), loops[0] if loops else None)
    # the loop's own batches where the probe counted them: a validation loop's are no gradient accumulation
    seen, drawn = int(probe.get("steps_seen") or 0), int(loop.get("drawn") if loop and "drawn" in loop
                                                         else probe.get("batches_drawn") or 0)
    if loop is None:
        return None, "the probe saw no loop over a DataLoader of known length in your files"
    if not loop.get("epochs"):
        return None, (f"the probe saw {loop['batches']} batches per epoch but no number of epochs in scope at the "
                      f"loop (epochs, args.epochs, ...), nor a for loop over range(N) around it")
    if not (seen and drawn):
        return None, "the probe saw no batch drawn before its optimizer steps"
    per_step = drawn / seen
    ep = loop["epochs"]
    return max(1, round(loop["batches"] * ep["value"] / per_step)), (
        f"{_count(loop['batches'], 'batch', 'batches')} per epoch x {_count(ep['value'], 'epoch')} ({ep['expr']})"
        + ("" if per_step == 1 else f" / {per_step:.2g} batches per optimizer step"))


def job_effect(res: "TuneResult") -> dict[str, Any]:
    """The proof's effect on the whole job, beside its per-step figure.

    The optimizer steps the command would run are projected from the probe: the batches per epoch of the loader the
    script loops over (``len(DataLoader)``) x its epochs (a positive int named ``epochs``, ``args.epochs`` and the
    like in scope at the loop: :func:`helpers.tune.hook._epochs_in`; else the ``for epoch in range(N)`` around it,
    :func:`helpers.tune.hook._epochs_from_range`) / the batches drawn per optimizer step
    (gradient accumulation). The start-up is measured: from the hook's start (before ``import torch``) to the first
    optimizer step, in each proof run. The projected whole-run time is start-up + (steps - 1) x the mean step time;
    what the script does after its last step (saving, a last evaluation) is not in it.

    Returns
    -------
    dict
        ``steps`` (int or None), ``how`` (how they were counted, or why not), and per ``"original"`` /
        ``"rewritten"``: ``startup_s`` (mean), ``startup_range_s`` ((min, max)), ``step_s`` (the proof's mean),
        ``projected_s`` (None without ``steps``); ``speedup`` (projected original / rewritten, None without). Empty
        without a proof. Seconds throughout.
    """
    if not res.proof_runs:
        return {}
    steps, how = job_steps(res.probe)
    out: dict[str, Any] = {"steps": steps, "how": how}
    for name, runs in res.proof_runs.items():
        ok = [r for r in runs if r.ok]
        starts = [float(r.result["first_step_s"]) for r in ok if r.result.get("first_step_s") is not None]
        times = [t for r in ok for t in r.step_times_s]
        if not starts or not times:
            continue
        start, step = sum(starts) / len(starts), sum(times) / len(times)
        judged = {"original": res.proof.base_ms, "rewritten": res.proof.variant_ms}.get(name) if res.proof else None
        if judged is not None and math.isfinite(judged):
            step = judged / 1e3  # the proof's own mean step (over whole blocks of steps), as its figure
        out[name] = {"startup_s": start, "startup_range_s": (min(starts), max(starts)), "step_s": step,
                     "projected_s": start + (steps - 1) * step if steps else None}
    a, b = out.get("original", {}).get("projected_s"), out.get("rewritten", {}).get("projected_s")
    out["speedup"] = a / b if a and b else None
    return out


def _count(n: float, one: str, many: str = "") -> str:
    """``"1 batch"``, ``"8 batches"``: ``n`` with the noun in its number."""
    return f"{n:g} {one if n == 1 else many or one + 's'}"


def job_text(job: dict[str, Any]) -> str:
    """One line for the terminal: the whole job's projected effect, or its start-up alone."""
    o, r = job.get("original"), job.get("rewritten")
    if not o or not r:
        return ""
    start = f"start-up {o['startup_s']:.1f} s against {r['startup_s']:.1f} s (yours, then changed; measured)"
    if not job.get("steps"):
        return f"the whole job: {start}; its steps are not known ({job['how']}), so only per-step figures"
    return (f"the whole job, projected: {job['steps']} optimizer steps, {job['how']}: {o['projected_s']:.0f} s "
            f"against {r['projected_s']:.0f} s, {job['speedup']:.2f}x; {start}")


def plan_edits(probe: dict[str, Any], winners: Sequence[Candidate], script: Path) -> list[Edit]:
    """The source edits that write ``winners`` into ``script``, at the call sites the probe captured.

    The loaders' settings of all the winners are merged into one edit per ``DataLoader(...)`` call. Edits of
    other files are returned too: :func:`_prove` writes only those of ``script`` (the file the proof runs) and
    reports the others as not written, with where they are.
    """
    script = str(script.resolve())
    edits: list[Edit] = []
    merged = cand_mod.merge_apply(list(winners))
    loader_kw = merged.get("loader") or {}
    if loader_kw:
        label = loader_label(list(loader_kw))
        for ld in probe.get("loaders") or []:
            kw = dict(loader_kw)
            if not kw.get("num_workers") and not ld["effective"].get("num_workers"):
                kw.pop("prefetch_factor", None)  # torch refuses these two without workers
                kw.pop("persistent_workers", None)
            if kw:
                edits.append(Edit("loader", ld["file"], ld["line"], kw, label))
    if merged.get("non_blocking"):
        for site in probe.get("to_sites") or []:
            edits.append(Edit("non_blocking", site["file"], site["line"], {}, "pin_memory"))
    model = probe.get("model") or {}
    if merged.get("autocast"):
        sites = probe.get("forward_sites") or []
        if sites:
            best = max(sites, key=lambda s: s["count"])
            edits.append(Edit("autocast", best["file"], best["line"],
                              {"device_type": model.get("param_device") or "cpu", "dtype": merged["autocast"]},
                              "autocast"))
    if merged.get("grad_scaler"):
        steps = probe.get("step_sites") or []
        if steps:  # its lines in the file of the optimizer's step (where the loop is); others are named
            step = max(steps, key=lambda x: x["count"])
            sites = [("backward", x) for x in probe.get("backward_sites") or []] + \
                [("clip", x) for x in probe.get("clip_sites") or []]
            edits.append(Edit("grad_scaler", step["file"], step["line"], {
                "device_type": model.get("param_device") or "cpu",
                "backward": sorted(x["line"] for kind, x in sites if kind == "backward" and x["file"] == step["file"]),
                "clip": sorted(x["line"] for kind, x in sites if kind == "clip" and x["file"] == step["file"]),
                "elsewhere": [(x["file"], x["line"]) for _, x in sites if x["file"] != step["file"]]}, "autocast"))
    if merged.get("cudnn_benchmark"):
        opt = probe.get("optimizer") or {}
        if opt.get("file"):
            edits.append(Edit("cudnn_benchmark", opt["file"], opt["line"], {}, "cudnn_benchmark"))
    if merged.get("channels_last"):
        opt = probe.get("optimizer") or {}
        names = opt.get("model_names") or []
        ddp = probe.get("ddp_sites") or []
        if model.get("wrapper") == "DistributedDataParallel" and ddp:  # before DDP builds its gradient buckets
            edits.append(Edit("channels_last", ddp[0]["file"], ddp[0]["line"], {"wrap_arg": True}, "channels_last"))
        elif opt.get("file") and names:
            edits.append(Edit("channels_last", opt["file"], opt["line"], {"name": names[0], "assign": True},
                              "channels_last"))
    if merged.get("prefetch"):
        for site in [x for x in probe.get("loop_sites") or [] if x.get("is_for", True)]:  # a peek is no loop
            edits.append(Edit("prefetch", site["file"], site["line"], {"device": site.get("device_expr")},
                              "side_stream"))
    edits += cand_mod.general_edits(probe, merged)  # the Guide's general items (debugging APIs, no_grad, ...)
    edits += cand_mod.ddp_edits(probe, merged)  # DistributedDataParallel's (notebook 08)
    edits += compile_edits(probe, merged)  # model.compile(), where the model is built
    edits += cpu_mod.cpu_edits(probe, merged, script)  # torch.set_num_threads (the allocator is the launch command)
    edits += dev_mod.device_edits(probe, merged)  # TF32/HF32 (CUDA, NPU)
    for c in winners:  # a framework's setting: keywords of its call in the script
        edits += call_edits(c, script)
    return edits


def call_edits(c: Candidate, script: str | Path) -> list[Edit]:
    """The source edits a candidate carries (its ``apply["edits"]``), in ``script``: ``call_keywords`` of a call a
    framework owns, or the edit its ``kind`` names with its ``params`` (a device candidate's)."""
    return [Edit(e["kind"], str(script), e["line"], dict(e.get("params") or {}), c.technique) if "kind" in e else
            Edit("call_keywords", str(script), e["line"], {"call": e["call"], "values": e["values"]}, c.technique)
            for e in c.apply.get("edits") or []]


def _best_per_technique(cands: Sequence[Candidate], judgements: Sequence[Judgement]) -> list[Candidate]:
    by_name = {j.variant: j for j in judgements}
    best: dict[str, tuple[float, Candidate]] = {}
    for c in cands:
        j = by_name.get(c.name)
        if j is None or j.verdict != "faster":
            continue
        if c.technique not in best or j.speedup > best[c.technique][0]:
            best[c.technique] = (j.speedup, c)
    return [c for _, c in sorted(best.values(), key=lambda x: -x[0])]


def tune(command: Command, out_dir: Path, options: TuneOptions = TuneOptions(), *, apply: bool = False,
         progress: Callable[[str], None] | None = None) -> TuneResult:
    """Run a whole session (see the module docstring) and write its folder.

    Parameters
    ----------
    command : Command
        The user's command (:func:`helpers.tune.engine.parse_command`).
    out_dir : pathlib.Path
        The run folder to create (``tune-runs/tune-<time>/``); created only once the probe succeeded.
    options : TuneOptions
    apply : bool
        Edit the script in place once the rewritten copy is proven faster, keeping a backup beside it.
    progress : callable, optional
        Called with one line per run.

    Returns
    -------
    TuneResult

    Raises
    ------
    ScriptError
        When the unmodified script fails, hangs, makes no optimizer step or too few, or its loss is not finite
        (its own traceback in ``.log``); nothing is written then.
    """
    say = progress or (lambda line: None)
    t_start = time.perf_counter()
    if command.script is None:
        raise ParameterError("tune: python -m MODULE needs the module's file, to edit it: give python -m "
                             "package.train from the folder that holds package/")
    scratch = Path(tempfile.mkdtemp(prefix="workbook-tune-"))
    try:
        say(f"probe: running your script unmodified for up to {options.warmup + options.steps + 1} optimizer steps, "
            f"{interpreter_text(command)}")
        probe = run_once(command, "probe", {}, workdir=scratch, warmup=options.warmup, steps=options.steps,
                         timeout_s=options.timeout_s, round_=-1, watch_copies=_may_have_device(),
                         still=lambda line: say(f"probe: {line}"), stall_floor_s=PROBE_STALL_FLOOR_S)
        if probe.result.get("user_files"):
            say(f"probe: {files_text(probe.result['user_files'])}")
        _check_probe(probe, options)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    timeout = 3.0 * probe.wall_s + 60.0
    out_dir.mkdir(parents=True, exist_ok=False)
    work = out_dir / "runs"
    res = TuneResult(str(command), out_dir, probe.result, script_dir=str(command.script.parent), options=options,
                     python=interpreter_text(command, probe.result))
    # a run whose steps stop advancing is ended (engine.stalled), at 10x the probe's slowest step; before its first
    # step only the timeout applies (a change may spend its start compiling)
    stall = {"stall_step_s": max(probe.result.get("all_step_times_s") or probe.step_times_s)}
    watch = (probe.result.get("model") or {}).get("param_device") in ("cuda", "npu")
    say(f"probe: {probe.result['steps_seen']} steps, "
        f"{1e3 * sorted(probe.step_times_s)[len(probe.step_times_s) // 2]:.1f} ms/step, {probe.wall_s:.1f} s")

    # every process of a torchrun job gets its share of the cores for its DataLoader workers
    cores = max(1, usable_cores() // command.nproc)
    res.candidates, res.skipped = cand_mod.choose(probe.result, cores=cores)
    if any(c.technique == "compile" for c in res.candidates):  # its first step holds the compilation
        timeout += COMPILE_TIMEOUT_S
    res.cores = cores
    if probe.result.get("frameworks"):  # settings a framework owns: keywords of its call in the script
        res.framework_calls = framework_calls(command.script.read_text(encoding="utf-8"))
        fw, fw_skipped = cand_mod.framework_candidates(res.framework_calls, probe.result, cores=cores)
        owned = {c.technique for c in fw}
        res.candidates = [c for c in res.candidates if c.technique not in owned] + fw
        res.skipped = [s for s in res.skipped if s[0] not in owned] + fw_skipped
    more, why = cpu_mod.cpu_candidates(probe.result, cores=cores,  # the threads and the allocator (the Guide's CPU)
                                       workers_tried=any(c.technique == "num_workers" for c in res.candidates))
    res.candidates, res.skipped = res.candidates + more, res.skipped + why
    more, why = dev_mod.device_candidates(probe.result)  # TF32/HF32, host syncs, host-made tensors (CUDA, NPU)
    res.candidates, res.skipped = res.candidates + more, res.skipped + why
    if options.skip:  # left out by the user: said once each, whatever tune would have said of it
        gone = set(options.skip)
        res.candidates = [c for c in res.candidates if c.technique not in gone]
        res.skipped = [s for s in res.skipped if s[0] not in gone] + [(t, "left out with --skip") for t in options.skip]
    jsonl = out_dir / "results.jsonl"
    built = [v for v in (_variant(c, command, work, res) for c in res.candidates) if v is not None]
    res.candidates = [c for c in res.candidates if any(v[0] == c.name for v in built)]
    if res.candidates:
        variants = [("unmodified", {}, None)] + built
        probe_step = sorted(probe.step_times_s)[len(probe.step_times_s) // 2]
        runs, busy = measure(command, variants, rounds=options.rounds, workdir=work, warmup=options.warmup,
                             steps=options.steps, timeout_s=timeout, watch_copies=watch,
                             give_up_step_s=GIVE_UP_RATIO * probe_step, progress=say, **stall,
                             decided=lambda name, run, ref: cannot_pay(run, ref, job_steps(res.probe)[0]))
        _append(jsonl, [r for rs in runs.values() for r in rs])
        res.runs += [r for rs in runs.values() for r in rs]
        res.busy = f"while the changes ran, {busy.sentence()}"
        base = runs["unmodified"]
        if not all(r.ok for r in base):
            bad = next(r for r in base if not r.ok)
            raise ScriptError(f"your script failed in an unmodified run (round {bad.round + 1}) after it had run "
                              f"once: {bad.status}", bad.error)
        res.judgements = [judge(c.name, base, runs[c.name], busy) for c in res.candidates]
        steps_how = job_steps(res.probe)  # torch.compile pays only in a job longer than its break-even
        res.judgements = [compile_judgement(j, runs[c.name], res.probe, *steps_how, base=base)
                          if c.technique == "compile" else j for c, j in zip(res.candidates, res.judgements)]
        winners = _best_per_technique(res.candidates, res.judgements)
        winners = _follow_up(command, winners, res, options, work, timeout, watch, say, stall)
        res.winners = [c.name for c in winners]
        for attempt in _attempts(winners, res.probe, command.script):
            if _prove(command, attempt, res, options, work, timeout, watch, say, stall):
                break
    res.job = job_effect(res)
    _write_outputs(res, command, apply)
    res.seconds = time.perf_counter() - t_start
    (out_dir / "summary.json").write_text(json.dumps(res.as_dict(), indent=2, default=str), encoding="utf-8")
    write_report(res)
    return res


def _attempts(winners: list[Candidate], probe: dict[str, Any], script: Path) -> list[list[Candidate]]:
    """What the proof tries, in order: all the winners, then, where more than one can be written into the script,
    the best of those alone (a winner whose call is in another file cannot be: falling back to it proves nothing)."""
    here = str(script.resolve())
    writable = [c for c in winners if cpu_mod.launch_apply([c])
                or any(e.file == here for e in plan_edits(probe, [c], script))]
    return ([winners] if winners else []) + ([writable[:1]] if len(writable) > 1 else [])


def _follow_up(command: Command, winners: list[Candidate], res: TuneResult, options: TuneOptions, work: Path,
               timeout: float, watch: bool, say: Callable[[str], None],
               stall: dict[str, float] | None = None) -> list[Candidate]:
    """Measure the follow-ups of the winning workers tune added (:func:`helpers.tune.candidates.follow_up`:
    ``prefetch_factor``; :func:`helpers.tune.candidates_cpu.threads_follow_up`: ``torch.set_num_threads``), each
    against the winner it builds on, interleaved; each one faster than it takes that winner's place (both, where
    both are: their DataLoader settings merge)."""
    extras: list[Candidate] = []
    for technique, (extra, why_not) in (
            ("prefetch_factor", cand_mod.follow_up(winners, res.probe, res.framework_calls)),
            ("intra_op_threads", cpu_mod.threads_follow_up(winners, res.probe, cores=res.cores or usable_cores()))):
        if technique in options.skip:  # the user left it out (said under "Not tried" already)
            continue
        if extra is None:
            if why_not:
                res.skipped.append((technique, why_not))
        elif _variant(extra, command, work, res) is not None:
            extras.append(extra)
    if not extras:
        return winners
    base = next(c for c in winners if c.name == extras[0].against)
    say(f"follow-up: {', '.join(x.name for x in extras)} against {base.name}")
    ref = _variant(base, command, work, res)
    runs, busy = measure(command, [ref] + [_variant(x, command, work, res) for x in extras], rounds=options.rounds,
                         workdir=work / "follow-up", warmup=options.warmup, steps=options.steps, timeout_s=timeout,
                         watch_copies=watch, progress=say, **(stall or {}))
    _append(res.out_dir / "results.jsonl", [r for rs in runs.values() for r in rs])
    res.runs += [r for rs in runs.values() for r in rs]
    res.busy += f"; while the follow-up ran, {busy.sentence()}"
    faster = []
    for extra in extras:
        j = judge(extra.name, runs[base.name], runs[extra.name], busy)
        res.candidates.append(extra)
        res.judgements.append(j)
        if j.verdict == "faster":
            faster.append(extra)
    if not faster:
        return winners
    taken = {x.technique for x in faster}  # a first-round winner of the same technique gives way to its follow-up
    return [x for c in winners for x in (faster if c is base else [] if c.technique in taken else [c])]


def _prove(command: Command, winners: Sequence[Candidate], res: TuneResult, options: TuneOptions, work: Path,
           timeout: float, watch: bool, say: Callable[[str], None], stall: dict[str, float] | None = None) -> bool:
    """Write ``winners`` into a copy of the script and measure it as written against the original; a winner that
    is a launch setting (the allocator's ``LD_PRELOAD``) launches the rewritten run (or, with no edit, the original
    file) with it."""
    script = command.script
    assert script is not None
    source = script.read_text(encoding="utf-8")
    edits, split = _float16_in_one_file(plan_edits(res.probe, winners, script), script, command)
    here = [e for e in edits if e.file == str(script.resolve())]
    elsewhere: list[tuple[Edit, list[str]]] = []
    for e in edits:
        if e in here:
            continue
        advice: list[str] = []
        if e.kind == "loader":  # a value read from an option of the script is written as that option's default
            try:
                own, advice = loader_elsewhere(Path(e.file).read_text(encoding="utf-8"), e,
                                               script=str(script.resolve()), script_source=source,
                                               passed=command.args)
            except OSError:
                own = []
            here += own
            if own and not advice:
                continue
        elsewhere.append((e, advice))
    new, made, skipped = apply_edits(source, here, passed=command.args)
    skipped += split
    for e, advice in elsewhere:
        if not advice:
            what = f"set it there: {_edit_text(e)}"
        elif any(" " in a for a in advice):  # clauses, not plain keywords
            what = f"there, {'; '.join(advice)}"
        else:
            what = f"set it there: DataLoader(..., {', '.join(advice)})"
        skipped.append((e, f"the call is in {_where(e.file, command)}, line {e.line}: tune edits only the script "
                           f"you gave; {what}"))
    res.edits_made, res.edits_skipped = made, skipped
    launch = cpu_mod.launch_apply(winners)
    if not made and not launch:
        return False
    candidate_file = work / f"{script.stem}.candidate.py" if made else None
    if candidate_file is not None:
        candidate_file.write_text(new, encoding="utf-8")
    written = techniques_of(made) | {c.technique for c in winners if cpu_mod.launch_apply([c])}
    launch_line = cpu_mod.launch_text(command, launch)
    res.launch_tried = launch_line if not made else ""
    if res.launch_tried:
        say(f"proof: your script launched as `{launch_line}` against it as you run it")
    else:
        launched = f", launched as `{launch_line}`" if launch_line else ""
        say(f"proof: the rewritten script ({', '.join(sorted(written))}{launched}) against yours, as written")
    runs, busy = measure(command, [("original", {}, None), ("rewritten", launch, candidate_file)],
                         rounds=options.rounds,
                         workdir=work / ("proof" if not res.proof_tries else f"proof-{res.proof_tries + 1}"),
                         warmup=options.warmup, steps=options.steps, timeout_s=timeout,
                         watch_copies=watch, progress=say, **(stall or {}))
    _append(res.out_dir / "results.jsonl", [r for rs in runs.values() for r in rs])
    res.runs += [r for rs in runs.values() for r in rs]
    res.proof = judge("rewritten", runs["original"], runs["rewritten"], busy)
    res.proof_runs = runs
    if res.proof.verdict == "rejected":  # said in the headline even where a later, smaller proof replaces it
        res.proof_failures.append(f"{', '.join(sorted(written))}: {res.proof.reason.splitlines()[0]}")
    res.busy += f"; while the proof ran{' (the best change alone)' if res.proof_tries else ''}, {busy.sentence()}"
    res.proof_tries += 1
    if res.proof.verdict == "faster":
        res.diff = unified_diff(source, new, script.name) if made else ""
        res.proven = [c.name for c in winners if c.technique in written]  # what the diff holds, not what won
        res.rewritten = new if made else ""
        res.launch = launch_line
        return True
    return False


def _float16_in_one_file(edits: list[Edit], script: Path,
                         command: Command) -> tuple[list[Edit], list[tuple[Edit, str]]]:
    """``edits`` without float16's autocast and GradScaler edits where any of their lines (the forward, a
    backward(), a clip, the step) lies outside the script: tune writes only the script, and float16 without all of
    its scaler's lines would train wrongly. Those edits come back as skipped, with the line outside."""
    group = [e for e in edits if float16_part(e)]
    mine = str(script.resolve())
    outside = [(e.file, e.line) for e in group if e.file != mine]
    outside += [tuple(x) for e in group for x in e.params.get("elsewhere") or []]
    if not outside:
        return edits, []
    file, line = outside[0]
    why = (f"float16 autocast and its GradScaler are written together or not at all, and one of their lines is in "
           f"{_where(file, command)}, line {line}: tune edits only the script you gave")
    return [e for e in edits if e not in group], [(e, why) for e in group]


def _variant(c: Candidate, command: Command, work: Path, res: TuneResult) -> tuple[str, dict, Path | None] | None:
    """How a candidate runs: its runtime changes on the unmodified script, or, for a framework's setting, an
    edited copy of the script (None, with the reason in ``res.skipped``, where the edit cannot be placed)."""
    script = command.script
    edits = call_edits(c, script)
    if not edits:
        return c.name, c.apply, None
    runtime = {k: v for k, v in c.apply.items() if k != "edits"}  # a follow-up's threads on top of the edit
    new, made, skipped = apply_edits(script.read_text(encoding="utf-8"), edits)
    if skipped:
        res.skipped.append((c.technique, f"{c.name}: {skipped[0][1]}"))
        return None
    path = work / "variants" / f"{script.stem}.{''.join(ch if ch.isalnum() else '_' for ch in c.name)}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new, encoding="utf-8")
    return c.name, runtime, path


def _where(file: str, command: Command) -> str:
    """``file`` relative to the script's folder where it is under it."""
    try:
        return str(Path(file).relative_to(command.script.parent if command.script else command.cwd))
    except ValueError:
        return file


def _edit_text(e: Edit) -> str:
    """The change an edit makes, as the words to type."""
    if e.kind == "loader":
        return "DataLoader(..., " + ", ".join(f"{k}={v!r}" for k, v in e.params.items()) + ")"
    if e.kind == "call_keywords":
        values = e.params.get("values") or {}
        return f"{e.params.get('call')}(..., " + ", ".join(f"{k}={v!r}" for k, v in values.items()) + ")"
    return {"non_blocking": ".to(device, non_blocking=True)",
            "autocast": f"with torch.autocast(device_type={e.params.get('device_type', 'cpu')!r}, "
                        f"dtype=torch.{e.params.get('dtype', 'bfloat16')}): around the forward",
            "channels_last": "DistributedDataParallel(module.to(memory_format=torch.channels_last), ...)"
                             if e.params.get("wrap_arg") else
                             f"{e.params.get('name', 'model')} = {e.params.get('name', 'model')}"
                             f".to(memory_format=torch.channels_last)",
            "cudnn_benchmark": "torch.backends.cudnn.benchmark = True",
            "compile": f"{e.params.get('code')} before the optimizer is built",
            "grad_scaler": f"grad_scaler = torch.amp.GradScaler({e.params.get('device_type', 'cuda')!r}); "
                           f"grad_scaler.scale(loss).backward(); grad_scaler.unscale_(optimizer) before a clip; "
                           f"grad_scaler.step(optimizer); grad_scaler.update()",
            "prefetch": f"for ... in prefetch(loader, {e.params.get('device') or 'device'}): with notebook 05's "
                        f"prefetch() added to the file",
            "set_threads": f"torch.set_num_threads({e.params.get('threads')}) after the script's imports",
            "debug_off": f"remove {e.params.get('api', 'the debugging API')}(...) from the training process",
            "no_grad": "with torch.no_grad(): around the validation loop (or the forward call)",
            "no_sync": f"with {e.params.get('name') or 'model'}.no_sync() if <not the step's condition> else "
                       f"contextlib.nullcontext(): around the forward and backward() of each micro-step",
            "ddp_keywords": "DistributedDataParallel(..., " + ", ".join(
                f"{k}={v!r}" for k, v in (e.params.get("values") or {}).items()) + ")",
            "comm_hook": f"model.register_comm_hook(None, default_hooks.{e.params.get('dtype', 'fp16')}"
                         f"_compress_hook)",
            "matmul_precision": 'torch.set_float32_matmul_precision("high")' if e.params.get("device") != "npu"
                                else "torch.npu.matmul.allow_hf32 = True",
            "device_factory": "torch.zeros(..., device=device) for torch.zeros(...).to(device)",
            "sync_every": f"if {e.params.get('index') or 'step'} % {e.params.get('every', 10)} == 0: around the "
                          f"logging line"}.get(e.kind, e.kind)


def _write_outputs(res: TuneResult, command: Command, apply: bool) -> None:
    """The diff and the rewritten file (only when proven), and the in-place edit with its backup."""
    if not res.diff:
        return
    script = command.script
    assert script is not None
    new = res.rewritten
    tmp = res.out_dir / "change.diff.tmp"
    tmp.write_text(res.diff, encoding="utf-8")
    (res.out_dir / script.name).write_text(new, encoding="utf-8")
    tmp.replace(res.out_dir / "change.diff")
    if apply:
        backup = script.with_name(script.name + ".orig")
        k = 1
        while backup.exists():
            k += 1
            backup = script.with_name(f"{script.name}.orig{k}")
        shutil.copy2(script, backup)
        script.write_text(new, encoding="utf-8")
        res.applied_to, res.backup = str(script), str(backup)


def _append(path: Path, runs: Sequence[Run]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        for r in runs:
            f.write(json.dumps(r.record()) + "\n")


def _may_have_device() -> bool:
    """Whether the probe should watch host-to-device copies (a CUDA device visible, or torch_npu installed)."""
    import importlib.util

    if importlib.util.find_spec("torch_npu") is not None:
        return True
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        return False


def _check_probe(probe: Run, options: TuneOptions) -> None:
    """Raise :class:`ScriptError` when the unmodified script cannot be tuned."""
    if probe.status == "stalled":
        raise ScriptError(f"your script, unmodified, stopped making optimizer steps: "
                          f"{probe.result.get('progress')}; its last output is above", probe.error)
    if probe.status == "timeout":
        far = probe.result.get("progress")
        raise ScriptError(f"your script, unmodified, made no result within {options.timeout_s:.0f} s (--timeout): "
                          f"it hangs, or it spends that long before its first {options.warmup + options.steps + 1} "
                          f"optimizer steps" + (f" ({far})" if far else ""), probe.error)
    if probe.status in ("error", "exit"):
        raise ScriptError("your script failed on its own, unmodified (its traceback is above); tune wrote nothing",
                          probe.error)
    seen = int(probe.result.get("steps_seen") or 0)
    if seen == 0:
        raise ScriptError("your script ended without an optimizer step (no optimizer.step() ran): tune measures "
                          "training steps; run it with arguments that train", probe.error)
    need = options.warmup + 3
    if seen < need + 1:
        raise ScriptError(f"your script made only {seen} optimizer steps; tune needs at least {need + 1} "
                          f"({options.warmup} warm-up + 3 timed): pass arguments that train longer, or lower "
                          f"--warmup", "")
    k = nonfinite_step(probe)
    if k is not None:
        raise ScriptError(f"your job diverges: its loss is {probe.losses[k]} at step {k + 1} unmodified, "
                          f"{FIX_DIVERGENCE}", "")
    grows = exploding(probe)
    if grows is not None:
        start, end, n = grows
        raise ScriptError(f"your job diverges: its loss grows from {start:.3g} to {end:.3g} over {n} steps "
                          f"unmodified, {FIX_DIVERGENCE}", "")
    if not probe.step_times_s or any(math.isnan(t) for t in probe.step_times_s):
        raise ScriptError("the probe timed no step", "")
