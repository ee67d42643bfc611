"""Notebook 00's verdict: what this machine can do, in one sentence.

The facts come from :mod:`helpers.diagnose.environment` (versions, CPU
features), the device view (:mod:`helpers.device`, capabilities) and the
environment-variable catalog (:mod:`helpers.diagnose.envcatalog`). Notebook
00 decides no setting: its verdict is "not applicable" with the summary as
the reason, and the number of invalid settings as its value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from helpers import specs
from helpers.checklist import Item
from helpers.experiments.base import Experiment, ExperimentResult
from helpers.params import Param
from helpers.results import Records
from helpers.verdict import Verdict

__all__ = ["EnvironmentResult", "NOTEBOOK", "missing_capabilities", "parameters", "verdict"]

#: Notebook whose verdict :func:`verdict` gives.
NOTEBOOK = "00_environment_check"


def parameters(namespace: Mapping[str, Any]) -> dict:
    """Notebook 00's parameters from its namespace, validated against :data:`EXPERIMENT`'s spec, without importing
    torch (the notebook probes torch_npu next, before the first ``import torch``).

    Raises
    ------
    helpers.errors.ParameterError
        Listing every bad parameter.
    """
    return specs.validate_params(EXPERIMENT.spec, namespace, allow_unknown=True)


@dataclass(frozen=True)
class EnvironmentResult(ExperimentResult):
    """What notebook 00 found: the device, its capabilities, the CPU and the environment settings.

    Attributes
    ----------
    device_kind, device_name : str
        The device (``Accelerator.kind``, ``Accelerator.name``).
    capabilities : mapping
        Capability name -> its description (``"not available: ..."`` when absent).
    native_bf16 : bool
        The CPU has native bf16 arithmetic.
    invalid_settings : int
        Environment settings the catalog found invalid or invented.
    usable_cores : int or None
        CPU cores this process may run on.
    """

    device_kind: str
    device_name: str
    capabilities: Mapping[str, object]
    native_bf16: bool
    invalid_settings: int
    usable_cores: int | None

    @classmethod
    def of(cls, acc: Any, info: Mapping[str, Any], bf16: Mapping[str, Any], findings) -> "EnvironmentResult":
        """From the device view, :func:`helpers.diagnose.environment.system_info`, its
        :func:`~helpers.diagnose.environment.cpu_bf16_support` and :func:`helpers.diagnose.envcatalog.check_env`'s
        findings."""
        return cls(device_kind=acc.kind, device_name=acc.name, capabilities=acc.capabilities.as_dict(),
                   native_bf16=bool(bf16["native_bf16"]),
                   invalid_settings=sum(f.severity == "error" for f in findings),
                   usable_cores=info.get("usable_cores") or info.get("logical_cores"))

    def records(self) -> Records:
        """One ``capabilities`` record per capability (available: 1.0/0.0), the invalid settings and the cores."""
        r = Records()
        for name, text in self.capabilities.items():
            r.add("capabilities", name, "available", float(not str(text).startswith("not available")), "bool",
                  detail=str(text))
        r.add("environment", "settings", "invalid_env_settings", self.invalid_settings, "settings")
        r.add("host", "cpu", "usable_cores", self.usable_cores, "cores")
        return r

    def verdict(self) -> Verdict:
        """:func:`verdict` of these facts."""
        return verdict(device_kind=self.device_kind, device_name=self.device_name, capabilities=self.capabilities,
                       native_bf16=self.native_bf16, invalid_settings=self.invalid_settings)


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
    advice = (f"CHECK: fix the {invalid_settings} invalid environment setting(s) listed above" if invalid_settings
              else "READY: nothing to fix in the environment")
    return Verdict(notebook=NOTEBOOK, metric="invalid_env_settings", value=invalid_settings, unit="invalid settings",
                   recommendation="not applicable", reason=reason, extra={"advice": advice})


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
