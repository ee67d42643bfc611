"""The parameters of every notebook, declared once.

The runner validates a run's parameters against these specs before any
notebook starts, and each notebook validates its own parameters cell against
the same spec in its first code cell, so a bad value fails in the same words
whichever way the notebook was started (runner, papermill CLI, JupyterLab).
A test keeps each spec identical to the names in the notebook's
``parameters`` cell.
"""

from __future__ import annotations

import ast
from typing import Mapping

from helpers import checklist
from helpers.errors import ParameterError
from helpers.params import Param, validate

DEVICE_CHOICES = ("auto", "cpu", "cuda", "npu")
PROFILES = ("smoke", "quick", "full")

_COMMON = (
    Param("device", str, "auto", "device kind to run on", choices=DEVICE_CHOICES,
          hints={"gpu": "cuda", "ascend": "npu"}),
    Param("results_path", str, "", "JSON-lines results file; empty: runs/interactive/results.jsonl"),
    Param("out_dir", str, "", "folder for figures and traces; empty: runs/interactive"),
    Param("busy_cpu_share", float, 0.25,
          "share of the cores other processes may take while measuring before the verdict is inconclusive",
          minimum=0.01, maximum=1.0),
)

_DATA = (
    Param("data_dir", str, "", "folder of images (optional captions.csv); empty: the embedded photos"),
    Param("max_images", int, 0, "use at most this many images (0 for all)", minimum=0),
    Param("seed", int, 0, "seed for data order, augmentation and model init", minimum=0),
)


#: The user's own job, in the notebooks that can measure one (the runner's --job passes it).
_JOB = (Param("job", str, "", "your own job, path/to/job.py:make_job or module:attr (empty: the built-in PPO job)"),)


#: Training crop of the end-to-end job (notebooks 01 and 10). At 64 px the baseline's data phase (full-size
#: decodes, independent of the crop) is >= 70% of the step on a 2-core CPU: the host-bound job the workbook fixes.
JOB_IMAGE_SIZE = 64
#: Conv width of that job. Every notebook whose verdict notebook 10 applies defaults to this job (and every
#: profile sets one job for them: tests/test_profiles.py), so a verdict is measured on the job it is applied to.
JOB_MODEL_WIDTH = 16


def _batch(help_batch: str = "samples per training step", image_size: int = JOB_IMAGE_SIZE) -> tuple[Param, ...]:
    """batch_size, image_size and text_len: the shape of a batch of the workload."""
    return (
        Param("batch_size", int, 32, help_batch, minimum=1, maximum=4096),
        Param("image_size", int, image_size, "side of the square training crop, px", minimum=16, maximum=1024),
        Param("text_len", int, 16, "caption length in tokens (padded/truncated)", minimum=2, maximum=512),
    )


def _training(model_width: int, steps_help: str = "measured training steps") -> tuple[Param, ...]:
    """model_width, d_model, steps and warmup_steps: the size and length of a timed training run."""
    return (
        Param("model_width", int, model_width, "channels of the first conv stage (stages use 1x, 2x, 4x)",
              minimum=4, maximum=512),
        Param("d_model", int, 64, "width of the text transformer", minimum=8, maximum=4096),
        Param("steps", int, 20, steps_help, minimum=1, maximum=100000),
        Param("warmup_steps", int, 3, "steps run before measuring (excluded)", minimum=0, maximum=1000),
    )


