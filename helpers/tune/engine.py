"""Run the user's script in separate processes, interleaved, and judge each change against the unmodified script.

One *run* is one process: ``python -m helpers.tune.hook SPEC.json`` (:mod:`helpers.tune.hook`), stopped after
``warmup + steps`` optimizer steps; its figures are the measured steps' times (seconds, device-synchronized where
the model is on a device) and the loss at each step. For a torchrun command a run is a torchrun job on this
machine (``torch.distributed.run --standalone``) with the hook in every rank; its step times are the slowest
rank's, step by step. A *variant* is the unmodified script with a set of runtime changes, or a file as written
(the rewritten script, or a copy with a framework's call edited). :func:`measure` runs the variants round-robin,
``rounds`` times, each round in a rotated order, so that a drift of the machine falls on every variant alike.

:func:`judge` compares a variant with the baseline: the ratio of the mean step times over all the measured
steps of each (the ratio of throughputs: a rare long step, a batch that stalled on a slow read, counts in full),
with its percentile-bootstrap interval over blocks of steps (:func:`helpers.timing.bootstrap_ratio_ci`); the ratio
of each round alone, which must fall on the same side of 1 as the whole (a cross-check: one disturbed round
cannot make the verdict); the busy-machine check over the whole measurement (:func:`helpers.machine.check`);
and the results check: a variant whose run failed, hung, whose loss became NaN or inf, or whose mean loss over
the measured steps moved beyond the tolerance (:func:`loss_tolerance`) is rejected with the reason.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from helpers import machine
from helpers.errors import ParameterError, WorkbookError
from helpers.timing import bootstrap_ratio_ci
from helpers.tune.hook import PROGRESS_SUFFIX, rank_file

__all__ = ["Command", "Run", "Judgement", "ScriptError", "parse_command", "run_once", "measure", "judge",
           "loss_tolerance", "exploding", "THRESHOLD"]

#: Smallest speedup that counts as worth a change (5%): the notebooks' A/B threshold
#: (:meth:`helpers.timing.Comparison.outcome`'s default).
THRESHOLD = 1.05
#: Seconds between the "still running" lines of a run given ``still`` (the probe: a script may index its dataset
#: for minutes before its first step).
STILL_EVERY_S = 15.0
#: How :func:`judge` names the early-stop rule (helpers.tune.session.GIVE_UP_RATIO: 2.5).
GIVE_UP_TEXT = "2.5x"
#: Consecutive steps averaged into one unit of the bootstrap. A step's own time is bimodal where DataLoader
#: workers feed it (a step whose batch is ready, a step that waits), and steps next to each other are not
#: independent (a stalled batch lets the next ones arrive at once); blocks of steps are close to independent.
BLOCK = 5
#: Relative tolerance on the mean loss of the measured steps (10%), below which a change is taken to learn as
#: the unmodified script does, unless the unmodified runs themselves differ more (three times their spread).
#: A screen for a broken change (a wrong dtype, a lost gradient), not a convergence proof: notebook 10 checks
#: learning over a longer run.
LOSS_RTOL = 0.10


class ScriptError(WorkbookError):
    """The user's script failed on its own (unmodified): its traceback is in :attr:`log`."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


@dataclass(frozen=True)
class Command:
    """The user's command: ``python train.py ARGS``, or ``torchrun --nproc-per-node N train.py ARGS`` on this
    machine (``nproc`` > 1: every run is a torchrun job of that many processes, ``--standalone``).

    Attributes
    ----------
    python : str
        The interpreter (the first word of the command).
    script : pathlib.Path or None
        The script file, absolute (None with ``module``).
    module : str or None
        The module of ``-m``.
    args : tuple of str
        The script's own arguments.
    cwd : pathlib.Path
        The folder the command runs in (the user's current folder).
    nproc : int
        Processes per run: 1 for ``python train.py``, torchrun's ``--nproc-per-node`` for a torchrun command
        (which always runs under torchrun, even with 1).
    launcher : str
        "" for ``python train.py``, "torchrun" for a torchrun command.
    """

    python: str
    script: Path | None
    module: str | None
    args: tuple[str, ...]
    cwd: Path
    nproc: int = 1
    launcher: str = ""

    @property
    def argv(self) -> list[str]:
        """``sys.argv`` as the script sees it."""
        return [str(self.script) if self.script else self.module or ""] + list(self.args)

    @property
    def roots(self) -> list[str]:
        """Folders whose files count as the user's own (the script's folder and the current folder)."""
        out = [str(self.cwd)]
        if self.script is not None:
            out.insert(0, str(self.script.parent))
        return out

    def __str__(self) -> str:
        target = str(self.script) if self.script else f"-m {self.module}"
        head = [f"torchrun --nproc-per-node {self.nproc}"] if self.launcher else [Path(self.python).name]
        return " ".join([*head, target, *self.args])

    def process(self, spec_path: Path) -> list[str]:
        """The command line of one run of the hook (:mod:`helpers.tune.hook`) with ``spec_path``: the hook as a
        module of this interpreter, under ``torch.distributed.run --standalone`` for a torchrun command (a free
        rendezvous port each run, no restarts: a failing rank fails the run)."""
        if not self.launcher:
            return [self.python, "-m", "helpers.tune.hook", str(spec_path)]
        return [self.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(self.nproc),
                "--max-restarts", "0", "-m", "helpers.tune.hook", str(spec_path)]


