"""Record Holistic Trace Analysis (HTA) 0.5.0 reference numbers for public traces.

Writes ``tests/data/public_traces/hta_expected.json``: for every public
profiler trace listed in ``TRACES`` below, HTA's own temporal breakdown
(idle / compute / non-compute time of the GPU, in us and in % of the span
HTA measures) and its GPU kernel-type breakdown (COMPUTATION,
COMMUNICATION, MEMORY and their overlaps), or, where HTA raises, the
exception type and the first line of its message. It also stores the
PyTorch Profiler TensorBoard plugin's own expected DataLoader shares for the
kineto ``tb_plugin`` samples, copied from that plugin's end-to-end test file.

HTA is needed ONLY for this script; the project itself neither imports nor
depends on it. It runs in a venv of its own, where HTA works: HTA 0.5.0
under pandas 3 (the project pins 3.1.1) raises ``TypeError: Invalid value
'[...]' for dtype 'int16'`` on a trace whose correlation ids all fit int16
(below 32,768) while it holds more than 32,767 events (its
``hta/common/trace.py`` gives ``index_correlation`` the downcast dtype of
``correlation``, then writes row numbers into it; reproduced on a trace
of 45,139 events and 9,018 correlation ids, which pandas 2.3.3 reads). The
JSON was produced like this (Python 3.11, CPU only; first with pandas
2.2.3 and numpy 2.2.6, which give the same numbers)::

    python3 -m venv /tmp/hta-venv
    /tmp/hta-venv/bin/pip install HolisticTraceAnalysis==0.5.0 \
        pandas==2.3.3 numpy==2.4.6
    /tmp/hta-venv/bin/python tests/tools/hta_reference.py \
        --traces-root /tmp/pt_stage

The same interpreter runs tests/test_trace_hta.py's HTA
(``HTA_PYTHON=/tmp/hta-venv/bin/python``). Under pandas 3 this script
refuses to run. ``--traces-root`` is the folder that holds the traces in
the layout of ``tests/data/public_traces/README.md``
(``hta/<subdir>/<file>``, ``tb_plugin/<sample>/<file>``); without it the
script uses ``$PUBLIC_TRACES_DIR``, else the first of
``tests/data/public_traces`` and ``../shared/public_traces`` that holds
every file, else a temporary folder. Missing files are taken from git
clones of the two source repositories at the pinned commits
(``--hta-git``/``$HTA_GIT`` and ``--kineto-git``/``$KINETO_GIT``, each a
clone or bare git directory; by default this workplace's mirrors under
/work/.mirror when present). Every file is checked against its SHA-256
before use.

Each job (one folder of rank files, as HTA expects) is copied into its own
temporary folder and read with ``TraceAnalysis(trace_dir=...)`` with HTA's
defaults (``include_last_profiler_step=False``). The kernel-type breakdown
of HTA sums over all ranks of a job, so it is taken per rank from a run on
that rank's file alone; the temporal breakdown is taken from the job run.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import hashlib
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
OUT_DIR = REPO_ROOT / "tests" / "data" / "public_traces"
OUT_FILE = OUT_DIR / "hta_expected.json"

HTA_REPO = "facebookresearch/HolisticTraceAnalysis"
HTA_COMMIT = "f4d0062c382f42bd8a74838bcdad1916c7d5d2da"
KINETO_REPO = "pytorch/kineto"
# Last kineto commit that still has tb_plugin/ (removed in 94979607, #1368).
KINETO_COMMIT = "041e7ce99f1562dd81232ee58b7c454ef16bfae2"
# Last kineto commit with the first (Feb 2021) resnet50 samples.
KINETO_OLD_COMMIT = "897a49cfd49f0064b90ae108dcee5e13be7020a3"

# (path under public_traces/, source repo, commit, path in that repo, sha256, job)
TRACES = [
    ("hta/trace_filter/sampled_rank-0.json.gz", HTA_REPO, HTA_COMMIT,
     "tests/data/trace_filter/sampled_rank-0.json.gz",
     "71b98c30a2751cc56d9bf78f8fb76467acd56e0be6a1f0da23c600941d29aafd",
     "hta/trace_filter"),
    ("hta/trace_filter/sampled_rank-1.json.gz", HTA_REPO, HTA_COMMIT,
     "tests/data/trace_filter/sampled_rank-1.json.gz",
     "2f9a65fd5f319ec8e60468a22dc9a624eb4b40369c729f6f897259d587eca57e",
     "hta/trace_filter"),
    ("hta/nccl_parser_config/nccl_data.json.gz", HTA_REPO, HTA_COMMIT,
     "tests/data/nccl_parser_config/nccl_data.json.gz",
     "c1cf9c575fdcd7bdc6326ceab834f94b351f81ae55577a7471aa9e328fb8b58e",
     "hta/nccl_parser_config"),
    ("hta/negative_queue_length_values_check/rank0.json.gz", HTA_REPO, HTA_COMMIT,
     "tests/data/negative_queue_length_values_check/rank0.json.gz",
     "b8ce7a1a143b55dd1811d269272b09d1c693ffea85b91858f5fb246e7ad8c5f8",
     "hta/negative_queue_length_values_check"),
    ("hta/trace_diff/control/control.json.gz", HTA_REPO, HTA_COMMIT,
     "tests/data/trace_diff/control/control.json.gz",
     "43ed872e4c5dc2e8da5946d761ed61923a75c6c799cc62be9e1c859d440a56fd",
     "hta/trace_diff/control"),
    ("hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
     HTA_REPO, HTA_COMMIT,
     "tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
     "e279d7280e73719e8dd9550e120cfe081fbe268596bd297fe5fcbf63e2b75a09",
     "hta/ns_resolution_trace"),
    ("hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz", HTA_REPO, HTA_COMMIT,
     "tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
     "39fdab670f9e80a05ccc6d0d07611b3aeba1092fa10681d8dd08cea48d0488b5",
     "hta/amd_trace"),
    ("hta/mtia_inference_trace/mtia_inference_rank_0.json.gz", HTA_REPO, HTA_COMMIT,
     "tests/data/mtia_inference_trace/mtia_inference_rank_0.json.gz",
     "ed1b118e53f23f3a3a055dec52f6cc45eaf32c6354e8693335cfca608cff84f5",
     "hta/mtia_inference_trace"),
    ("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz", HTA_REPO, HTA_COMMIT,
     "tests/data/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
     "b2ff87b29bd604b0c30bca65915af4388b53a7f421f0897c68a7862e1559b6e5",
     "hta/cpu_only"),
    ("hta/distributed_info_unavailable/distributed_info_not_found.json.gz",
     HTA_REPO, HTA_COMMIT,
     "tests/data/distributed_info_unavailable/distributed_info_not_found.json.gz",
     "2294b134930afc9253c9cc80c31ff7b40709f4114b51a37301dc7a19046bf7d2",
     "hta/distributed_info_unavailable"),
    ("hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
     HTA_REPO, HTA_COMMIT,
     "tests/data/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
     "b9febb1abc8cc729a2890fb6a4171de9867ba72c944437ee046067e7c89912dc",
     "hta/critical_path/alexnet"),
    ("hta/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
     HTA_REPO, HTA_COMMIT,
     "tests/data/cupti_profiler/benchmark_result_924719_1679055439_trace.json.gz",
     "07e7e02da9cfda66f5b6fc5fd17e1f93185321504496f4c00e8d375fb162bf84",
     "hta/cupti_profiler"),
    ("tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
     KINETO_REPO, KINETO_COMMIT,
     "tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
     "a91798b500ce9d6e21c416ce32dcd8ecf4788489df86f59ba2f944906c90b853",
     "tb_plugin/resnet50_num_workers_0/span1"),
    ("tb_plugin/resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz",
     KINETO_REPO, KINETO_COMMIT,
     "tb_plugin/samples/resnet50_num_workers_0/worker0.1623143566756.pt.trace.json.gz",
     "da8bcc1a45ec0c3fd8b3c0acf64fbd42c10f31b854707b47561fd4f6cc084108",
     "tb_plugin/resnet50_num_workers_0/span2"),
    ("tb_plugin/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
     KINETO_REPO, KINETO_COMMIT,
     "tb_plugin/samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz",
     "c290eb249e74824736f81886587614fc5d96660d3e60d0c256dee4b4a0e268f6",
     "tb_plugin/resnet50_num_workers_4/span1"),
    ("tb_plugin/resnet50_num_workers_4/worker0.1623213129365.pt.trace.json.gz",
     KINETO_REPO, KINETO_COMMIT,
     "tb_plugin/samples/resnet50_num_workers_4/worker0.1623213129365.pt.trace.json.gz",
     "e4e6a307dd28e4aae8c93d059a100fd9dd9097b197de278c175e34e6ec69de01",
     "tb_plugin/resnet50_num_workers_4/span2"),
    ("tb_plugin/resnet50_num_workers_0_pt18/worker0.pt.trace.json.gz",
     KINETO_REPO, KINETO_OLD_COMMIT,
     "tb_plugin/samples/resnet50_num_workers_0/worker0.pt.trace.json.gz",
     "0d6383785d77ef8bfe8b267cf7ad269c8240bb4414683305e1930c974a9a7aa9",
     "tb_plugin/resnet50_num_workers_0_pt18"),
    ("tb_plugin/resnet50_num_workers_4_pt18/worker0.pt.trace.json.gz",
     KINETO_REPO, KINETO_OLD_COMMIT,
     "tb_plugin/samples/resnet50_num_workers_4/worker0.pt.trace.json.gz",
     "fe04293a3612672d2832918afb4bf3af82e1b0a2fc896e1310be7813d1dea03a",
     "tb_plugin/resnet50_num_workers_4_pt18"),
]


# The plugin's own expected Overview answers, read from its end-to-end test
# file (tb_plugin/test/result_check_file.txt, which test_tensorboard_end2end.py
# compares byte for byte with the live plugin's /overview answer). Rows are
# the "steps" table (step -> DataLoader us; step time = sum of the row's
# Kernel, Memcpy, Memset, Runtime, DataLoader, CPU Exec, Other columns) and
# the "performance" block (average step time, DataLoader us and % of step).
TB_PLUGIN_EXPECTED = {
    "tb_plugin/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz": {
        "source": {"repo": KINETO_REPO, "commit": KINETO_COMMIT,
                   "path": "tb_plugin/test/result_check_file.txt",
                   "line": 1,
                   "request": "overview?run=resnet50_num_workers_0&worker=worker0&span=1",
                   "test": "tb_plugin/test/test_tensorboard_end2end.py"},
        "step_rows": {  # step: [Kernel, Memcpy, Memset, Runtime, DataLoader, CPU Exec, Other]
            5: [98598, 1941, 90, 2796, 69317, 14091, 1115],
            6: [98570, 1947, 89, 2762, 57669, 12968, 1148],
            7: [98596, 1931, 91, 2877, 61257, 13768, 1213],
            8: [98623, 1938, 89, 2841, 56453, 13420, 1200],
            9: [98504, 1937, 87, 2788, 62690, 15025, 1141],
            10: [98641, 1798, 88, 3381, 48185, 12773, 1117],
        },
        "average_step_time_us": 177592,
        "average_dataloader_us": 59262,
        "average_dataloader_pct": 33.37,
        "recommendation": "This run has high time cost on input data loading. "
                          "33.4% of the step time is in DataLoader.",
    },
    "tb_plugin/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz": {
        "source": {"repo": KINETO_REPO, "commit": KINETO_COMMIT,
                   "path": "tb_plugin/test/result_check_file.txt",
                   "line": 6,
                   "request": "overview?run=resnet50_num_workers_4&worker=worker0&span=1",
                   "test": "tb_plugin/test/test_tensorboard_end2end.py"},
        "step_rows": {
            5: [99778, 3606, 98, 41028, 4341, 27460, 5995],
            6: [99208, 2948, 98, 3406, 0, 16404, 4119],
            7: [99114, 2949, 98, 3417, 6, 19521, 2076],
            8: [99021, 2975, 97, 3544, 0, 15464, 1978],
            9: [98791, 3596, 97, 8275, 1370, 43905, 7427],
            10: [98956, 2885, 98, 3714, 1400, 13235, 3910],
        },
        "average_step_time_us": 141068,
        "average_dataloader_us": 1186,
        "average_dataloader_pct": 0.84,
        "recommendation": None,
    },
    "tb_plugin/resnet50_num_workers_0_pt18/worker0.pt.trace.json.gz": {
        "source": {"repo": KINETO_REPO, "commit": KINETO_OLD_COMMIT,
                   "path": "tb_plugin/test/result_check_file.txt",
                   "line": 1,
                   "request": "overview?run=resnet50_num_workers_0&worker=worker0",
                   "test": "tb_plugin/test/test_tensorboard_end2end.py"},
        "step_rows": {
            5: [100863, 1948, 69, 3346, 10023, 12460, 1274],
            6: [100576, 2436, 69, 3144, 37553, 13420, 1301],
            7: [100821, 2111, 69, 1756, 28965, 5907, 705],
            8: [101109, 2078, 69, 2040, 49998, 7087, 745],
            9: [101108, 2072, 69, 2926, 25338, 9084, 810],
            10: [100732, 2089, 69, 4174, 35514, 14748, 1742],
        },
        "average_step_time_us": 148736,
        "average_dataloader_us": 31232,
        "average_dataloader_pct": 21.0,
        "recommendation": "This run has high time cost on input data loading. "
                          "21.0% of the step time is in DataLoader.",
    },
    "tb_plugin/resnet50_num_workers_4_pt18/worker0.pt.trace.json.gz": {
        "source": {"repo": KINETO_REPO, "commit": KINETO_OLD_COMMIT,
                   "path": "tb_plugin/test/result_check_file.txt",
                   "line": 6,
                   "request": "overview?run=resnet50_num_workers_4&worker=worker0",
                   "test": "tb_plugin/test/test_tensorboard_end2end.py"},
        "step_rows": {
            5: [101214, 3344, 54, 2996, 3, 10088, 740],
            6: [101100, 3239, 54, 2811, 15, 8391, 750],
            7: [101159, 3218, 54, 2584, 23, 6908, 637],
            8: [101317, 3251, 54, 2929, 13, 11610, 710],
            9: [101022, 3308, 54, 3002, 16, 9021, 750],
            10: [101236, 3361, 54, 2192, 0, 8527, 24044],
        },
        "average_step_time_us": 120976,
        "average_dataloader_us": 12,
        "average_dataloader_pct": 0.01,
        "recommendation": None,
    },
}
STEP_COLUMNS = ["Kernel", "Memcpy", "Memset", "Runtime", "DataLoader", "CPU Exec", "Other"]


def tb_plugin_expected():
    out = {
        "_note": (
            "Expected Overview answers of the PyTorch Profiler TensorBoard plugin "
            "for its own samples, from tb_plugin/test/result_check_file.txt "
            "(compared byte for byte with the plugin's /overview answer by "
            "tb_plugin/test/test_tensorboard_end2end.py). Only span 1 of each "
            "2021-06 run is checked there; span 2 has no expected answer. "
            "Step time = sum of the step row; DataLoader share = DataLoader / step time."
        ),
        "step_columns": STEP_COLUMNS,
    }
    for rel, exp in TB_PLUGIN_EXPECTED.items():
        rows = exp["step_rows"]
        per_step = {}
        for step, row in sorted(rows.items()):
            total = sum(row)
            dl = row[STEP_COLUMNS.index("DataLoader")]
            per_step[str(step)] = {
                "step_time_us": total,
                "dataloader_us": dl,
                "dataloader_pct": round(100.0 * dl / total, 2),
            }
        out[rel] = {
            "source": exp["source"],
            "steps": per_step,
            "average_step_time_us": exp["average_step_time_us"],
            "average_dataloader_us": exp["average_dataloader_us"],
            "average_dataloader_pct": exp["average_dataloader_pct"],
            "recommendation": exp["recommendation"],
        }
    return out


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _default_git(env: str, repo: str):
    """$HTA_GIT / $KINETO_GIT, else this workplace's mirror of the repo, if any."""
    if os.environ.get(env):
        return Path(os.environ[env])
    mirror = Path("/work/.mirror") / repo.replace("/", "+") / "repo"
    return mirror if mirror.is_dir() else None