SPECS: dict[str, tuple[Param, ...]] = {
    "00_environment_check": _COMMON + (
        Param("npu_probe_timeout_s", float, 120.0, "seconds to wait for the torch_npu probe",
              minimum=1.0, maximum=3600.0),
        Param("fallback_to_cpu", bool, True,
              "if torch_npu is broken, import torch without it (sets TORCH_DEVICE_BACKEND_AUTOLOAD to 0)"),
    ),
    "01_baseline_profiling": _COMMON + _DATA + _batch() + _training(JOB_MODEL_WIDTH) + (
        Param("host_bound_threshold", float, 0.10,
              "exposed input time / step time above which the job is called host-bound",
              minimum=0.0, maximum=1.0),
        Param("preprocess_samples", int, 64, "images timed one by one for ms/image", minimum=1,
              maximum=100000),
        Param("profile_steps", int, 2, "steps recorded by the profiler (0 skips profiling)",
              minimum=0, maximum=100),
        Param("ceiling_steps", int, 10, "measured steps of each run of the input-free ceiling (real vs on-device "
              "batches)", minimum=3, maximum=100000),
        Param("trace_path", str, "", "your profiler trace: a .pt.trace.json(.gz), an *_ascend_pt folder, or a folder "
              "of one per rank (empty: section 4's)"),
    ) + _JOB,
    "02_batched_decode": _COMMON + _DATA + _batch("images per batch") + (
        Param("threads", int, 0, "decode threads of the batched pipeline (0 for all usable cores)",
              minimum=0, maximum=256),
        Param("repeats", int, 10, "timed batches per variant", minimum=3, maximum=10000),
        Param("warmup", int, 2, "untimed batches per variant before timing", minimum=0, maximum=100),
        Param("psnr_min_db", float, 30.0, "least PSNR of batched vs reference pixels to call them equal",
              minimum=10.0, maximum=100.0),
        Param("dataset_cache", bool, True, "also measure the decode-once dataset cache (built on disk on first use)"),
        Param("max_cache_mib", int, 2048, "largest decode-once cache to build, MiB", minimum=1, maximum=1 << 22),
    ),
    "03_dataloader_tuning": _COMMON + _DATA + _batch("images per batch") + (
        Param("num_workers_list", list, [0, 1, 2, 3], "num_workers values to sweep", item_kind=int,
              minimum=0, maximum=256),
        Param("prefetch_factor_list", list, [2, 4], "prefetch_factor values to sweep (workers > 0 only)",
              item_kind=int, minimum=1, maximum=64),
        Param("batches_per_trial", int, 8, "timed batches per loader setting and trial", minimum=2,
              maximum=100000),
        Param("trials", int, 2, "rounds over all settings (rotated order)", minimum=1, maximum=100),
        Param("first_batch_timeout_s", float, 120.0, "seconds to wait for any worker batch, the first included",
              minimum=1.0, maximum=3600.0),
        Param("probe_epochs", int, 2, "epochs drawn by the worker-randomness probe", minimum=1, maximum=20),
        Param("probe_ranks", int, 2, "simulated distributed ranks in the randomness probe", minimum=1,
              maximum=64),
    ) + _JOB,
    "04_pinned_memory": _COMMON + (
        Param("min_size_kib", int, 4, "smallest transfer, KiB", minimum=1, maximum=1 << 20),
        Param("max_size_mib", int, 256, "largest transfer, MiB", minimum=1, maximum=1 << 16),
        Param("repeats", int, 10, "timed copies per size and method", minimum=3, maximum=10000),
        Param("warmup", int, 2, "untimed copies per size and method", minimum=0, maximum=100),
        Param("link_gbps", float, 0.0, "host-device link limit, GB/s (0 reads it from sysfs where possible)",
              minimum=0.0, maximum=10000.0),
        Param("batch_size", int, 32, "images per batch for the per-batch comparison", minimum=1, maximum=4096),
        Param("image_size", int, JOB_IMAGE_SIZE, "side of the square crop of that batch, px", minimum=16, maximum=1024),
    ) + _JOB,
    "05_stream_overlap": _COMMON + _DATA + _batch() + _training(JOB_MODEL_WIDTH, "measured training steps per variant") + (
        Param("num_workers", int, 1, "DataLoader worker processes of the overlapped variant", minimum=0,
              maximum=256),
        Param("prefetch_factor", int, 2, "batches each worker prepares ahead", minimum=1, maximum=64),
    ) + _JOB,
    "06_mixed_precision": _COMMON + _DATA + _batch() + _training(JOB_MODEL_WIDTH, "timed training steps per variant") + (
        Param("autocast_dtype", str, "auto", "low-precision dtype: auto picks what the device supports",
              choices=("auto", "bfloat16", "float16")),
        Param("curve_steps", int, 30, "training steps of the fp32 and mixed-precision loss curves",
              minimum=2, maximum=100000),
        Param("loss_rtol", float, 0.10,
              "tolerance of mixed vs fp32 mean loss over the last steps, as a share of the loss's scale over the run",
              minimum=0.0, maximum=10.0),
        Param("init_scale", float, 1024.0, "GradScaler initial loss scale (fp16 only)", minimum=1.0,
              maximum=1e10),
        Param("growth_interval", int, 200, "GradScaler steps without overflow before the scale grows",
              minimum=1, maximum=1000000),
    ) + _JOB,
    "07_channels_last": _COMMON + _DATA + _batch() + _training(JOB_MODEL_WIDTH, "timed training steps per variant") + (
        Param("compile_model", bool, True, "also measure torch.compile of the model (slow to compile)"),
        Param("attention_seq_len", int, 128, "sequence length of the attention comparison", minimum=1,
              maximum=65536),
        Param("attention_heads", int, 4, "heads of the attention comparison", minimum=1, maximum=256),
        Param("attention_head_dim", int, 32, "width of one head in the attention comparison", minimum=1,
              maximum=1024),
    ) + _JOB,
    "08_collectives": _COMMON + _DATA + _batch("samples per rank per DDP step") + _training(
            JOB_MODEL_WIDTH, "timed DDP steps per variant") + (
        Param("backend", str, "auto", "torch.distributed backend: auto picks hccl on npu, nccl on cuda, gloo on cpu",
              choices=("auto", "gloo", "nccl", "hccl")),
        Param("world_size", int, 2, "processes in the process group (one per device on cuda/npu)", minimum=2,
              maximum=64),
        Param("min_bytes", int, 8, "smallest allreduce message, bytes", minimum=4, maximum=1 << 30),
        Param("max_size_mib", int, 256, "largest allreduce message, MiB", minimum=1, maximum=1 << 16),
        Param("repeats", int, 10, "timed allreduces per message size", minimum=3, maximum=10000),
        Param("warmup", int, 3, "untimed allreduces per message size", minimum=0, maximum=1000),
        Param("bucket_cap_mb_list", list, [0.25, 1, 25], "DDP bucket_cap_mb values to sweep (25 is DDP's default)",
              item_kind=float, minimum=0.01, maximum=4096),
        Param("compression_hooks", list, ["none", "fp16", "bf16"],
              "DDP gradient compression hooks to compare (none is plain allreduce)", item_kind=str,
              choices=("none", "fp16", "bf16")),
        Param("timeout_s", float, 300.0, "seconds before a collective job counts as hung and is stopped",
              minimum=5.0, maximum=7200.0),
        Param("master_port", int, 0, "TCP port of the rendezvous on 127.0.0.1 (0 picks a free one)", minimum=0,
              maximum=65535),
    ) + _JOB,
    "09_memory_and_batch_size": _COMMON + _DATA + _batch("samples per step of the memory trace") + _training(
            JOB_MODEL_WIDTH, "training steps of the memory trace, and of each side of the current-vs-best batch comparison") + (
        Param("memory_budget_mib", int, 0,
              "memory the batch-size finder may use, MiB (0: the device's free memory; on CPU half the available RAM)",
              minimum=0, maximum=1 << 24),
        Param("finder_start_batch", int, 8, "first batch size the finder tries", minimum=1, maximum=1 << 20),
        Param("finder_max_batch", int, 256, "largest batch size the finder tries", minimum=1, maximum=1 << 20),
        Param("finder_steps", int, 3, "timed training steps per batch size tried", minimum=1, maximum=1000),
        Param("safety_margin", float, 0.10, "fraction of memory kept free when choosing the batch size",
              minimum=0.0, maximum=0.9),
        Param("alloc_conf_list", list, ["", "expandable_segments:True"],
              "allocator settings to compare on cuda/npu (PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NPU_ALLOC_CONF)",
              item_kind=str),
    ) + _JOB,
    "10_end_to_end": _COMMON + _DATA + _batch() + _training(
            JOB_MODEL_WIDTH, "measured training steps per job") + (
        Param("optimizations", list, ["auto"],
              "optimizations of the optimized job: auto follows the earlier verdicts of this run; or names "
              f"from {', '.join(checklist.optimization_names())}",
              item_kind=str),
        Param("ablation", bool, True, "also run the optimized job with each optimization removed in turn"),
        Param("curve_steps", int, 30, "training steps of the learning curves of both jobs", minimum=2,
              maximum=100000),
        Param("loss_rtol", float, 0.10,
              "tolerance of optimized vs baseline mean loss over the last steps, as a share of the loss's scale over the run",
              minimum=0.0, maximum=10.0),
        Param("projection_steps", int, 100000, "training steps of the projected full job (before vs after)",
              minimum=1, maximum=10**12),
        Param("host_bound_threshold", float, 0.10,
              "exposed input time / step time above which the job is called host-bound", minimum=0.0, maximum=1.0),
    ) + _JOB,
}


