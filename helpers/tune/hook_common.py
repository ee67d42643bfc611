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
