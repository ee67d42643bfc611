"""Communication between devices (see DESIGN.md).

- :mod:`helpers.comm.launch`: start collective jobs in child processes with torchrun, with timeouts,
  clear errors and no stray process (the caller never holds a process group).
- :mod:`helpers.comm.worker`: one rank of such a job (``python -m helpers.comm.worker``).
- :mod:`helpers.comm.allreduce`: the allreduce benchmark (nccl-tests' algbw/busbw).
- :mod:`helpers.comm.ddp`: DDP on the PPO workload: buckets, compression hooks, overlap.
- :mod:`helpers.comm.hccl_options`: per-process-group HCCL options on Ascend NPUs.

Nothing is imported here at package import time.
"""
