"""Notebook 00's verdict: what this machine can do, in one sentence.

The facts come from :mod:`helpers.diagnose.environment` (versions, CPU
features), the device view (:mod:`helpers.device`, capabilities) and the
environment-variable catalog (:mod:`helpers.diagnose.envcatalog`). Notebook
00 decides no setting: its verdict is "not applicable" with the summary as
the reason, and the number of invalid settings as its value.
"""

from __future__ import annotations

from typing import Mapping

from helpers import specs
from helpers.checklist import Item
from helpers.experiments.base import Experiment
from helpers.params import Param
from helpers.verdict import Verdict


__all__ = ["NOTEBOOK", "missing_capabilities", "verdict"]

#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "00_environment_check"


def missing_capabilities(capabilities: Mapping[str, object]) -> list[str]:
    """The capability names whose description says "not available" (e.g. pinned memory on a CPU)."""
    return [name for name, text in capabilities.items() if str(text).startswith("not available")]


def verdict(*, device_kind: str, device_name: str, capabilities: Mapping[str, object], native_bf16: bool,
            invalid_settings: int) -> Verdict:
    """Notebook 00's verdict.

    Parameters
    ----------
    device_kind, device_name : str
        The device (``Accelerator.kind``, ``Accelerator.name``).
    capabilities : mapping
        Capability name -> its description (``"not available: ..."`` when absent).
    native_bf16 : bool
        The CPU has native bf16 arithmetic.
    invalid_settings : int
        Environment settings the catalog found invalid or invented.

    Returns
    -------
    helpers.verdict.Verdict
        metric ``invalid_env_settings`` (count), recommendation ``not applicable``.
    """
    missing = missing_capabilities(capabilities)
    reason = (f"device {device_kind} ({device_name}); "
              + (f"not available here: {', '.join(missing)}; " if missing else "all capabilities available; ")
              + f"native CPU bf16: {'yes' if native_bf16 else 'no'}; "
              + f"{invalid_settings} invalid environment setting(s)")
    return Verdict(notebook=NOTEBOOK, metric="invalid_env_settings", value=invalid_settings, unit="invalid settings",
                   recommendation="not applicable", reason=reason)


# -- the notebook's declaration, found by helpers.experiments.registry ------------------------------------

EXPERIMENT = Experiment(
    item=Item("00", "00_environment_check", "environment check",
         "Check what this machine can do before you tune anything",
         "What device, versions, CPU features and settings does this machine have; is torch_npu/CANN usable?"),
    spec=specs.COMMON + (
        Param("npu_probe_timeout_s", float, 120.0, "seconds to wait for the torch_npu probe",
              minimum=1.0, maximum=3600.0),
        Param("fallback_to_cpu", bool, True,
              "if torch_npu is broken, import torch without it (sets TORCH_DEVICE_BACKEND_AUTOLOAD to 0)"),
    ),
)