def _pick_root(explicit):
    """Return (traces root, whether it is a scratch folder to delete at the end)."""
    if explicit is None and os.environ.get("PUBLIC_TRACES_DIR"):
        explicit = Path(os.environ["PUBLIC_TRACES_DIR"])
    if explicit is not None:
        return explicit.resolve(), False
    for cand in (OUT_DIR, REPO_ROOT.parent / "shared" / "public_traces"):
        if all((cand / t[0]).is_file() for t in TRACES):
            return cand.resolve(), False
    return Path(tempfile.mkdtemp(prefix="public_traces_")), True


def materialize(root: Path, git_dirs: dict) -> None:
    """Make sure every trace is under root; take missing ones from git clones."""
    for rel, repo, commit, src, digest, _job in TRACES:
        dest = root / rel
        if not dest.exists():
            git_dir = git_dirs.get(repo)
            if not git_dir:
                raise SystemExit(f"missing {dest}; pass the git clone of {repo}")
            dest.parent.mkdir(parents=True, exist_ok=True)
            blob = subprocess.run(
                ["git", "-C", str(git_dir), "show", f"{commit}:{src}"],
                check=True, capture_output=True).stdout
            dest.write_bytes(blob)
        got = sha256(dest)
        if got != digest:
            raise SystemExit(f"{dest}: sha256 {got} != {digest}")


