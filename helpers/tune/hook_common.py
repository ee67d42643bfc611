"""What several of tune's runtime watches (:mod:`helpers.tune.hook`, :mod:`helpers.tune.hook_ddp`) share: how many
forward call sites are recorded, whether a model has convolutions, a value made JSON-able."""

from __future__ import annotations

from typing import Any


#: Forward calls whose call site is recorded (a frame walk each); later calls are only counted.
SITE_SAMPLES = 64


def _has_conv(module) -> bool:
    """Whether ``module`` holds a 2-D convolution (what channels_last acts on)."""
    import torch

    return any(isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)) for m in module.modules())


def _jsonable(v: Any) -> Any:
    return v if isinstance(v, (bool, int, float, str, type(None))) else repr(v)[:80]


def seed_all(seed: int) -> None:
    """Seed Python's ``random``, torch's generators (every device's: ``torch.manual_seed``) and NumPy's global one
    where NumPy is installed, before the user's script runs.

    Each round's unmodified run and its changed runs start from the same random state (the same initial weights,
    the same shuffle, the same dropout masks), so a mean loss that moves between them moved because of the change,
    not because of a different draw. A script that seeds itself overrides it, as it always does.

    Parameters
    ----------
    seed : int
        A non-negative integer (tune passes the round's number).
    """
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy
    except ImportError:  # torch runs without NumPy
        return
    numpy.random.seed(seed)