#: The parameter that counts the interleaved repeats behind each notebook's ratio verdict (timed batches, rotated
#: trials, interleaved steps): raising it narrows the verdict's interval, which is how a verdict measured on a busy
#: machine can still clear its threshold (helpers.workbook.nbsetup.guard_verdict). The runner's ``--patience K``
#: multiplies these. Notebooks 01 and 05 decide on shares of the step and 08 and 09 on other figures: none here.
INTERLEAVED_REPEATS: dict[str, str] = {
    "02_batched_decode": "repeats",
    "03_dataloader_tuning": "trials",
    "04_pinned_memory": "repeats",
    "06_mixed_precision": "steps",
    "07_channels_last": "steps",
    "10_end_to_end": "steps",
}

def spec_for(notebook: str) -> tuple[Param, ...]:
    """Return the parameter spec of ``notebook`` (its file stem, e.g. "01_baseline_profiling").

    Raises
    ------
    ParameterError
        If the notebook has no spec (a new notebook must declare one here).
    """
    try:
        return SPECS[notebook]
    except KeyError:
        raise ParameterError(
            f"no parameter spec for notebook {notebook!r}; known: {', '.join(SPECS)}. "
            "Add one to helpers/specs.py (and an entry to helpers/checklist.py)."
        ) from None