def trace_info(path: Path) -> dict:
    """What the file says about itself, read without HTA."""
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    cats = collections.Counter(e.get("cat") for e in events if e.get("ph") == "X")
    steps = sorted({int(e["name"].split("#", 1)[1]) for e in events
                    if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
                    and e["name"].split("#", 1)[1].isdigit()})
    dist = doc.get("distributedInfo") if isinstance(doc, dict) else None
    devices = doc.get("deviceProperties") if isinstance(doc, dict) else None
    return {
        "bytes": path.stat().st_size,
        "sha256": sha256(path),
        "events": len(events),
        "complete_event_cats": dict(cats.most_common()),
        "profiler_steps": len(steps),
        "profiler_step_ids": steps,
        "distributed_info": ({k: dist.get(k) for k in ("rank", "world_size", "backend")}
                             if dist else None),
        "device_names": sorted({d.get("name") for d in devices}) if devices else None,
    }


def _error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ").rstrip()


def _num(x):
    if x is None:
        return None
    try:
        f = float(x)
    except (TypeError, ValueError):
        return x
    if f != f:  # NaN
        return None
    return int(f) if f.is_integer() else round(f, 4)


def run_hta(files: list, root: Path):
    """Run HTA on one folder holding files; return (analysis or None, error)."""
    from hta.trace_analysis import TraceAnalysis

    tmp = Path(tempfile.mkdtemp(prefix="hta_ref_"))
    for rel in files:
        shutil.copy2(root / rel, tmp / Path(rel).name)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return TraceAnalysis(trace_dir=str(tmp)), None, tmp
    except Exception as exc:  # noqa: BLE001 - we record whatever HTA raises
        return None, _error(exc), tmp


