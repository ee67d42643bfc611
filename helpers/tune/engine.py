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
import shutil
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
from helpers.tune.hook import GIVE_UP_AFTER, PROGRESS_SUFFIX, rank_file
from helpers.tune.hook_files import KEEP_SUFFIX

__all__ = ["Command", "Run", "Judgement", "ScriptError", "parse_command", "run_once", "measure", "judge",
           "loss_tolerance", "exploding", "THRESHOLD"]

#: Smallest speedup that counts as worth a change (5%): the notebooks' A/B threshold
#: (:meth:`helpers.timing.Comparison.outcome`'s default).
THRESHOLD = 1.05
#: Seconds between the "still running" lines of a run given ``still`` (the probe: a script may index its dataset
#: for minutes before its first step).
STILL_EVERY_S = 15.0
#: A candidate whose first timed steps take longer than this many times the median step of the same round's
#: unmodified run (the probe's where that did not run first) is stopped and called slower (bf16 autocast on a CPU
#: without bf16 instructions: 5x and more), so that it does not take most of the session's time.
GIVE_UP_RATIO = 2.5
#: How :func:`judge` names the early-stop rule.
GIVE_UP_TEXT = f"{GIVE_UP_RATIO:g}x"
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
    python_word : str
        The interpreter as the user typed it (``python``: this environment's, :attr:`python`).
    """

    python: str
    script: Path | None
    module: str | None
    args: tuple[str, ...]
    cwd: Path
    nproc: int = 1
    launcher: str = ""
    python_word: str = ""

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
        """The command as a shell line to paste (``shlex.join``: an argument with spaces is quoted), with the
        interpreter's full path and the script relative to :attr:`cwd` where under it."""
        import shlex

        if self.module:
            target = ["-m", self.module]
        else:
            script = self.script
            try:
                target = [str(script.relative_to(self.cwd))] if script else []
            except ValueError:
                target = [str(script)]
        head = ["torchrun", "--nproc-per-node", str(self.nproc)] if self.launcher else [self.python]
        return shlex.join([*head, *target, *self.args])

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
        interpreter options other than ``-m``, torchrun options for more than this machine (``--nnodes`` above 1)
        or for a non-Python program (``--no-python``), a script file that does not exist, or a module (``-m``) that
        is not a file under the current folder or ``PYTHONPATH``.
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
    if words[1] == "-m":  # run as a module (runpy), its file edited
        if len(words) < 3:
            raise ParameterError("tune: give the module after -m: python -m package.train ARGS")
        return Command(python, _module_file(words[2], cwd), words[2], tuple(words[3:]), cwd, python_word=words[0])
    if words[1].startswith("-"):
        raise ParameterError(f"tune: interpreter option {words[1]!r} is not supported; give python train.py ARGS")
    return Command(python, _script(words[1], cwd), None, tuple(words[2:]), cwd, python_word=words[0])


def _module_file(module: str, cwd: Path) -> Path:
    """The file ``python -m module`` runs, found without importing anything: ``a/b.py`` or ``a/b/__main__.py``
    under the current folder (first on ``sys.path`` under ``-m``) or a ``PYTHONPATH`` folder.

    Raises
    ------
    ParameterError
        Where no such file is there (a module of an installed package is not the user's to edit).
    """
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts):
        raise ParameterError(f"tune: {module!r} is not a module name; give python -m package.train ARGS")
    bases = [cwd] + [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    for base in bases:
        for f in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__main__.py")):
            if f.is_file():
                return f.resolve()
    raise ParameterError(f"tune: the module {module!r} is not a file under {cwd} (looked for "
                         f"{'/'.join(parts)}.py and {'/'.join(parts)}/__main__.py): run tune from the folder you run "
                         f"python -m {module} from; a module of an installed package is not yours to edit")


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
    if args.no_python:
        raise ParameterError("tune: torchrun --no-python is not supported: tune edits a Python script, so give "
                             "it: torchrun --nproc-per-node N train.py ARGS")
    if str(args.nnodes) not in ("1", "1:1"):
        raise ParameterError(f"tune: --nnodes {args.nnodes}: tune runs the job on this machine only; give "
                             "--nnodes 1 (the change it finds applies to every node alike)")
    if not str(args.nproc_per_node).isdigit() or int(args.nproc_per_node) < 1:
        raise ParameterError(f"tune: --nproc-per-node {args.nproc_per_node!r}: give a number of processes, 1 or "
                             "more, e.g. --nproc-per-node 2 (tune does not resolve torchrun's auto, cpu or gpu: "
                             "name the count your job uses)")
    module = args.training_script if args.module else None
    script = _module_file(module, cwd) if module else _script(args.training_script, cwd)
    return Command(sys.executable, script, module, tuple(args.training_script_args), cwd,
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
        far slower than the reference), ``"exit"``, ``"error"``, ``"timeout"``, ``"stalled"`` (its optimizer
        steps stopped advancing: :func:`stalled`).
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


def _hook_env(command: Command, apply: dict[str, Any] | None = None) -> dict[str, str]:
    """The environment of a run: the user's, helpers importable, and a world of one for a script written for
    torchrun but given as ``python train.py`` (under torchrun, torchrun sets each rank's); with ``apply["ld_preload"]``
    (an allocator, :mod:`helpers.tune.candidates_cpu`), that library first in ``LD_PRELOAD`` (torchrun's ranks
    inherit it)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if (apply or {}).get("ld_preload"):
        env["LD_PRELOAD"] = apply["ld_preload"] + (":" + env["LD_PRELOAD"] if env.get("LD_PRELOAD") else "")
    if command.launcher:
        return env
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(_free_port()))):
        env.setdefault(key, value)
    return env


def run_once(command: Command, variant: str, apply: dict[str, Any], *, workdir: Path, warmup: int, steps: int,
             timeout_s: float, round_: int = 0, script: Path | None = None, watch_copies: bool = False,
             give_up_step_s: float | None = None, still: Callable[[str], None] | None = None,
             stall_step_s: float | None = None, start_s: float | None = None,
             stall_floor_s: float | None = None) -> Run:
    """Run the script once under the hook; afterwards, every file of the user's it changed is put back
    (:func:`restore_user_files`, listed in ``result["user_files"]``).

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
    stall_step_s : float, optional
        The slowest step the probe saw, seconds: the run is stopped as ``"stalled"`` when a step takes longer than
        :func:`stall_limit_s` of it (without it, of the run's own slowest step so far).
    start_s : float, optional
        Seconds the run may take to its first optimizer step before it is stopped as ``"stalled"``.
    stall_floor_s : float, optional
        The stall limit's floor, seconds (:func:`stall_limit_s`; the probe's: :data:`PROBE_STALL_FLOOR_S`).

    Returns
    -------
    Run
    """
    tag = f"{variant.replace(' ', '_').replace('=', '').replace('+', '')}-r{round_}"
    workdir.mkdir(parents=True, exist_ok=True)
    keep = workdir / f"{tag}{KEEP_SUFFIX}"
    shutil.rmtree(keep, ignore_errors=True)  # a tag run again (a second proof): only this run's changes are undone
    spec = {"argv": command.argv, "script": str(command.script) if command.script else None,
            "module": command.module, "source": str(script) if script else None,
            "warmup": warmup, "steps": steps, "out": str(workdir / f"{tag}.json"), "scratch": str(workdir),
            "apply": apply, "user_roots": command.roots, "watch_copies": watch_copies,
            "give_up_step_s": give_up_step_s, "world": command.nproc, "keep": str(keep), "probe": round_ < 0,
            "round": round_}
    spec_path = workdir / f"{tag}.spec.json"
    spec_path.write_text(json.dumps(spec), encoding="utf-8")
    out_path = Path(spec["out"])
    out_path.unlink(missing_ok=True)
    t0, wall0 = time.perf_counter(), time.time()
    ended, why = "", ""
    try:
        with open(workdir / f"{tag}.log", "wb") as log:
            proc = subprocess.Popen(command.process(spec_path), cwd=command.cwd, env=_hook_env(command, apply),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
            try:
                ended, why = _wait(proc, t0, wall0, out_path, command.nproc, timeout_s, stall_step_s, start_s,
                                   steps, still, stall_floor_s)
            finally:
                _kill_group(proc)  # DataLoader workers left behind
    finally:  # the user's files as they were before the run, whatever became of it
        kept = restore_user_files(keep)
    wall = time.perf_counter() - t0
    if ended:  # what the script printed before it stopped making progress (a hang's last words), how far it got
        return Run(variant, round_, ended, [], [], wall,
                   _tail(workdir / f"{tag}.log") or f"no output within {wall:.0f} s",
                   {"progress": why or progress_text(out_path, command.nproc), "user_files": kept})
    paths = {r: rank_result(out_path, r) for r in range(command.nproc)}
    got = {r: json.loads(p.read_text(encoding="utf-8")) for r, p in paths.items() if p.is_file()}
    missing = sorted(set(paths) - set(got))
    failed = any(res["status"] in ("error", "exit") for res in got.values())
    if missing and not failed:  # a rank that failed says why; torchrun may stop the others before they write
        tail = _tail(workdir / f"{tag}.log")
        who = "the process" if command.nproc == 1 else f"rank {missing[0]}"
        return Run(variant, round_, "error", [], [], wall,
                   f"{who} ended with status {proc.returncode} before writing its result:\n{tail}",
                   {"user_files": kept})
    result = _merge_ranks(got)
    result["user_files"] = kept
    error = result.get("error") or ""
    if result["status"] in ("error", "exit") and command.nproc == 1:  # its own output, ending with its traceback
        error = _tail(workdir / f"{tag}.log") or error
    # under torchrun the log ends with torchrun's own traceback: the failing rank's (in its result) is the one
    return Run(variant, round_, result["status"], [float(x) for x in result["step_times_s"]],
               result["losses"], wall, error, result)


#: Seconds between two looks at a running run (has it ended, stalled, run out of time).
POLL_S = 1.0
#: A run whose optimizer steps stop advancing for STALL_RATIO x the slowest step seen (the probe's, or the run's own
#: so far), and at least STALL_FLOOR_S seconds, is stopped as ``"stalled"``: a hang (a deadlocked DataLoader worker,
#: a collective that waits forever) need not take the whole timeout. Ten times the slowest step leaves room for the
#: slow steps the probe saw coming back (an epoch's start); the floor covers a script that checkpoints or evaluates
#: between steps. Tune's own choices, not measured constants.
STALL_RATIO = 10.0
STALL_FLOOR_S = 30.0
#: The floor for the probe, which has seen only its own first steps: a script that evaluates or saves between two
#: early steps for up to two minutes is not taken for a hang.
PROBE_STALL_FLOOR_S = 120.0


def stall_limit_s(slowest_step_s: float, floor_s: float | None = None) -> float:
    """Seconds without an optimizer step after which a run is stalled: ``max(floor_s, STALL_RATIO x
    slowest_step_s)`` (seconds; ``floor_s`` default :data:`STALL_FLOOR_S`)."""
    return max(STALL_FLOOR_S if floor_s is None else floor_s, STALL_RATIO * slowest_step_s)


def _wait(proc: subprocess.Popen, t0: float, wall0: float, out_path: Path, nproc: int, timeout_s: float,
          stall_step_s: float | None, start_s: float | None, steps: int,
          still: Callable[[str], None] | None, stall_floor_s: float | None = None) -> tuple[str, str]:
    """Wait for a run: ``("", "")`` when it ended on its own; ``("timeout", "")`` past ``timeout_s``;
    ``("stalled", why)`` when a rank's optimizer steps stopped advancing (:func:`stalled`)."""
    next_still = t0 + STILL_EVERY_S
    while True:
        try:
            proc.wait(timeout=max(0.0, min(POLL_S, timeout_s - (time.perf_counter() - t0))))
            return "", ""
        except subprocess.TimeoutExpired:
            pass
        now = time.perf_counter()
        if now - t0 >= timeout_s:
            return "timeout", ""
        why = stalled(out_path, nproc, stall_step_s, start_s, wall0, stall_floor_s)
        if why:
            return "stalled", why
        if still is not None and now >= next_still and now - t0 + STILL_EVERY_S < timeout_s:
            next_still += STILL_EVERY_S  # a long start (a dataset indexed first): say it is running
            still(f"still running after {now - t0:.0f} s ({steps_so_far(out_path, nproc)}; --timeout "
                  f"{timeout_s:.0f} s)")


def stalled(out: Path, nproc: int, stall_step_s: float | None, start_s: float | None, wall0: float,
            floor_s: float | None = None) -> str:
    """Why a running run counts as stalled, or "": a rank that has not written its result and whose last optimizer
    step (its heartbeat, :func:`helpers.tune.hook._heartbeat`) is older than :func:`stall_limit_s` of the slowest
    step known (``stall_step_s``, the probe's, or the rank's own slowest so far once it has timed one), or that
    made no step ``start_s`` seconds after it started (None: no limit before the first step); ``floor_s`` as in
    :func:`stall_limit_s`."""
    now = time.time()
    beats = _beats(out, nproc)
    for r in range(nproc):
        if rank_result(out, r).is_file():
            continue  # this rank is done
        beat = beats.get(r, {"steps": 0, "wall": wall0, "slowest": 0.0})
        ago, n = now - beat["wall"], beat["steps"]
        who = "it" if nproc == 1 else f"rank {r}"
        if n == 0:
            if start_s is not None and ago > start_s:
                return (f"{who} made no optimizer step in {ago:.0f} s, the stall limit before the first step, 3x the "
                        f"probe's start-up + {STALL_FLOOR_S:.0f} s: stopped as stalled")
            continue
        known = max(stall_step_s or 0.0, beat.get("slowest") or 0.0)
        if not known:
            continue  # no step time known yet (the probe's first step): only the timeout applies
        limit = stall_limit_s(known, floor_s)
        if ago > limit:
            floor = STALL_FLOOR_S if floor_s is None else floor_s
            return (f"{who} made {n} optimizer step{'s' if n != 1 else ''}, then none for {ago:.0f} s: stopped as "
                    f"stalled; the stall limit is {limit:.0f} s: {STALL_RATIO:.0f}x the slowest step seen, "
                    f"{known:.2f} s, and at least {floor:.0f} s")
    return ""


def restore_user_files(keep: Path) -> list[dict[str, str]]:
    """Put back every file a run changed outside its folder, as :class:`helpers.tune.hook_files.UserFiles` kept it in
    ``keep``: a kept copy is written back, a file the run created is removed, and a folder it created is removed
    where it is empty; the latest change is undone first, so the copy kept before the first change is the one that
    stays (DataLoader workers and torchrun's ranks keep their own).

    Returns
    -------
    list of dict
        ``{"path", "action"}`` per path the run left changed, action ``"restored"`` or ``"removed"``, in the order
        the run first changed them (a file the run created and removed itself, or left as it was, is not listed).
    """
    import filecmp

    entries = []
    for log in sorted(keep.glob("*.jsonl")) if keep.is_dir() else []:
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue  # a line cut short by a killed process
    entries.sort(key=lambda e: e["t"])
    done: dict[str, str] = {}  # the paths something had to be done for, and what (the earliest entry's undo last)
    for e in reversed(entries):
        path, kept = Path(e["path"]), e.get("kept")
        try:
            if e.get("dir"):
                if path.is_dir() and not any(path.iterdir()):
                    path.rmdir()
                    done[e["path"]] = "removed"
            elif kept is None:
                if path.is_file() or path.is_symlink():
                    path.unlink()
                    done[e["path"]] = "removed"
            elif not (path.is_file() and filecmp.cmp(kept, path, shallow=False)):
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(kept, path)
                done[e["path"]] = "restored"
            elif e["path"] in done:
                done[e["path"]] = "restored"  # a later copy was written back already: this one is the same
        except OSError as exc:
            done[e["path"]] = f"not restored ({exc}); the copy is {kept}" if kept else f"not removed ({exc})"
    order = list(dict.fromkeys(e["path"] for e in entries))
    return [{"path": p, "action": done[p]} for p in order if p in done]


def _beats(out: Path, nproc: int) -> dict[int, dict[str, Any]]:
    """Each rank's last heartbeat (:func:`helpers.tune.hook._heartbeat`: ``steps``, ``wall``, ``slowest``), where
    written."""
    beats = {}
    for r in range(nproc):
        try:
            beat = json.loads(Path(str(rank_result(out, r)) + PROGRESS_SUFFIX).read_text())
            beats[r] = {"steps": int(beat["steps"]), "wall": float(beat["wall"]),
                        "slowest": float(beat.get("slowest") or 0.0)}
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
            give_up_step_s: float | None = None, stall_step_s: float | None = None, start_s: float | None = None,
            progress: Callable[[str], None] | None = None,
            decided: Callable[[str, Run, list[Run]], str] | None = None,
            ) -> tuple[dict[str, list[Run]], machine.BusyCheck]:
    """Run every variant ``rounds`` times, round-robin, each round in a rotated order.

    A variant other than the first (the reference) whose run failed, stalled, turned its loss NaN or inf where the
    reference's stayed finite, or was stopped as ``"slow"`` in the first round (:data:`GIVE_UP_RATIO` x the median
    step of that round's reference run, or ``give_up_step_s`` where the reference has not run yet; later rounds run
    to the end), is not run again: that run decides it (:func:`judge`). Nor is one for which ``decided(name, run,
    the reference's runs so far)`` gives a reason (a torch.compile that cannot pay back within the job:
    :func:`helpers.tune.candidates_compile.cannot_pay`). ``stall_step_s`` and ``start_s`` go to :func:`run_once`.

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
            limit = None
            if name != reference and r == 0 and give_up_step_s:  # against this round's unmodified run, where run
                ref = [x for x in runs[reference] if x.round == r and x.ok]
                early = early_steps(ref[0]) if ref else []
                limit = GIVE_UP_RATIO * statistics.median(early or ref[0].step_times_s) if ref else give_up_step_s
            run = run_once(command, name, apply, workdir=workdir, warmup=warmup, steps=steps, timeout_s=timeout_s,
                           round_=r, script=script, watch_copies=watch_copies, give_up_step_s=limit,
                           stall_step_s=stall_step_s, start_s=start_s)
            runs[name].append(run)
            k += 1
            skipped = 0
            k_nan = nonfinite_step(run) if run.ok else None
            base_finite = all(nonfinite_step(x) is None for x in runs[reference])
            why = decided(name, run, runs[reference]) if decided and name != reference and run.ok else ""
            if why:
                why += "; "
            if name != reference and (not run.ok or (k_nan is not None and base_finite) or why):
                dropped.add(name)  # its verdict is made (rejected, or slower): running it again proves nothing
                skipped = rounds - 1 - r
                total -= skipped
                if run.ok and not why:
                    why = f"its loss became {run.losses[k_nan]} at step {k_nan + 1}; "
            if progress:
                med = f"{statistics.fmean(run.step_times_s) * 1e3:.1f} ms/step" if run.step_times_s else run.status
                progress(f"[{k}/{total}] round {r + 1}: {name}: {med}"
                         + (" (stopped: too slow to be worth timing further)" if run.status == "slow" else "")
                         + (f" ({run.result.get('progress')})" if run.status == "stalled" else "")
                         + (f" ({why}its {skipped} later run{'s' if skipped > 1 else ''} skipped)" if skipped else
                            f" ({why.rstrip('; ')})" if why else ""))
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
        ratio, _, spread = self.figure_inline.partition(", ")
        return f"{ratio} ({spread})" if spread else ratio

    @property
    def figure_inline(self) -> str:
        """:attr:`figure` for a place already in parentheses: ``"1.42x, 95% CI 1.31-1.55"`` or "not measured"."""
        if math.isnan(self.speedup):
            return "not measured"
        if math.isnan(self.ci_low):
            return f"{self.speedup:.2f}x, one run, stopped early"
        # an interval that lies on one side of 1 is never shown touching it: 0.997 is not written 1.00
        digits = next((d for d in (2, 3, 4) if not (self.ci_high < 1.0 and float(f"{self.ci_high:.{d}f}") >= 1.0)
                       and not (self.ci_low > 1.0 and float(f"{self.ci_low:.{d}f}") <= 1.0)), 4)
        return f"{self.speedup:.2f}x, 95% CI {self.ci_low:.{digits}f}-{self.ci_high:.{digits}f}"


def early_steps(run: Run) -> list[float]:
    """The step times, seconds, an early stop is judged on: steps 2 to 1 + :data:`helpers.tune.hook.GIVE_UP_AFTER`
    of ``run`` (warm-up included, past the first step's one-off costs), so that a change stopped early is compared
    with the same steps of the unmodified run, not with its warmed-up ones; [] where the run has fewer."""
    times = list(run.result.get("all_step_times_s") or [])
    return times[1:GIVE_UP_AFTER + 1] if len(times) > GIVE_UP_AFTER else []


def judge(name: str, base: Sequence[Run], runs: Sequence[Run], busy: machine.BusyCheck, *,
          check_loss: bool = True) -> Judgement:
    """Judge one variant's runs against the baseline's (see the module docstring for the rules)."""
    slow = [r for r in runs if r.status == "slow"]
    if slow:  # judged against the unmodified run of its own round: the load may have changed since the probe
        r = slow[0]
        ms = statistics.median(r.step_times_s) * 1e3
        same = [b for b in base if b.round == r.round and b.step_times_s] or [b for b in base if b.step_times_s]
        early = [t for b in same for t in early_steps(b)]  # the same steps of the unmodified run, where recorded
        base_ms = statistics.median(early or [t for b in same for t in b.step_times_s]) * 1e3
        n = len(r.step_times_s)
        stopped = (f"stopped after {n + 2} steps (round {r.round + 1}) at {ms:.0f} ms per step over steps 2-{n + 1}, "
                   f"over {GIVE_UP_TEXT} the unmodified script's")
        against = (f"the unmodified run of round {r.round + 1} took {base_ms:.0f} ms over "
                   + ("the same steps" if early else "its timed steps") + " (medians)")
        if busy.busy:
            return Judgement(name, "inconclusive", base_ms / ms, math.nan, math.nan, [], base_ms, ms,
                             reason=f"{stopped}; {against}, {base_ms / ms:.2f}x; but {busy.sentence()}")
        if ms * 1.0 > THRESHOLD * base_ms:
            return Judgement(name, "slower", base_ms / ms, math.nan, math.nan, [], base_ms, ms,
                             reason=f"{stopped}; {against}, so it is {ms / base_ms:.1f}x as long; a change this "
                                    f"much slower is not timed further")
        return Judgement(name, "inconclusive", base_ms / ms, math.nan, math.nan, [], base_ms, ms,
                         reason=f"{stopped}; but {against}, {base_ms / ms:.2f}x: the machine's speed changed "
                                f"while measuring, not the change's; rerun when it is quiet")
    failed = [r for r in runs if not r.ok]
    both = next(((r, b) for r in failed for b in base if b.round == r.round and not b.ok), None)
    if both:  # the unmodified run of the same round stopped too: what stopped both is not the change
        r, b = both
        return Judgement(name, "inconclusive", reason=f"the run with this change stopped ({r.status}) in round "
                                                      f"{r.round + 1}, and so did the unmodified run of that round "
                                                      f"({b.status}): what stopped both is not the change; rerun")
    if failed:
        r = failed[0]
        first = (r.error.strip().splitlines() or [r.status])[-1]
        if r.status in ("timeout", "stalled"):
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
    n_runs = (f"{len(runs)} interleaved run{'s' if len(runs) != 1 else ''} each" if len(runs) == len(base) else
              f"{len(runs)} and {len(base)} interleaved runs")
    evidence = (f"{mean_b * 1e3:.1f} against {mean_a * 1e3:.1f} ms per step (means), {j.figure}, over {n_b} and "
                f"{n_a} steps in {n_runs} (interval from {BLOCK}-step blocks); by round {rounds}")
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
