"""tune's CPU candidates: the PyTorch Performance Tuning Guide's "CPU specific optimizations" that apply to a training
script (pytorch/tutorials ``recipes_source/recipes/tuning_guide.py``, https://pytorch.org/tutorials/recipes/recipes/
tuning_guide.html), rows of the one table of :mod:`helpers.tune.candidates`:

- ``intra_op_threads`` ("Utilize OpenMP": ``OMP_NUM_THREADS`` "determines number of threads used for OpenMP
  computations"): ``torch.set_num_threads(N)`` in the training process, N = the usable cores less the DataLoader
  workers (each worker runs its ops on one thread: torch sets it, ``torch/utils/data/_utils/worker.py``
  ``torch.set_num_threads(1)``), at least 1. By default torch takes one intra-op thread per core, so a training
  process beside busy workers oversubscribes the cores. Where tune itself adds the workers, the threads follow the
  winning number of workers (:func:`threads_follow_up`), measured on top of it and judged against it. Written as
  code (``set_threads``, :mod:`helpers.tune.rewrite_cpu`).
- ``allocator`` ("Switch Memory allocator": "``Jemalloc`` or ``TCMalloc`` can get better performance by reusing
  memory as much as possible than default ``malloc``" ... "Use environment variable ``LD_PRELOAD``"): the run is
  launched with ``LD_PRELOAD`` naming a jemalloc or tcmalloc library the system has (:func:`find_allocators`).
  Not code: the proposal is the launch command (:func:`launch_text`), and the diff does not carry it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from helpers.tune.candidates import Candidate

__all__ = ["ALLOCATORS", "GUIDE", "INSTALL_ALLOCATOR", "allocator_candidates", "cpu_candidates", "cpu_edits",
           "find_allocators", "launch_apply", "launch_text", "thread_candidates", "threads_follow_up"]

#: The Guide's section of each CPU technique (pytorch/tutorials recipes_source/recipes/tuning_guide.py).
GUIDE = {"intra_op_threads": "the Performance Tuning Guide's \"Utilize OpenMP\"",
         "allocator": "the Performance Tuning Guide's \"Switch Memory allocator\""}
#: The allocators tried and their libraries' file names, in the order looked for: jemalloc's soname (Debian's
#: libjemalloc2, conda-forge's jemalloc), then gperftools' tcmalloc (Debian's libtcmalloc-minimal4 and
#: libgoogle-perftools4; conda-forge's gperftools).
ALLOCATORS = (("jemalloc", ("libjemalloc.so.2", "libjemalloc.so")),
              ("tcmalloc", ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so",
                            "libtcmalloc.so")))
#: Where a library is looked for besides ``ldconfig -p``: the usual library folders, and the active environment's.
LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
            "/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")
#: What to install where the system has neither (package names: Debian/Ubuntu's archive, conda-forge).
INSTALL_ALLOCATOR = ("install one (Debian/Ubuntu: sudo apt-get install libjemalloc2; conda: conda install -c "
                     "conda-forge jemalloc, or gperftools for tcmalloc) and run tune again")


def find_allocators(ldconfig: str | None = None, dirs: Sequence[str] | None = None) -> dict[str, str]:
    """The allocator libraries this system has, by name: ``{"jemalloc": path, "tcmalloc": path}`` (those found).

    Parameters
    ----------
    ldconfig : str, optional
        The text of ``ldconfig -p`` (default: run it; an empty string where it cannot run).
    dirs : sequence of str, optional
        Folders to look in as well (default :data:`LIB_DIRS` and ``lib`` of ``$CONDA_PREFIX`` and of this
        interpreter's prefix).

    Returns
    -------
    dict of str to str
        The first library file found for each allocator of :data:`ALLOCATORS`, an absolute path.
    """
    if ldconfig is None:
        try:
            ldconfig = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            ldconfig = ""
    if dirs is None:
        dirs = [*(str(Path(p) / "lib") for p in (os.environ.get("CONDA_PREFIX"), sys.prefix) if p), *LIB_DIRS]
    listed: dict[str, str] = {}
    for line in ldconfig.splitlines():  # "\tlibjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2"
        name, _, path = line.strip().partition(" => ")
        listed.setdefault(name.split(" (")[0], path.strip())
    out: dict[str, str] = {}
    for kind, files in ALLOCATORS:
        for f in files:
            path = listed.get(f) or next((str(Path(d) / f) for d in dirs if (Path(d) / f).is_file()), "")
            if path:
                out[kind] = path
                break
    return out


def _workers(probe: dict[str, Any]) -> int:
    return max((int(ld["effective"].get("num_workers") or 0) for ld in probe.get("loaders") or []), default=0)


def _targets(cores: int, workers: int) -> list[int]:
    """The thread counts tried: the cores less one per worker (each worker takes a core while it loads), and, with
    several workers, the cores less half of them (workers that are not busy all the time); at least 1 each."""
    out = [max(1, cores - workers)]
    if workers > 1:
        out.append(max(1, cores - workers // 2))
    return list(dict.fromkeys(out))


def thread_candidates(probe: dict[str, Any], *, cores: int,
                      workers_tried: bool = False) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """``torch.set_num_threads(N)`` where the training process's intra-op threads and the DataLoader workers want
    more cores than there are, or the process uses fewer threads than cores with no workers to share them.

    Parameters
    ----------
    probe : dict
        The hook's result of the unmodified script (its ``cpu`` record, :mod:`helpers.tune.hook_cpu`).
    cores : int
        Usable CPU cores per process (under torchrun, the machine's share of one rank).
    workers_tried : bool
        Whether tune tries DataLoader workers on this script: then, where the script has none, the threads are
        a follow-up of the winning number (:func:`threads_follow_up`), and nothing is said here.

    Returns
    -------
    (list of Candidate, list of (technique, reason))
        Skipped with the reason: the model on a CUDA or NPU device, the script setting the threads itself (a call
        of ``torch.set_num_threads``, or ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` set in the script), one core,
        threads already at the target.
    """
    cpu = probe.get("cpu") or {}
    if not cpu or not cpu.get("threads"):
        return [], []
    t = "intra_op_threads"
    device = (probe.get("model") or {}).get("param_device") or "cpu"
    threads, workers = int(cpu["threads"]), _workers(probe)
    sites = cpu.get("set_sites") or []
    if device != "cpu":
        return [], [(t, f"the model runs on the {device}: the intra-op threads are tried where its ops run on the "
                        f"CPU")]
    if sites:
        return [], [(t, f"the script sets them itself: torch.set_num_threads({sites[0].get('value')}) on line "
                        f"{sites[0]['line']}")]
    if cpu.get("env_set_by_script"):
        return [], [(t, f"the script sets {', '.join(cpu['env_set_by_script'])} itself")]
    ranks = int(probe.get("ranks") or 1)
    if cores <= 1 and threads <= 1:
        shared = f" per rank ({ranks} ranks share the machine's cores)" if ranks > 1 else ""
        return [], [(t, f"one usable core{shared}: the training process already runs its ops on one thread")]
    if not workers and threads == cores:
        return [], [] if workers_tried else [(t, f"the training process's {threads} intra-op threads match the "
                                                 f"{cores} usable cores, and no DataLoader worker competes for them")]
    env = ", ".join(f"{k}={v}" for k, v in (cpu.get("env") or {}).items() if v)
    # torchrun sets OMP_NUM_THREADS=1 for each rank where it is not set and there are several
    # (torch/distributed/run.py: "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default")
    where = (f" ({env}: torchrun's default for each of {ranks} ranks, or your environment's)" if ranks > 1 and env
             else f" ({env} in your environment)" if env else "")
    out = []
    for n in _targets(cores, workers):
        if n == threads:
            continue
        why = (f"{threads} intra-op threads and {workers} DataLoader worker{'s' if workers != 1 else ''} (one thread "
               f"each) share {cores} cores" if workers else
               f"the training process runs its ops on {threads} thread{'s' if threads != 1 else ''}, on {cores} usable "
               f"cores" + (" per rank" if ranks > 1 else ""))
        out.append(Candidate(f"torch.set_num_threads({n})", t, {"threads": n}, why + where))
    if not out:
        return [], [(t, f"the training process already runs {threads} intra-op thread{'s' if threads != 1 else ''} "
                        f"beside {workers} DataLoader worker{'s' if workers != 1 else ''} on {cores} cores")]
    return out, []


def allocator_candidates(probe: dict[str, Any],
                         found: dict[str, str] | None = None) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """Launching the run with ``LD_PRELOAD`` set to each allocator of :func:`find_allocators` (``found``), where
    the process does not preload one already; where the system has none, one line saying so and how to install one.
    """
    cpu = probe.get("cpu") or {}
    if not cpu:
        return [], []
    t = "allocator"
    have = [p for p in cpu.get("allocators") or []] or [p for p in (cpu.get("ld_preload") or "").split(":")
                                                          if "jemalloc" in p or "tcmalloc" in p]
    if have:
        return [], [(t, f"your script already runs with {Path(have[0]).name} (LD_PRELOAD)")]
    found = find_allocators() if found is None else found
    if not found:
        return [], [(t, f"no jemalloc or tcmalloc library on this system (ldconfig -p, {LIB_DIRS[0]} and the usual "
                        f"folders): {INSTALL_ALLOCATOR}")]
    return [Candidate(f"{kind} (LD_PRELOAD)", t, {"ld_preload": path},
                      f"the process allocates with glibc's malloc; {path} is on this system")
            for kind, path in found.items()], []


def cpu_candidates(probe: dict[str, Any], *, cores: int, workers_tried: bool = False,
                   found: dict[str, str] | None = None) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """:func:`thread_candidates` and :func:`allocator_candidates` together."""
    a, b = thread_candidates(probe, cores=cores, workers_tried=workers_tried)
    c, d = allocator_candidates(probe, found)
    return a + c, b + d


def threads_follow_up(winners: Sequence[Candidate], probe: dict[str, Any], *,
                      cores: int) -> tuple[Candidate | None, str]:
    """The threads to go with a number of DataLoader workers that tune added: the winning ``num_workers`` setting
    with ``torch.set_num_threads(cores - N)``, judged against that setting alone (its :attr:`Candidate.against`), as
    the ``prefetch_factor`` follow-up is (:func:`helpers.tune.candidates.follow_up`).

    Returns
    -------
    (Candidate or None, str)
        The follow-up, or None and the reason for the report's "Not tried" ("" where there is nothing to say:
        the script had workers, so the first round covered it, or sets its threads itself).
    """
    cpu = probe.get("cpu") or {}
    if not cpu or not cpu.get("threads") or _workers(probe) or cpu.get("set_sites") or cpu.get("env_set_by_script"):
        return None, ""
    if ((probe.get("model") or {}).get("param_device") or "cpu") != "cpu":
        return None, ""
    if cores <= 1 and int(cpu["threads"]) <= 1:  # thread_candidates said it: one core, one thread
        return None, ""
    base = next((c for c in winners if c.technique == "num_workers"), None)
    if base is None:
        if int(cpu["threads"]) == cores and (probe.get("loaders") or winners):
            return None, (f"the training process's {cores} intra-op threads match the {cores} usable cores, and no "
                          f"num_workers setting was faster here, so no worker competes for them")
        return None, ""
    loader = base.apply.get("loader") or {}
    edits = base.apply.get("edits") or []
    n_workers = int(loader.get("num_workers") or next((e["values"].get("dataloader_num_workers") for e in edits
                                                        if "dataloader_num_workers" in e.get("values", {})), 0) or 0)
    n = max(1, cores - n_workers)
    if n == int(cpu["threads"]):
        return None, (f"with {base.name}, the training process's {n} intra-op threads already leave a core per "
                      f"worker")
    return Candidate(f"{base.name} + torch.set_num_threads({n})", "intra_op_threads", {**base.apply, "threads": n},
                     f"on top of {base.name}: {cpu['threads']} intra-op threads and {n_workers} workers (one thread "
                     f"each) would share {cores} cores", against=base.name), ""


def cpu_edits(probe: dict[str, Any], merged: dict[str, Any], script: str) -> list[Any]:
    """The source edit of a ``threads`` winner in ``merged`` (:func:`helpers.tune.candidates.merge_apply`): a
    ``set_threads`` edit of ``script``, after its imports (:mod:`helpers.tune.rewrite_cpu`), with a comment that
    says what the number stands on. The allocator is not an edit (:func:`launch_text`)."""
    from helpers.tune.rewrite_common import Edit

    n = merged.get("threads")
    if not n:
        return []
    cpu = probe.get("cpu") or {}
    cores = int(cpu.get("cores") or 0)
    workers = int((merged.get("loader") or {}).get("num_workers") or _workers(probe))
    for e in (merged.get("edits") or []):
        workers = int(e.get("values", {}).get("dataloader_num_workers") or workers)
    note = f"this machine's {cores} usable cores"
    if workers:
        note = (f"{n} intra-op thread{'s' if n != 1 else ''} beside {workers} DataLoader "
                f"worker{'s' if workers != 1 else ''} on {cores} cores")
    return [Edit("set_threads", script, 1, {"threads": int(n), "note": note}, "intra_op_threads")]


def launch_apply(winners: Sequence[Candidate]) -> dict[str, Any]:
    """The launch settings of ``winners`` (the allocator's ``ld_preload``), as an ``apply`` dict: what the proof's
    rewritten run is launched with, and what :func:`launch_text` prints."""
    return {"ld_preload": c.apply["ld_preload"] for c in winners if c.apply.get("ld_preload")}


def launch_text(command: Any, apply: dict[str, Any], environ: dict[str, str] | None = None) -> str:
    """The command line to paste: ``LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 python train.py ...``
    (``command``: a :class:`helpers.tune.engine.Command`, printed as :meth:`~helpers.tune.engine.Command.__str__`
    does), an ``LD_PRELOAD`` already in ``environ`` (default ``os.environ``) kept after the allocator; "" where
    ``apply`` has no launch setting."""
    lib = apply.get("ld_preload")
    if not lib:
        return ""
    old = (os.environ if environ is None else environ).get("LD_PRELOAD")
    return f"LD_PRELOAD={shlex.quote(lib + (':' + old if old else ''))} {command}"