def rank_of_file(analysis, name: str):
    for rank, path in analysis.t.trace_files.items():
        if Path(path).name == name:
            return int(rank)
    return None


def temporal_rows(analysis):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        df = analysis.get_temporal_breakdown(visualize=False)
    rows = {}
    for rec in df.to_dict("records"):
        rows[int(rec["rank"])] = {
            "idle_us": _num(rec["idle_time(us)"]),
            "compute_us": _num(rec["compute_time(us)"]),
            "non_compute_us": _num(rec["non_compute_time(us)"]),
            "total_us": _num(rec["kernel_time(us)"]),
            "idle_pct": _num(rec["idle_time_pctg"]),
            "compute_pct": _num(rec["compute_time_pctg"]),
            "non_compute_pct": _num(rec["non_compute_time_pctg"]),
        }
    return rows


def kernel_types(analysis):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kt, _kernels = analysis.get_gpu_kernel_breakdown(
            visualize=False, include_memory_kernels=True)
    return {str(r["kernel_type"]): {"us": _num(r["sum"]), "pct": _num(r["percentage"])}
            for r in kt.to_dict("records")}


def hta_profiler_steps(analysis):
    try:
        return [int(s) for s in analysis.get_profiler_steps()]
    except Exception as exc:  # noqa: BLE001
        return _error(exc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces-root", type=Path,
                    help="folder in the public_traces layout (default: $PUBLIC_TRACES_DIR, "
                         "else the first of tests/data/public_traces and "
                         "../shared/public_traces that holds every file, else a temporary "
                         "folder filled from the git clones)")
    ap.add_argument("--hta-git", type=Path,
                    default=_default_git("HTA_GIT", HTA_REPO), help="git clone of " + HTA_REPO)
    ap.add_argument("--kineto-git", type=Path,
                    default=_default_git("KINETO_GIT", KINETO_REPO),
                    help="git clone of " + KINETO_REPO)
    ap.add_argument("--out", type=Path, default=OUT_FILE)
    args = ap.parse_args(argv)

    logging.disable(logging.WARNING)
    import hta  # noqa: F401 - fail early with a clear ImportError
    from importlib.metadata import version

    if int(version("pandas").split(".")[0]) >= 3:
        print(f"hta_reference.py: HTA 0.5.0 raises TypeError (an int16 column) under pandas {version('pandas')} "
              "on traces of more than 32,767 events; run this script from a venv with pandas==2.3.3 (see its "
              "docstring)", file=sys.stderr)
        return 2

    root, scratch = _pick_root(args.traces_root)
    materialize(root, {HTA_REPO: args.hta_git, KINETO_REPO: args.kineto_git})

    jobs = collections.OrderedDict()
    for rel, *_rest, job in TRACES:
        jobs.setdefault(job, []).append(rel)

    results = {}
    for job, files in jobs.items():
        print(f"[{job}] {len(files)} file(s)", flush=True)
        analysis, job_error, tmp = run_hta(files, root)
        job_temporal, job_temporal_error = {}, None
        if analysis is not None:
            try:
                job_temporal = temporal_rows(analysis)
            except Exception as exc:  # noqa: BLE001
                job_temporal_error = _error(exc)
        for rel in files:
            src = next(t for t in TRACES if t[0] == rel)
            entry = {
                "hta_version": version("HolisticTraceAnalysis"),
                "job": job,
                "job_files": [Path(f).name for f in files],
                "source": {"repo": src[1], "commit": src[2], "path": src[3]},
                "trace": trace_info(root / rel),
                "rank": None,
                "hta_profiler_steps": None,
                "temporal": None,
                "kernel_type": None,
                "error": None,
            }
            errors = []
            if analysis is None:
                errors.append(f"TraceAnalysis: {job_error}")
            else:
                rank = rank_of_file(analysis, Path(rel).name)
                entry["rank"] = rank
                entry["hta_profiler_steps"] = hta_profiler_steps(analysis)
                if job_temporal_error:
                    errors.append(f"get_temporal_breakdown: {job_temporal_error}")
                else:
                    entry["temporal"] = job_temporal.get(rank)
            # Kernel-type shares per rank: HTA sums them over a job's ranks.
            single = analysis if len(files) == 1 else None
            single_tmp = None
            if single is None and analysis is not None:
                single, single_error, single_tmp = run_hta([rel], root)
                if single is None:
                    errors.append(f"TraceAnalysis(single rank): {single_error}")
            if single is not None:
                try:
                    entry["kernel_type"] = kernel_types(single)
                except Exception as exc:  # noqa: BLE001
                    errors.append(f"get_gpu_kernel_breakdown: {_error(exc)}")
            if single_tmp is not None:
                shutil.rmtree(single_tmp, ignore_errors=True)
            entry["error"] = "; ".join(errors) or None
            results[rel] = entry
            print(f"  {rel}: rank={entry['rank']} error={entry['error']}", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)

    doc = {
        "_generated_by": "tests/tools/hta_reference.py",
        "_environment": {
            "python": platform.python_version(),
            "HolisticTraceAnalysis": version("HolisticTraceAnalysis"),
            "pandas": version("pandas"),
            "numpy": version("numpy"),
            "hta_call": "TraceAnalysis(trace_dir=<job folder>) with defaults "
                        "(include_last_profiler_step=False); "
                        "get_temporal_breakdown(visualize=False); "
                        "get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True) "
                        "on each rank's file alone",
            "temporal_fields": "HTA's idle_time(us), compute_time(us), non_compute_time(us), "
                               "kernel_time(us) (= total_us, first kernel start to last kernel "
                               "end) and their *_pctg of kernel_time",
        },
    }
    doc.update(results)  # one key per trace file, its path under public_traces/
    doc["tb_plugin_expected"] = tb_plugin_expected()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    print(f"wrote {args.out}")
    if scratch:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