def validate_notebook_params(notebook: str, values: Mapping[str, object], *,
                             allow_unknown: bool = False) -> dict:
    """Validate and coerce the parameters of one notebook.

    Parameters
    ----------
    notebook : str
        Notebook id (file stem).
    values : mapping
        Parameter values; strings from the papermill command line are coerced
        to the declared type (``"32"`` -> 32, ``"false"`` -> False).
    allow_unknown : bool
        Ignore names that the spec does not declare (used when reading a
        notebook's globals, which hold much more than its parameters).

    Returns
    -------
    dict
        Every declared parameter, coerced, defaults filled in.

    Raises
    ------
    ParameterError
        Listing every problem at once: the name, the value seen, what is allowed.
    """
    spec = spec_for(notebook)
    if allow_unknown:
        names = {p.name for p in spec} | injected_parameter_names(values)
        values = {k: v for k, v in values.items() if k in names}
    return validate(values, spec)


def injected_parameter_names(namespace: Mapping[str, object]) -> set[str]:
    """Names that papermill injected into this kernel, read from its input history.

    papermill inserts a cell that starts with ``# Parameters`` and assigns
    the values it was given. A misspelt name there (``-p batchsize 8``) only
    draws a warning from papermill and would silently run with the default;
    collecting the injected names lets validation reject it.

    Parameters
    ----------
    namespace : mapping
        A notebook's ``globals()``; IPython keeps the executed cells' sources
        in ``In`` (alias ``_ih``).

    Returns
    -------
    set of str
        Empty outside papermill (JupyterLab, nbval) or when no history exists.
    """
    history = namespace.get("In") or namespace.get("_ih") or []
    names: set[str] = set()
    for source in history if isinstance(history, (list, tuple)) else []:
        if not isinstance(source, str) or not source.lstrip().startswith("# Parameters"):
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else (
                [node.target] if isinstance(node, ast.AnnAssign) else [])
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names
