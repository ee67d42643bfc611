"""The shape of a training job, :class:`Workload`: the one home of the workbook's size defaults.

Every default batch size, crop, caption length and model width in the package (the notebooks' parameter specs,
the pipelines' and the model's constructors, the benchmarks) is read from :class:`Workload`'s fields, so a caller
that leaves one out builds the same job as the notebooks. Part of the foundation: standard library only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from helpers.errors import ParameterError

__all__ = ["DEFAULT", "WORKLOAD_PARAMS", "Workload"]


@dataclass(frozen=True)
class Workload:
    """The shape of a training job: the notebook parameters that size a batch and the model.

    Attributes
    ----------
    batch_size : int
        Samples per training step.
    image_size : int
        Side of the square training crop, px.
    text_len : int
        Caption length in tokens (padded/truncated).
    model_width : int
        Channels of the first conv stage (stages use 1x, 2x, 4x).
    d_model : int
        Width of the text transformer.
    seed : int
        Seed of data order, augmentation, initial weights and action sampling.

    Raises
    ------
    ParameterError
        If a field is not a positive integer (``seed``: not a non-negative one).
    """

    batch_size: int = 32
    #: 64 px: at this crop the built-in job's data phase (full-size decodes, independent of the crop) is >= 70%
    #: of the step on a 2-core CPU, the host-bound job the workbook fixes (measured, notebook 01).
    image_size: int = 64
    text_len: int = 16
    model_width: int = 16
    d_model: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            least = 0 if f.name == "seed" else 1
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise ParameterError(f"Workload.{f.name}: expected an int >= {least}, got {v!r}")

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "Workload":
        """Take the fields from a notebook's parameters (other keys are ignored, missing ones default)."""
        return cls(**{f.name: int(params[f.name]) for f in fields(cls) if f.name in params})

    def as_dict(self) -> dict[str, int]:
        """The fields as a plain dict (for records and for a child process's configuration)."""
        return asdict(self)


#: The workload parameters that make two notebooks' measurements of the job comparable (``seed`` aside).
WORKLOAD_PARAMS: tuple[str, ...] = tuple(f.name for f in fields(Workload) if f.name != "seed")

#: The default workload: ``DEFAULT.batch_size`` etc. are the defaults everywhere else.
DEFAULT = Workload()