def parse_command(words: Sequence[str], cwd: str | os.PathLike | None = None) -> Command:
    """Read ``python train.py ARGS`` or ``torchrun [--nproc-per-node N] train.py ARGS`` (also ``python -m
    torch.distributed.run ...``) from the words after ``--``.

    Raises
    ------
    ParameterError
        With no command, a first word that is neither a Python interpreter nor torchrun (a shell script),
        interpreter options such as ``-m``, torchrun options for more than this machine (``--nnodes`` above 1) or
        for a module or a non-Python program (``-m``, ``--no-python``), or a script file that does not exist.
    """
    words = list(words)
    cwd = Path(cwd or os.getcwd()).resolve()
    if not words:
        raise ParameterError("tune: give the command that trains, after --: workbook tune -- python train.py ARGS")
    first = Path(words[0]).name
    if first == "torchrun":
        return _parse_torchrun(words[1:], cwd)
    if first.startswith("python") and words[1:3] == ["-m", "torch.distributed.run"]:
        return _parse_torchrun(words[3:], cwd)
    if not first.startswith("python"):
        raise ParameterError(f"tune: the command must start with a Python interpreter or torchrun (python train.py "
                             f"ARGS, torchrun --nproc-per-node 2 train.py ARGS), got {words[0]!r}")
    if len(words) < 2:
        raise ParameterError("tune: give the script after the interpreter: python train.py ARGS")
    # a bare "python" means this environment's interpreter (the one running the workbook, with torch), as it does
    # when the environment is activated; a path names an interpreter of the user's choice
    python = sys.executable if "/" not in words[0] and "\\" not in words[0] else words[0]
    if words[1] == "-m":
        target = words[2].replace(".", "/") + ".py" if len(words) > 2 else "package/train.py"
        raise ParameterError(f"tune: python -m is not supported: tune edits a script file, so give the module's file: "
                             f"python {target} ARGS")
    if words[1].startswith("-"):
        raise ParameterError(f"tune: interpreter option {words[1]!r} is not supported; give python train.py ARGS")
    return Command(python, _script(words[1], cwd), None, tuple(words[2:]), cwd)


def _script(word: str, cwd: Path) -> Path:
    script = (cwd / word).resolve()
    if script.is_dir():
        raise ParameterError(f"tune: {word!r} is a folder; give the training script in it: python "
                             f"{word.rstrip('/')}/train.py ARGS")
    if not script.is_file():
        raise ParameterError(f"tune: the script {word!r} does not exist (looked for {script})")
    if script.suffix != ".py":
        raise ParameterError(f"tune: {word!r} is not a .py file; tune edits Python scripts")
    return script


