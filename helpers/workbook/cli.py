"""Command line of the workbook: ``python -m helpers <command>``.

Commands
--------
run         execute the notebooks into a run folder and write the report
diagnose    the quick answer for your own job (--job path/to/job.py:make_job): host-bound verdict and
            the three-run test (real loader, cached batches, synthetic device batches)
bench       run a benchmark (input-pipeline, end-to-end, dataset-cache, allreduce, ddp, dataset-index, instrument,
            trace)
            and print its figures as JSON; exit 2 on bad
            flag values or an unavailable backend, 1 when the allreduce job ran and failed or timed out
notebooks   copy the notebooks and their profiles to a folder of your choice, for JupyterLab
data build  build the embedded photo dataset (done on first use anyway)
device-check  on a borrowed CUDA/NPU machine: notebooks 02, 04-07, 10, bench input-pipeline and the link
            bandwidth, summarized in one JSON file (exit 1 when a step failed)
compare     one report across run folders (a class, before/after a change, CPU vs GPU vs NPU)
report      rebuild the report of an existing run folder
tune        your training script made faster: each checklist change measured A/B on your script, the winners
            written into it as a diff, and the rewritten script proven against yours (-- python train.py ARGS)
trace       notebook 01's verdict from profiler traces you already have (torch.profiler JSON, torch_npu
            *_ascend_pt folders, a folder with one per rank): the slow rank, the next notebook, a report
env check   validate HCCL/NCCL/torch_npu environment settings (current or proposed), write the valid
            ones as an env file for torchrun; exit 1 when a setting is invalid or invented
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from helpers.errors import WorkbookError
from helpers.specs import DEVICE_CHOICES, PROFILES


#: diagnose's default limit, s: its 3 x (3 + 20) steps take seconds to minutes on a job that trains at all.
DIAGNOSE_TIMEOUT_S = 600.0


def _parser() -> argparse.ArgumentParser:
    """The command line: one subparser per command, each with its handler (``args.handler(args)`` -> exit status)."""
    argv0 = Path(sys.argv[0]).name
    prog = "python -m helpers" if argv0 in ("__main__.py", "-m", "-c", "") else argv0
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_add_run, _add_diagnose, _add_notebooks, _add_data, _add_bench, _add_device_check, _add_compare,
                _add_report, _add_trace, _add_tune, _add_env):
        add(sub)
    return p


def _add_run(sub) -> None:
    r = sub.add_parser("run", help="run the workbook's notebooks and write the report")
    r.add_argument("--profile", default=None, metavar="NAME|FILE.yaml",
                   help=f"parameter profile: {', '.join(PROFILES)} (default: quick), or your own YAML file")
    r.add_argument("-p", dest="overrides", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                   help="set a notebook parameter for every notebook that has it (repeatable; VALUE read as "
                        "YAML, e.g. -p batch_size 64 -p num_workers_list '[0, 2]')")
    r.add_argument("--device", default=None, choices=DEVICE_CHOICES, help="device kind (default: auto)")
    r.add_argument("--only", nargs="+", default=None, metavar="NN", help="run only these notebooks, e.g. --only 00 01")
    r.add_argument("--data-dir", default=None, metavar="DIR",
                   help="a folder of your own images (optional captions.csv) instead of the embedded photos")
    r.add_argument("--job", default=None, metavar="FILE.py:FACTORY",
                   help="your own job (path/to/job.py:make_job or module:attr) instead of the built-in PPO job")
    r.add_argument("--out", type=Path, default=None, metavar="DIR", help="run folder (default: a new one under runs/)")
    r.add_argument("--resume", action="store_true",
                   help="continue the run in --out (default: the latest run), skipping finished notebooks")
    r.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="limit per notebook cell, seconds")
    r.add_argument("--patience", type=int, default=1, metavar="K",
                   help="measure K times as many interleaved repeats where a verdict is an A/B ratio (02, 04: repeats; "
                        "03: trials; 06, 07, 10: steps), so that on a busy machine its 95%% interval can still clear "
                        "the threshold (default: 1)")
    r.set_defaults(handler=_run)


def _add_diagnose(sub) -> None:
    dg = sub.add_parser("diagnose", help="the quick answer for your own job: host-bound verdict, three-run test, "
                                         "what free input would give, the notebook to open next")
    dg.add_argument("--job", required=True, metavar="FILE.py:FACTORY",
                    help="your job: path/to/job.py:make_job or package.module:make_job")
    dg.add_argument("--device", default="auto", choices=DEVICE_CHOICES, help="device kind (default: auto)")
    dg.add_argument("--steps", type=int, default=20, metavar="N", help="measured steps per run (default: 20)")
    dg.add_argument("--warmup-steps", type=int, default=3, metavar="N", help="untimed steps per run (default: 3)")
    dg.add_argument("--threshold", type=float, default=0.10, metavar="F",
                    help="exposed-input share above which the job is host-bound (default: 0.10, as notebook 01)")
    dg.add_argument("--batch-size", type=int, default=None, metavar="N", help="passed to the job's factory")
    dg.add_argument("--data-dir", default=None, metavar="DIR", help="passed to the job's factory")
    dg.add_argument("--json", action="store_true", help="print the figures as JSON")
    dg.add_argument("--timeout", type=float, default=DIAGNOSE_TIMEOUT_S, metavar="S",
                    help=f"stop after S seconds, dump the stacks and say where the job is stuck, e.g. in your "
                         f"dataset's __getitem__ (default: {DIAGNOSE_TIMEOUT_S:.0f}; exit 1)")
    dg.set_defaults(handler=_diagnose)


def _add_notebooks(sub) -> None:
    nbc = sub.add_parser("notebooks", help="copy the notebooks and their profiles to a folder, for JupyterLab")
    nbc.add_argument("dest", type=Path, help="the folder (created; files already there are kept)")
    nbc.set_defaults(handler=_notebooks)


def _add_data(sub) -> None:
    d = sub.add_parser("data", help="dataset commands")
    dsub = d.add_subparsers(dest="data_command", required=True)
    b = dsub.add_parser("build", help="build the embedded photo dataset (idempotent)")
    b.add_argument("--n-images", type=int, default=512)
    b.add_argument("--seed", type=int, default=0)
    b.set_defaults(handler=_data_build)


def _add_bench(sub) -> None:
    be = sub.add_parser("bench", help="run a benchmark and print its figures as JSON")
    be.add_argument("name", choices=("input-pipeline", "end-to-end", "dataset-cache", "allreduce", "ddp",
                                     "dataset-index", "instrument", "trace", "tune", "workbook"),
                    help="which benchmark")
    be.add_argument("--job", default="", metavar="FILE.py:FACTORY",
                    help="ddp: your own job (path/to/job.py:make_job or module:attr; default: the built-in job)")
    be.add_argument("--profile", default="quick", choices=PROFILES, help="parameter profile (default: quick)")
    be.add_argument("--device", default="auto", choices=DEVICE_CHOICES, help="device kind (default: auto)")
    be.add_argument("--data-dir", default=None, metavar="DIR", help="a folder of images instead of the embedded photos")
    be.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl", "hccl"),
                    help="allreduce, ddp: torch.distributed backend (auto: hccl on npu, nccl on cuda, gloo on cpu)")
    be.add_argument("--world-size", type=int, default=2, metavar="N", help="allreduce, ddp: ranks on this machine")
    be.add_argument("--min-bytes", type=int, default=8, metavar="B", help="allreduce: smallest message, bytes")
    be.add_argument("--max-size-mib", type=float, default=256, metavar="M", help="allreduce: largest message, MiB")
    be.add_argument("--repeats", type=int, default=10, metavar="R",
                    help="allreduce: timed calls per size; instrument: rounds of one plain and one instrumented "
                         "block (at least 3)")
    be.add_argument("--warmup", type=int, default=3, metavar="W", help="allreduce: untimed calls per size")
    be.add_argument("--timeout", type=float, default=600.0, metavar="S",
                    help="allreduce: seconds before the job counts as hung and is stopped")
    be.add_argument("--master-port", type=int, default=0, metavar="P",
                    help="allreduce: rendezvous port on 127.0.0.1 (0: a free one)")
    be.add_argument("--run", default=None, metavar="DIR",
                    help="end-to-end: choose the optimizations as notebook 10 does from this run's verdicts "
                         "(only what they recommended; default: the device's stated defaults, labelled as such)")
    be.add_argument("--images", type=int, default=20_000, metavar="N",
                    help="dataset-index: images in the generated folder (ignored with --data-dir)")
    be.add_argument("--size-mb", type=float, default=1024, metavar="MB",
                    help="trace: size of the generated Kineto trace, MB (default: 1024)")
    be.add_argument("--example", default="train_script", metavar="NAME",
                    help="tune: the example script in examples/ (train_script, debug_left_on, ddp_accumulation, "
                         "compile_mlp, threads_oversubscribed)")
    be.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help="trace: write the generated trace here and keep it; tune: keep tune's folder (report, diff) "
                         "here; workbook: keep the run folder here (default: a temporary folder)")
    be.set_defaults(handler=_bench)


def _add_device_check(sub) -> None:
    dc = sub.add_parser("device-check", help="on a borrowed accelerator: the device notebooks, bench input-pipeline "
                                              "and the pinned/pageable bandwidth, in one JSON summary")
    dc.add_argument("--device", default="cuda", choices=DEVICE_CHOICES, help="device kind (default: cuda)")
    dc.add_argument("--profile", default="quick", choices=PROFILES, help="parameter profile (default: quick)")
    dc.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help="folder for the run and device_check.json (default: runs/device-check-<device>-<time>)")
    dc.set_defaults(handler=_device_check)


def _add_compare(sub) -> None:
    cmp_ = sub.add_parser("compare", help="one report across run folders: a column per run, where they disagree")
    cmp_.add_argument("run_dirs", type=Path, nargs="+", metavar="RUN_DIR", help="two or more run folders")
    cmp_.add_argument("--out", type=Path, default=None, metavar="DIR",
                      help="folder for compare.html and compare.md (default: compare-<time> beside the first run folder)")
    cmp_.set_defaults(handler=_compare)


def _add_report(sub) -> None:
    rep = sub.add_parser("report", help="rebuild report.html and report.md of a run folder")
    rep.add_argument("run_dir", type=Path)
    rep.set_defaults(handler=_report)


def _add_trace(sub) -> None:
    tr = sub.add_parser("trace", help="notebook 01's verdict from profiler traces you already have: per rank, the slow "
                                      "rank, the notebook to open next, and a report")
    tr.add_argument("paths", type=Path, nargs="+", metavar="PATH",
                    help="a torch.profiler trace (.json, .json.gz), a torch_npu *_ascend_pt folder, or a folder "
                         "holding one per rank")
    tr.add_argument("--json", action="store_true", help="print the analysis as JSON instead of the summary")
    tr.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help="folder for report.html, report.md and results.jsonl (default: runs/trace-<UTC time>)")
    tr.add_argument("--threshold", type=float, default=0.10, metavar="F",
                    help="exposed-input share above which the job is host-bound (default: 0.10, as notebook 01)")
    tr.set_defaults(handler=_trace)


def _add_tune(sub) -> None:
    tu = sub.add_parser("tune", help="your training script made faster: the checklist's changes measured on it, the "
                                     "winners written as a diff, the rewritten script proven against yours",
                        usage="%(prog)s [options] -- python train.py [ARGS]\n"
                              "       %(prog)s [options] -- torchrun --nproc-per-node N train.py [ARGS]")
    tu.add_argument("--steps", type=int, default=20, metavar="N", help="timed optimizer steps per run (default: 20)")
    tu.add_argument("--warmup", type=int, default=5, metavar="N", help="untimed steps per run (default: 5)")
    tu.add_argument("--rounds", type=int, default=3, metavar="N",
                    help="interleaved runs of each variant (default: 3; more narrows the intervals)")
    tu.add_argument("--timeout", type=float, default=600.0, metavar="S",
                    help="limit for the first, unmodified run, seconds; later runs get 3x its time + 60 s "
                         "(default: 600)")
    tu.add_argument("--out", type=Path, default=None, metavar="DIR",
                    help="folder for the report, the diff and the rewritten script (default: "
                         "tune-runs/tune-<UTC time> in the current folder)")
    tu.add_argument("--apply", action="store_true",
                    help="also edit your script in place once the rewritten copy is proven faster (a backup is "
                         "kept beside it as SCRIPT.orig)")
    tu.add_argument("--skip", action="append", default=[], metavar="TECHNIQUE",
                    help="a technique not to try, e.g. --skip compile (repeat it, or give several with commas; the "
                         "names are those of the report)")
    tu.add_argument("--json", action="store_true", help="print the summary as JSON")
    tu.add_argument("command", nargs=argparse.REMAINDER, metavar="-- python train.py ARGS",
                    help="the command that trains, as you run it: python train.py ARGS, or torchrun "
                         "--nproc-per-node N train.py ARGS on this machine (each run is then a torchrun job)")
    tu.set_defaults(handler=_tune)


def _add_env(sub) -> None:
    env = sub.add_parser("env", help="environment-settings commands")
    esub = env.add_subparsers(dest="env_command", required=True)
    ec = esub.add_parser("check", help="check the current environment or a proposed set against the catalog "
                                       "(exit 1 when a setting is invalid or invented)")
    ec.add_argument("--file", type=Path, default=None, metavar="PROPOSED.env",
                    help="check the KEY=VALUE / export KEY=VALUE settings of this file instead of the environment")
    ec.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                    help="a proposed setting (repeatable; overrides --file); with --set or --file the current "
                         "environment is not checked")
    ec.add_argument("--npu", action=argparse.BooleanOptionalAction, default=None,
                    help="whether torch_npu is in play (default: inferred from ASCEND_*/HCCL_* settings)")
    ec.add_argument("--write", type=Path, default=None, metavar="OUT.env",
                    help="write the valid settings as 'export' lines to source before torchrun; invalid or "
                         "invented ones are left out and listed (the exit status is still 1 then, so "
                         "'... --write run.env && source run.env && torchrun' stops before torchrun)")
    ec.add_argument("--skip-invalid", action="store_true", help=argparse.SUPPRESS)  # old flag; now the default
    ec.add_argument("--catalog", action="store_true",
                    help="print every known setting: what it does, allowed values, default and source")
    ec.set_defaults(handler=_env)


# Each handler imports what it needs: `env check`, `data` and `--help` stay fast and never import torch (whose
# torch_npu autoload can fail on a broken Ascend install; the runner and bench probe it first). Each returns the
# exit status; a WorkbookError it raises is bad input (exit 2, in main).

def _run(args) -> int:
    """``run``: the workbook's notebooks into a run folder; 0 all ok, 1 a notebook failed, 130 interrupted."""
    from helpers.workbook.runner import RunOptions, run

    opts = RunOptions(profile=args.profile, device=args.device,
                      only=tuple(args.only) if args.only is not None else None, out=args.out,
                      resume=args.resume, timeout_s=args.timeout, data_dir=args.data_dir, job=args.job,
                      overrides=tuple((name, value) for name, value in args.overrides),
                      patience=args.patience)
    try:
        _, state = run(opts)
    except KeyboardInterrupt:
        return 130
    return 0 if state.status == "ok" else 1


