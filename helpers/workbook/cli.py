"""Command line of the workbook: ``python -m helpers <command>``.

Commands
--------
run         execute the notebooks into a run folder and write the report
bench       run a benchmark (input-pipeline) and print its figures as JSON
data build  build the embedded photo dataset (done on first use anyway)
report      rebuild the report of an existing run folder
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from helpers.errors import WorkbookError
from helpers.workbook.specs import DEVICE_CHOICES, PROFILES


def _parser() -> argparse.ArgumentParser:
    argv0 = Path(sys.argv[0]).name
    prog = "python -m helpers" if argv0 in ("__main__.py", "-m", "-c", "") else argv0
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run the workbook's notebooks and write the report")
    r.add_argument("--profile", default=None, choices=PROFILES, help="parameter profile (default: quick)")
    r.add_argument("--device", default=None, choices=DEVICE_CHOICES, help="device kind (default: auto)")
    r.add_argument("--only", nargs="+", default=None, metavar="NN", help="run only these notebooks, e.g. --only 00 01")
    r.add_argument("--data-dir", default=None, metavar="DIR",
                   help="a folder of your own images (optional captions.csv) instead of the embedded photos")
    r.add_argument("--out", type=Path, default=None, metavar="DIR", help="run folder (default: a new one under runs/)")
    r.add_argument("--resume", action="store_true",
                   help="continue the run in --out (default: the latest run), skipping finished notebooks")
    r.add_argument("--timeout", type=float, default=1800.0, metavar="S", help="limit per notebook cell, seconds")

    d = sub.add_parser("data", help="dataset commands")
    dsub = d.add_subparsers(dest="data_command", required=True)
    b = dsub.add_parser("build", help="build the embedded photo dataset (idempotent)")
    b.add_argument("--n-images", type=int, default=512)
    b.add_argument("--seed", type=int, default=0)

    be = sub.add_parser("bench", help="run a benchmark and print its figures as JSON")
    be.add_argument("name", choices=("input-pipeline",), help="which benchmark")
    be.add_argument("--profile", default="quick", choices=PROFILES, help="parameter profile (default: quick)")
    be.add_argument("--device", default="auto", choices=DEVICE_CHOICES, help="device kind (default: auto)")
    be.add_argument("--data-dir", default=None, metavar="DIR", help="a folder of images instead of the embedded photos")

    rep = sub.add_parser("report", help="rebuild report.html and report.md of a run folder")
    rep.add_argument("run_dir", type=Path)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit status (0 ok, 1 a notebook failed, 2 bad input, 130 interrupted)."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "run":
            from helpers.workbook.runner import RunOptions, run

            opts = RunOptions(profile=args.profile, device=args.device,
                              only=tuple(args.only) if args.only is not None else None, out=args.out,
                              resume=args.resume, timeout_s=args.timeout, data_dir=args.data_dir)
            try:
                _, state = run(opts)
            except KeyboardInterrupt:
                return 130
            return 0 if state.status == "ok" else 1
        if args.command == "data":
            import time

            from helpers.pipeline.dataset import ensure_embedded

            t0 = time.perf_counter()
            path = ensure_embedded(n_images=args.n_images, seed=args.seed)
            print(f"Embedded dataset ready: {path} ({time.perf_counter() - t0:.1f} s)")
            return 0
        if args.command == "bench":
            from helpers.workbook.bench import run_benchmark

            print(run_benchmark(args.name, profile=args.profile, device=args.device, data_dir=args.data_dir))
            return 0
        if args.command == "report":
            from helpers.workbook.report import write_report

            if not (args.run_dir / "run.json").is_file() and not (args.run_dir / "results.jsonl").is_file():
                raise WorkbookError(f"{args.run_dir} is not a run folder (no run.json or results.jsonl)")
            html, md = write_report(args.run_dir)
            print(f"Report: {html}\n        {md}")
            return 0
    except WorkbookError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