def _parse_torchrun(words: list[str], cwd: Path) -> Command:
    """A torchrun command's options and script, read with torchrun's own argument parser."""
    import contextlib
    import io

    from torch.distributed.run import get_args_parser

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            args = get_args_parser().parse_args(words)
    except SystemExit:
        why = (said.getvalue().strip().splitlines() or ["bad options"])[-1]
        raise ParameterError(f"tune: torchrun could not read its options ({why}); give torchrun "
                             "--nproc-per-node N train.py ARGS") from None
    if args.module or args.no_python:
        raise ParameterError("tune: torchrun -m and --no-python are not supported: tune edits a script file, so "
                             "give it: torchrun --nproc-per-node N train.py ARGS")
    if str(args.nnodes) not in ("1", "1:1"):
        raise ParameterError(f"tune: --nnodes {args.nnodes}: tune runs the job on this machine only; give "
                             "--nnodes 1 (the change it finds applies to every node alike)")
    if not str(args.nproc_per_node).isdigit() or int(args.nproc_per_node) < 1:
        raise ParameterError(f"tune: --nproc-per-node {args.nproc_per_node!r}: give a number of processes, 1 or "
                             "more, e.g. --nproc-per-node 2 (tune does not resolve torchrun's auto, cpu or gpu: "
                             "name the count your job uses)")
    return Command(sys.executable, _script(args.training_script, cwd), None, tuple(args.training_script_args), cwd,
                   nproc=int(args.nproc_per_node), launcher="torchrun")