def _notebooks(args) -> int:
    """``notebooks DEST``: copy the notebooks and their profiles there."""
    from helpers.workbook.paths import copy_notebooks

    copied = copy_notebooks(args.dest)
    print(f"{len(copied)} notebooks in {args.dest} (open them with: jupyter lab {args.dest})")
    return 0


def _data_build(args) -> int:
    """``data build``: the embedded photo dataset (idempotent)."""
    import time

    from helpers.pipeline.dataset import ensure_embedded

    t0 = time.perf_counter()
    path = ensure_embedded(n_images=args.n_images, seed=args.seed)
    print(f"Embedded dataset ready: {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


def _bench(args) -> int:
    """``bench NAME``: print the benchmark's figures as JSON; 1 when its job or reader process failed or hung."""
    from helpers.workbook.bench import run_benchmark

    if args.name in ("allreduce", "ddp"):
        return _bench_launched(args)
    if args.name == "trace":
        try:
            print(run_benchmark(args.name, size_mb=args.size_mb, out=args.out))
        except RuntimeError as exc:  # the reader's process failed or hung: exit 1
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    kwargs = {"dataset-index": dict(n_images=args.images, data_dir=args.data_dir),
              "dataset-cache": dict(profile=args.profile, data_dir=args.data_dir),
              "instrument": dict(device=args.device, blocks=args.repeats),
              "tune": dict(out=args.out, example=args.example),
              "workbook": dict(profile=args.profile, device=args.device, out=args.out),
              "end-to-end": dict(profile=args.profile, device=args.device, data_dir=args.data_dir, run=args.run),
              }.get(args.name, dict(profile=args.profile, device=args.device, data_dir=args.data_dir))
    print(run_benchmark(args.name, **kwargs))
    return 0


def _bench_launched(args) -> int:
    """``bench allreduce`` / ``bench ddp``: a torchrun job; bad flag values or an unavailable backend raise
    (exit 2), a job that ran and failed or hung is exit 1."""
    from helpers.workbook.bench import allreduce_bench, ddp_bench

    try:
        if args.name == "allreduce":
            text = allreduce_bench(backend=args.backend, world_size=args.world_size,
                                   min_bytes=args.min_bytes, max_size_mib=args.max_size_mib,
                                   repeats=args.repeats, warmup=args.warmup, timeout_s=args.timeout,
                                   master_port=args.master_port, device=args.device)
        else:
            text = ddp_bench(job=args.job, profile=args.profile, backend=args.backend,
                             world_size=args.world_size, timeout_s=args.timeout,
                             master_port=args.master_port, device=args.device, data_dir=args.data_dir)
    except WorkbookError:
        raise  # bad flag values, unavailable backend: exit 2 in main
    except (TimeoutError, RuntimeError) as exc:  # the job ran and failed or hung: exit 1
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if text is not None:  # None on ranks other than 0 of a torchrun job
        print(text)
    return 0


def _env(args) -> int:
    """``env check``: :func:`_env_check`, quiet when its reader has gone (``env check --catalog | head``: exit 1)."""
    try:
        status = _env_check(args)
        sys.stdout.flush()  # a closed pipe shows here, not in Python's final flush
        return status
    except BrokenPipeError:  # e.g. `env check --catalog | head`: the reader has gone
        _silence_stdout()
        return 1


def _device_check(args) -> int:
    """``device-check``: the device notebooks and benchmarks in one JSON summary; 1 when a step failed."""
    from helpers.npu_probe import prepare_torch_import

    prepare_torch_import(fallback_to_cpu=True)
    from helpers.workbook.device_check import device_check

    summary = device_check(device=args.device, out=args.out, profile=args.profile)
    failed = [k for k, v in summary["steps"].items() if v["status"] == "failed"]
    return 1 if failed else 0


def _compare(args) -> int:
    """``compare RUN_DIR...``: one report across run folders."""
    from helpers.workbook.report.compare import write_comparison

    html_path, md_path = write_comparison(args.run_dirs, args.out)
    print(f"Comparison: {html_path}\n            {md_path}")
    return 0


def _report(args) -> int:
    """``report RUN_DIR``: rebuild its report; 2 when it is no run folder, 1 when the report cannot be written."""
    from helpers.workbook.report import write_report

    if not (args.run_dir / "run.json").is_file() and not (args.run_dir / "results.jsonl").is_file():
        raise WorkbookError(f"{args.run_dir} is not a run folder (no run.json or results.jsonl)")
    try:
        html, md = write_report(args.run_dir)
    except OSError as exc:  # a full disk, a read-only folder: the files already there are left whole
        print(f"error: the report could not be written in {args.run_dir}: {exc.strerror or exc}; "
              "report.md and report.html already there are left whole", file=sys.stderr)
        return 1
    print(f"Report: {html}\n        {md}")
    return 0


def _diagnose(args) -> int:
    """``diagnose --job`` under its ``--timeout``: stuck past it, the stacks and where it was stuck, exit 1."""
    import math
    import os

    from helpers.errors import ParameterError
    from helpers.stuck import Watchdog

    if not (isinstance(args.timeout, float) and math.isfinite(args.timeout) and args.timeout > 0):
        raise ParameterError(f"--timeout must be a positive number of seconds, got {args.timeout!r}")

    def stuck(sentence: str, _stacks: list) -> None:  # from the watchdog's thread: the main one is stuck
        print(f"error: diagnose ran past --timeout {args.timeout:g} s, {sentence} (the stacks of every thread are "
              f"above); fix what it waits for there, or, if the job is only slow, pass a larger --timeout",
              file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)

    dog = Watchdog(args.timeout, stuck, backstop_s=10.0, backstop_exit=True).start()
    try:
        return _diagnose_job(args)
    finally:
        dog.cancel()


def _diagnose_job(args) -> int:
    """``diagnose --job``: load the job (its errors are theirs, exit 2), run the three-run test, print it."""
    import json

    from helpers.npu_probe import prepare_torch_import

    prepare_torch_import(fallback_to_cpu=True)
    from helpers.device import get_accelerator
    from helpers.experiments.three_run import three_run
    from helpers.jobs.check import first_step_check
    from helpers.jobs.load import load_job

    from helpers.comm.allreduce import launched_by_torchrun

    params = {k: v for k, v in (("batch_size", args.batch_size), ("data_dir", args.data_dir)) if v is not None}
    job = load_job(args.job, params)
    rc = None
    if launched_by_torchrun():  # one rank of a DDP job: the same job, its model in DistributedDataParallel
        import torch.distributed as dist

        from helpers.comm.launch import resolve_backend
        from helpers.comm.rank import init_rank
        from helpers.jobs.distributed import DistributedJob

        kind = get_accelerator(args.device).kind
        rc = init_rank(resolve_backend("auto", kind))
        acc = get_accelerator(rc.device.type, index=rc.device.index or 0)
        job = DistributedJob(job, rc.rank, rc.world_size)
    else:
        acc = get_accelerator(args.device)
    summary = None
    try:
        first_step_check(job, acc)  # a job that cannot train is named part by part before anything is timed
        result = three_run(job, acc, steps=args.steps, warmup_steps=args.warmup_steps, threshold=args.threshold)
        if rc is not None:  # every rank's three runs to rank 0 (the group's store, a timeout for a missing rank)
            from helpers.comm import gather
            from helpers.workbook.job_diagnose import job_summary, rank_payload

            ident = gather.RankIdentity.from_env()
            got = gather.gather_to_root(rank_payload(result, ident, device_kind=acc.kind), ident,
                                        name=f"{gather.job_key()}-diagnose")
            if got is not None:
                summary = job_summary(got.payloads, world_size=got.world_size, missing=got.missing,
                                      threshold=args.threshold)
    finally:
        if rc is not None:
            dist.destroy_process_group()
    if rc is None or rc.rank == 0:  # under torchrun, rank 0 speaks for the job: its own runs, then every rank's
        if args.json:
            out = result.as_dict()
            if summary is not None:
                out["job_ranks"] = {k: v for k, v in summary.items() if k != "lines"}
            print(json.dumps(out, indent=2, default=str))
        else:
            print("\n".join(result.lines() + (summary["lines"] if summary is not None else [])))
    return 1 if result.diverged else 0  # a loss that turned NaN or infinite: no verdict, and the exit says so


def _trace(args) -> int:
    """``trace PATH...``: read the traces (a bar on stderr while that takes a while), analyze, write the report,
    print the summary or the JSON. Bad input raises before anything is written (exit 2); a failed write exits 1."""
    import json

    from helpers.traces import read
    from helpers.traces.analysis import analyze
    from helpers.workbook.trace_report import summary_lines, write_trace_report

    with _TraceProgress("reading traces") as progress:
        traces = read(args.paths, progress=progress)
    a = analyze(traces, threshold=args.threshold)
    try:
        rep = write_trace_report(a, args.out)
    except OSError as exc:  # a full disk, a read-only folder (OutputDirError is a WorkbookError: exit 2 above)
        if isinstance(exc, WorkbookError):
            raise
        print(f"error: the trace report could not be written: {exc.strerror or exc}; files already there are left "
              "whole", file=sys.stderr)
        return 1
    if args.json:
        d = a.as_dict()
        d["report"] = {"html": str(rep.html), "markdown": str(rep.markdown), "results": str(rep.results)}
        print(json.dumps(d, indent=2))
    else:
        print("\n".join(summary_lines(a, rep)))
    return 0


def _tune(args) -> int:
    """``tune -- python train.py ARGS``: the session (:func:`helpers.tune.session.tune`), progress on stderr, the
    summary on stdout. Bad flags or command: exit 2 before anything runs. The script failing on its own: its
    traceback, marked as the script's, and exit 1, with nothing written."""
    import json
    import math
    import os
    import time

    from helpers.process import terminate_like_interrupt
    from helpers.tune.candidates import reported_only
    from helpers.tune.candidates_device import device_reported
    from helpers.tune.engine import ScriptError, parse_command
    from helpers.tune.report import not_tried
    from helpers.tune.session import TuneOptions, files_text, job_text, tune

    words = list(args.command)
    if words and words[0] == "--":
        words = words[1:]
    command = parse_command(words)
    skip = tuple(dict.fromkeys(t.strip() for given in args.skip for t in given.split(",") if t.strip()))
    options = TuneOptions(warmup=args.warmup, steps=args.steps, rounds=args.rounds, timeout_s=args.timeout,
                          skip=skip)
    # your script's folder is the subject here: the report goes to ./tune-runs of the folder you run tune from, a
    # name no tool of the field takes by default (TensorBoard's SummaryWriter writes to ./runs); WORKBOOK_RUNS_DIR,
    # where set, wins as for every run
    root = Path(os.environ["WORKBOOK_RUNS_DIR"]) if os.environ.get("WORKBOOK_RUNS_DIR") else Path.cwd() / "tune-runs"
    out = args.out or root / f"tune-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    if out.exists():
        raise WorkbookError(f"--out {out} exists; give a new folder (tune never writes over an earlier report)")

    def say(line: str) -> None:
        print(f"tune: {line}", file=sys.stderr, flush=True)

    try:
        with terminate_like_interrupt():  # SIGTERM (kill, a scheduler) stops the current run and puts files back
            res = tune(command, out, options, apply=args.apply, progress=say)
    except ScriptError as exc:
        if exc.log:
            print("---- your script's own output (tune changed nothing in this run) ----", file=sys.stderr)
            print(exc.log.rstrip(), file=sys.stderr)
            print("---- end of your script's output ----", file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM: each run puts the user's files back as it ends; nothing written
        print(f"interrupted: tune wrote no change and edited none of your files; what it measured so far is in "
              f"{out}", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(res.as_dict(), indent=2, default=str))
        return 0
    print(res.headline)
    if job_text(res.job):
        print(f"  {job_text(res.job)}")
    for j in res.judgements:
        print(f"  {j.variant}: {j.verdict}, {res.figure(j)}{'' if math.isnan(j.speedup) else ' per step'}")
        if j.verdict in ("rejected", "inconclusive"):
            print(f"    {j.reason}")
    for line in res.not_written():  # a winner tune could not write: the user sets it where it is
        print(f"  not written: {line}")
    # found, not changed: a profiler left on, PIL decode, a conv's bias; on a device a sync, a random factory
    for line in reported_only(res.probe) + device_reported(res.probe):
        print(f"  reported only: {line}")
    for line in not_tried(res.skipped):  # the checklist's other techniques, a line per reason
        print(f"  not tried: {line}")
    if res.diff:
        print(f"the change: {out / 'change.diff'}  (rewritten script: {out / command.script.name})")
    if res.launch:  # a launch setting (the allocator's LD_PRELOAD): the command line to paste, not code
        print(f"the launch command: {res.launch}")
    if res.applied_to:
        print(f"applied to {res.applied_to}; your original is {res.backup}")
    if res.user_files:
        print(f"  {files_text(res.user_files)}; each was put back after every run")
    print(f"  {res.python}")
    print(f"report: {out / 'report.html'} (and report.md beside it)")
    return 0


class _TraceProgress:
    """A ``progress(done, total)`` callback (:data:`helpers.live.Progress`: traces read of all found) drawing a
    tqdm bar on stderr from the start of the reading (a single trace of several GB takes a while to read), only
    when stderr is a terminal; removed on exit."""

    def __init__(self, desc: str) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=None, desc=desc, unit="trace", file=sys.stderr, leave=False, disable=None)

    def __enter__(self):
        return self

    def __call__(self, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.update(done - self.bar.n)

    def __exit__(self, *exc) -> None:
        self.bar.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status (0 ok, 1 a notebook failed, 2 bad input, 130 interrupted)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.handler(args)
    except WorkbookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _env_check(args: argparse.Namespace) -> int:
    """``env check``: print one line per finding; 0 when nothing is invalid or invented, else 1."""
    import os

    from helpers.diagnose import envcatalog as ec
    from helpers.errors import ParameterError

    if args.catalog:
        import shutil

        print(ec.format_catalog(width=min(shutil.get_terminal_size((100, 24)).columns, 120)), end="")
        if args.file is None and not args.settings:
            return 0
        print()
    if args.file is not None or args.settings:
        environ: dict[str, str] = dict(ec.parse_env_file(args.file)) if args.file is not None else {}
        for item in args.settings:
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise ParameterError(f"--set {item!r} is not KEY=VALUE; write e.g. --set HCCL_BUFFSIZE=400")
            environ[name.strip()] = value
        source = "proposed settings"
    else:
        environ = dict(os.environ)
        source = "current environment"
    findings = ec.check_env(environ, npu=args.npu)
    order = {"error": 0, "warning": 1, "ok": 2}
    for finding in sorted(findings, key=lambda f: (order[f.severity], f.name)):
        print(ec.format_finding(finding))
    counts = {sev: sum(f.severity == sev for f in findings) for sev in order}
    print(f"{source}: {counts['error']} invalid or invented, {counts['warning']} warning(s), "
          f"{counts['ok']} valid")
    if args.write is not None:
        envlog = logging.getLogger(ec.__name__)
        level = envlog.level
        envlog.setLevel(logging.ERROR)  # the left-out names are printed below
        try:
            path, _ = ec.write_env_file(environ, args.write, npu=args.npu, skip_invalid=True)
        finally:
            envlog.setLevel(level)
        written = [name for name in ec.parse_env_file(path)]
        left_out = sorted({part for f in findings if f.severity == "error" for part in f.name.split("+")})
        print(f"written: {path} with {len(written)} valid setting(s)"
              + (f": {', '.join(written)}" if written else ""))
        if left_out:
            print(f"left out as invalid or invented: {', '.join(left_out)} (fix them and run again; exit status 1)")
        else:
            print(f"use: source {path} && torchrun ...")
    return 1 if counts["error"] else 0


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's final flush does not fail on a closed pipe."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