@dataclass
class Run:
    """One process of one variant.

    Attributes
    ----------
    variant : str
    round : int
        0-based round (-1 for the probe).
    status : str
        ``"steps"`` (stopped after its steps), ``"script_end"`` (the script ended first), ``"slow"`` (stopped early,
        far slower than the reference), ``"exit"``, ``"error"``, ``"timeout"``.
    step_times_s : list of float
        The measured steps' times, seconds.
    losses : list of float or None
        The loss at every step (warm-up included); None where no scalar ``backward`` preceded the step.
    wall_s : float
        The process's wall time, seconds.
    error : str
        The traceback or the reason, for a failed run.
    result : dict
        The hook's whole result (call sites, model, loaders).
    """

    variant: str
    round: int
    status: str
    step_times_s: list[float]
    losses: list[float | None]
    wall_s: float
    error: str = ""
    result: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return self.status in ("steps", "script_end") and bool(self.step_times_s)

    def record(self) -> dict[str, Any]:
        """One line of results.jsonl."""
        d = asdict(self)
        d.pop("result")
        return d


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hook_env(command: Command) -> dict[str, str]:
    """The environment of a run: the user's, helpers importable, and a world of one for a script written for
    torchrun but given as ``python train.py`` (under torchrun, torchrun sets each rank's)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if command.launcher:
        return env
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(_free_port()))):
        env.setdefault(key, value)
    return env


def run_once(command: Command, variant: str, apply: dict[str, Any], *, workdir: Path, warmup: int, steps: int,
             timeout_s: float, round_: int = 0, script: Path | None = None, watch_copies: bool = False,
             give_up_step_s: float | None = None, still: Callable[[str], None] | None = None) -> Run:
    """Run the script once under the hook.

    Parameters
    ----------
    command : Command
    variant : str
        The variant's name (file names, records).
    apply : dict
        The runtime changes (the hook spec's ``apply``).
    workdir : pathlib.Path
        Where the spec, the result, the logs and the redirected ``torch.save`` files go.
    warmup, steps : int
        Untimed and timed optimizer steps.
    timeout_s : float
        The run's limit, seconds: past it the process group is killed and the run is ``"timeout"``.
    round_ : int
    script : pathlib.Path, optional
        A file to run instead of ``command.script`` (the rewritten file), executed as if it were the original
        (its ``__file__`` and frames name the original path, so paths relative to the script still work).
    watch_copies : bool
        Record host-to-device copies (only where a device may be in use).
    still : callable, optional
        Called with a line every :data:`STILL_EVERY_S` seconds while the run goes on (its steps so far).
    give_up_step_s : float, optional
        Stop the run as ``"slow"`` when the median of its steps 2 to 1 + :data:`helpers.tune.hook.GIVE_UP_AFTER`
        exceeds this, seconds.

    Returns
    -------
    Run
    """
    tag = f"{variant.replace(' ', '_').replace('=', '').replace('+', '')}-r{round_}"
    workdir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": command.argv, "script": str(command.script) if command.script else None,
            "module": command.module, "source": str(script) if script else None,
            "warmup": warmup, "steps": steps, "out": str(workdir / f"{tag}.json"), "scratch": str(workdir),
            "apply": apply, "user_roots": command.roots, "watch_copies": watch_copies,
            "give_up_step_s": give_up_step_s, "world": command.nproc}
    spec_path = workdir / f"{tag}.spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    out_path = Path(spec["out"])
    out_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    with open(workdir / f"{tag}.log", "wb") as log:
        proc = subprocess.Popen(command.process(spec_path), cwd=command.cwd,
                                env=_hook_env(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            while still is not None and time.perf_counter() - t0 + STILL_EVERY_S < timeout_s:
                try:
                    proc.wait(timeout=STILL_EVERY_S)
                    break
                except subprocess.TimeoutExpired:  # a long start (a dataset indexed first): say it is running
                    still(f"still running after {time.perf_counter() - t0:.0f} s "
                          f"({steps_so_far(out_path, command.nproc)}; --timeout {timeout_s:.0f} s)")
            proc.wait(timeout=max(0.0, timeout_s - (time.perf_counter() - t0)))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            # what the script printed before it stopped making progress (a hang's last words), and how far it got
            return Run(variant, round_, "timeout", [], [], time.perf_counter() - t0,
                       _tail(workdir / f"{tag}.log") or f"no output within {timeout_s:.0f} s",
                       {"progress": progress_text(out_path, command.nproc)})
        finally:
            _kill_group(proc)  # DataLoader workers left behind
    wall = time.perf_counter() - t0
    paths = {r: rank_result(out_path, r) for r in range(command.nproc)}
    got = {r: json.loads(p.read_text(encoding="utf-8")) for r, p in paths.items() if p.is_file()}
    missing = sorted(set(paths) - set(got))
    failed = any(res["status"] in ("error", "exit") for res in got.values())
    if missing and not failed:  # a rank that failed says why; torchrun may stop the others before they write
        tail = _tail(workdir / f"{tag}.log")
        who = "the process" if command.nproc == 1 else f"rank {missing[0]}"
        return Run(variant, round_, "error", [], [], wall,
                   f"{who} ended with status {proc.returncode} before writing its result:\n{tail}")
    result = _merge_ranks(got)
    error = result.get("error") or ""
    if result["status"] in ("error", "exit") and command.nproc == 1:  # its own output, ending with its traceback
        error = _tail(workdir / f"{tag}.log") or error
    # under torchrun the log ends with torchrun's own traceback: the failing rank's (in its result) is the one
    return Run(variant, round_, result["status"], [float(x) for x in result["step_times_s"]],
               result["losses"], wall, error, result)


def _beats(out: Path, nproc: int) -> dict[int, dict[str, Any]]:
    """Each rank's last heartbeat (:func:`helpers.tune.hook._heartbeat`: ``steps``, ``wall``), where written."""
    beats = {}
    for r in range(nproc):
        try:
            beat = json.loads(Path(str(rank_result(out, r)) + PROGRESS_SUFFIX).read_text())
            beats[r] = {"steps": int(beat["steps"]), "wall": float(beat["wall"])}
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return beats


def steps_so_far(out: Path, nproc: int) -> str:
    """A running run's optimizer steps so far, from its heartbeat files: "3 optimizer steps so far", the slowest
    rank's under torchrun; "no optimizer step yet" before the first."""
    beats = _beats(out, nproc)
    n = min((beats[r]["steps"] if r in beats else 0) for r in range(nproc)) if nproc else 0
    return "no optimizer step yet" if n == 0 else f"{n} optimizer step{'s' if n != 1 else ''} so far"


def progress_text(out: Path, nproc: int) -> str:
    """How far a run that was stopped for hanging got, from its heartbeat files (:func:`helpers.tune.hook._heartbeat`):
    "it made 2 optimizer steps, the last 27 s before it was stopped", per rank under torchrun (the rank that made
    the fewest named first); "" when no heartbeat was written."""
    now = time.time()
    seen = [(b["steps"], r, now - b["wall"]) for r, b in _beats(out, nproc).items()]
    if not seen:
        return ""
    seen.sort()

    def one(steps: int, ago: float) -> str:
        what = "no optimizer step" if steps == 0 else f"{steps} optimizer step{'s' if steps != 1 else ''}"
        return f"made {what}, then nothing for {ago:.0f} s" if steps else f"made {what} in {ago:.0f} s"

    if nproc == 1:
        return f"it {one(seen[0][0], seen[0][2])}"
    return "; ".join(f"rank {r} {one(n, ago)}" for n, r, ago in seen)


def rank_result(out: Path, rank: int) -> Path:
    """Where rank ``rank`` of a torchrun run writes its result (rank 0: ``out`` itself;
    :func:`helpers.tune.hook.rank_file`)."""
    return Path(rank_file(str(out), rank))


def _merge_ranks(results: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One result of a run's ranks: rank 0's call sites and losses; a failed rank's status and error; the step
    times, step by step, of the slowest rank (the ranks of a synchronous job step together, at the pace of the
    slowest), over the steps every rank timed. Where ranks failed, the first to fail (the hook's ``failed_at``);
    ``results`` maps each rank that wrote a result to it (a failed run's other ranks may have been stopped first)."""
    if list(results) == [0]:  # one process
        return results[0]
    out = dict(results[min(results)])
    failed = [(r, res) for r, res in sorted(results.items()) if res["status"] in ("error", "exit")]
    if failed:  # the first to fail is the cause: the others fail after it (a peer's closed connection)
        rank, res = min(failed, key=lambda f: (f[1].get("failed_at") or math.inf, f[0]))
        later = [str(r) for r, _ in failed if r != rank]
        after = f" (rank{'s' if len(later) > 1 else ''} {', '.join(later)} failed after it)" if later else ""
        out.update(status=res["status"], error=f"rank {rank}{after}: {res.get('error') or res['status']}")
    elif any(res["status"] == "slow" for res in results.values()):
        out["status"] = "slow"
    n = min(len(res["step_times_s"]) for res in results.values())
    out["step_times_s"] = [max(float(res["step_times_s"][i]) for res in results.values()) for i in range(n)]
    out["ranks"] = len(results)
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


def measure(command: Command, variants: Sequence[tuple[str, dict[str, Any], Path | None]], *, rounds: int,
            workdir: Path, warmup: int, steps: int, timeout_s: float, watch_copies: bool = False,
            give_up_step_s: float | None = None,
            progress: Callable[[str], None] | None = None) -> tuple[dict[str, list[Run]], machine.BusyCheck]:
    """Run every variant ``rounds`` times, round-robin, each round in a rotated order.

    A variant other than the first (the reference) whose run failed, or was stopped as ``"slow"`` in the first
    round (``give_up_step_s``; later rounds run to the end), is not run again: that run decides it (:func:`judge`).

    Parameters
    ----------
    variants : sequence of (name, apply, script)
        ``script`` None runs the user's file with ``apply``; a path runs that file as written.
    rounds : int
        Runs per variant (>= 2).
    progress : callable, optional
        Called with a line after each run.

    Returns
    -------
    (dict of name to list of Run, machine.BusyCheck)
        The runs, and whether other processes took the machine's cores while they ran.

    Raises
    ------
    ParameterError
        If ``rounds`` < 2 or there are no variants.
    """
    if rounds < 2:
        raise ParameterError(f"tune: rounds must be >= 2 (the rounds cross-check each other), got {rounds}")
    if not variants:
        raise ParameterError("tune: nothing to measure")
    runs: dict[str, list[Run]] = {name: [] for name, _, _ in variants}
    before = machine.snapshot()
    total, k = rounds * len(variants), 0
    reference = variants[0][0]
    dropped: set[str] = set()
    for r in range(rounds):
        order = list(variants[r % len(variants):]) + list(variants[:r % len(variants)])
        for name, apply, script in order:
            if name in dropped:
                continue
            run = run_once(command, name, apply, workdir=workdir, warmup=warmup, steps=steps, timeout_s=timeout_s,
                           round_=r, script=script, watch_copies=watch_copies,
                           give_up_step_s=None if name == reference or r > 0 else give_up_step_s)
            runs[name].append(run)
            k += 1
            skipped = 0
            if name != reference and not run.ok:
                dropped.add(name)
                skipped = rounds - 1 - r
                total -= skipped
            if progress:
                med = f"{statistics.fmean(run.step_times_s) * 1e3:.1f} ms/step" if run.step_times_s else run.status
                progress(f"[{k}/{total}] round {r + 1}: {name}: {med}"
                         + (" (stopped: too slow to be worth timing further)" if run.status == "slow" else "")
                         + (f" (its {skipped} later run{'s' if skipped > 1 else ''} skipped)" if skipped else ""))
    busy = machine.check(before, machine.snapshot())
    return runs, busy


def loss_tolerance(base: Sequence[Run]) -> tuple[float, float]:
    """The baseline's mean loss over its measured steps and the tolerance around it.

    Returns
    -------
    (float, float)
        ``(mean, tol)``: tol = max(:data:`LOSS_RTOL` x |mean|, 3 x the standard deviation of the runs' own
        means). NaN mean when the baseline recorded no loss.
    """
    means = [m for m in (_mean_loss(r) for r in base) if m is not None]
    if not means:
        return math.nan, math.nan
    mean = statistics.fmean(means)
    sd = statistics.stdev(means) if len(means) > 1 else 0.0
    return mean, max(LOSS_RTOL * abs(mean), 3.0 * sd)


def _mean_loss(run: Run) -> float | None:
    vals = [v for v in run.losses[run.result.get("warmup_steps", 0):] if v is not None]
    return statistics.fmean(vals) if vals else None


def blocks(times: Sequence[float], size: int = BLOCK) -> list[float]:
    """Means of consecutive blocks of ``size`` step times (seconds); a last, shorter block is dropped unless it is
    the only one."""
    out = [statistics.fmean(times[i:i + size]) for i in range(0, len(times) - size + 1, size)]
    return out or ([statistics.fmean(times)] if times else [])


def nonfinite_step(run: Run) -> int | None:
    """The first step whose loss is NaN or inf (0-based), or None."""
    for i, v in enumerate(run.losses):
        if v is not None and not math.isfinite(v):
            return i
    return None


#: A loss that grows to this many times its level over the first steps, and ends there, is diverging though still
#: finite (a learning rate too high): training lowers a loss, so a thousandfold rise is not noise.
EXPLODE = 1e3


def exploding(run: Run) -> tuple[float, float, int] | None:
    """Whether the run's loss explodes while staying finite: ``(start, end, steps)`` or None.

    ``start`` is the smallest |loss| of the first 3 steps (a model with BatchNorm may explode at its second step
    already); the loss explodes when its last value and its largest are both at least :data:`EXPLODE` times
    ``start``.
    """
    vals = [abs(v) for v in run.losses if v is not None and math.isfinite(v)]
    if len(vals) < 6:
        return None
    start = min(vals[:3])
    if vals[-1] >= EXPLODE * max(start, 1e-12) and max(vals) >= EXPLODE * max(start, 1e-12):
        return start, vals[-1], len(vals)
    return None


@dataclass
class Judgement:
    """A variant against the baseline.

    Attributes
    ----------
    variant : str
    verdict : str
        ``"faster"`` (worth it: the interval lies above 1, the speedup reaches :data:`THRESHOLD`, every round
        agrees, the machine was quiet, the results check passed), ``"slower"``, ``"no gain"`` (the interval
        spans 1 or the gain is below the threshold), ``"inconclusive"`` (a busy machine, or rounds that
        disagree), ``"rejected"`` (failed, hung, NaN, results moved).
    speedup : float
        Baseline mean step time / variant's (> 1: the variant is faster: the ratio of throughputs); NaN when not
        measured.
    ci_low, ci_high : float
        Its 95% percentile-bootstrap interval.
    round_speedups : list of float
    base_ms, variant_ms : float
        Mean step times, milliseconds (median where a run was stopped early).
    reason : str
        One sentence: the evidence, or why it was rejected or inconclusive.
    """

    variant: str
    verdict: str
    speedup: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    round_speedups: list[float] = field(default_factory=list)
    base_ms: float = math.nan
    variant_ms: float = math.nan
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The fields, NaN written as None (JSON has no NaN)."""
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}

    @property
    def figure(self) -> str:
        """``"1.42x (95% CI 1.31-1.55)"`` or "not measured"."""
        if math.isnan(self.speedup):
            return "not measured"
        if math.isnan(self.ci_low):
            return f"{self.speedup:.2f}x (one run, stopped early)"
        return f"{self.speedup:.2f}x (95% CI {self.ci_low:.2f}-{self.ci_high:.2f})"


def judge(name: str, base: Sequence[Run], runs: Sequence[Run], busy: machine.BusyCheck, *,
          check_loss: bool = True) -> Judgement:
    """Judge one variant's runs against the baseline's (see the module docstring for the rules)."""
    slow = [r for r in runs if r.status == "slow"]
    if slow:
        r = slow[0]
        ms = statistics.median(r.step_times_s) * 1e3
        base_ms = statistics.median([t for b in base for t in b.step_times_s]) * 1e3
        stopped = (f"stopped after {len(r.step_times_s) + 1} steps (round {r.round + 1}) at {ms:.0f} ms per step, "
                   f"over {GIVE_UP_TEXT} the probe's (the first, unmodified run of your script)")
        if ms > base_ms:
            return Judgement(name, "slower", base_ms / ms, math.nan, math.nan, [], base_ms, ms,
                             reason=f"{stopped}; the unmodified runs took {base_ms:.0f} ms, so it is "
                                    f"{ms / base_ms:.1f}x as long; a change this much slower is not timed further")
        return Judgement(name, "inconclusive", base_ms / ms, math.nan, math.nan, [], base_ms, ms,
                         reason=f"{stopped}; but the unmodified runs took {base_ms:.0f} ms, longer still: the "
                                f"machine's speed changed while measuring; rerun when it is quiet")
    failed = [r for r in runs if not r.ok]
    if failed:
        r = failed[0]
        first = (r.error.strip().splitlines() or [r.status])[-1]
        if r.status == "timeout":
            far = r.result.get("progress") or "no result in time"
            return Judgement(name, "rejected", reason=f"the script hung with this change (round {r.round + 1}): "
                                                      f"{far}; its last output: {first}")
        return Judgement(name, "rejected", reason=f"the script failed with this change (round {r.round + 1}): "
                                                  f"{first}")
    if check_loss:
        base_bad = any(nonfinite_step(r) is not None for r in base)
        for r in runs:
            k = nonfinite_step(r)
            if k is not None and not base_bad:
                return Judgement(name, "rejected", reason=f"the loss became {r.losses[k]} at step {k + 1} with this "
                                                          f"change (round {r.round + 1}); the unmodified script's "
                                                          f"stayed finite")
        mean, tol = loss_tolerance(base)
        got = [m for m in (_mean_loss(r) for r in runs) if m is not None]
        if not math.isnan(mean) and got and not base_bad:
            var_mean = statistics.fmean(got)
            if abs(var_mean - mean) > tol:
                return Judgement(name, "rejected",
                                 reason=f"it changes the results: mean loss {var_mean:.4g} against {mean:.4g} "
                                        f"unmodified, beyond the tolerance of {tol:.3g}")
    a = [m for r in base for m in blocks(r.step_times_s)]
    b = [m for r in runs for m in blocks(r.step_times_s)]
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)  # blocks of equal size: the mean step times
    speedup = mean_a / mean_b
    low, high = bootstrap_ratio_ci(a, b, statistic="mean")
    per_round = []
    for rb, rv in zip(sorted(base, key=lambda r: r.round), sorted(runs, key=lambda r: r.round)):
        per_round.append(statistics.fmean(blocks(rb.step_times_s)) / statistics.fmean(blocks(rv.step_times_s)))
    j = Judgement(name, "", speedup, low, high, per_round, mean_a * 1e3, mean_b * 1e3)
    rounds = ", ".join(f"{x:.2f}" for x in per_round)
    n_a, n_b = sum(len(r.step_times_s) for r in base), sum(len(r.step_times_s) for r in runs)
    evidence = (f"{mean_b * 1e3:.1f} against {mean_a * 1e3:.1f} ms per step (means), {j.figure}, over {n_b} and "
                f"{n_a} steps in {len(runs)} interleaved runs each (interval from {BLOCK}-step blocks); by round "
                f"{rounds}")
    agree = all((x > 1) == (speedup > 1) for x in per_round)
    if busy.busy:
        j.verdict, j.reason = "inconclusive", f"{evidence}; but {busy.sentence()}"
    elif low <= 1.0 <= high:
        j.verdict, j.reason = "no gain", f"{evidence}: the interval spans 1"
    elif not agree:
        j.verdict, j.reason = "inconclusive", f"{evidence}: the rounds disagree, so one disturbed round may decide it"
    elif low > 1.0 and speedup >= THRESHOLD:
        j.verdict, j.reason = "faster", evidence
    elif high < 1.0:
        j.verdict, j.reason = "slower", evidence
    else:
        j.verdict, j.reason = "no gain", f"{evidence}: below the {THRESHOLD:.2f}x threshold"
    return j
