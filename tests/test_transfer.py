"""Host-to-device copy methods: applicability, the four copies, the reused pinned buffer.

No accelerator here: the CPU path must report "not applicable" without raising
(pytorch/pytorch#73003), and the device paths are exercised with a faked accelerator whose
"device" is the CPU, with ``Tensor.pin_memory`` replaced by a copy (pinning itself
cannot run without an accelerator). The timing of the methods and the verdict are
notebook 04's experiment (tests/test_pinning.py); the link's limit is tests/test_pcie.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
from transfer_support import fake_accelerator, fake_pin  # noqa: F401  (fake_pin: a fixture)

from helpers.device import get_accelerator
from helpers.errors import DeviceUnavailableError, ParameterError
from helpers.pipeline import transfer as tr

# --------------------------------------------------------------------------- fakes


# --------------------------------------------------------------------------- CPU: not applicable


def test_cpu_reports_not_applicable_without_raising():
    acc = get_accelerator("cpu")
    app = tr.pinning_applicability(acc)
    assert not app.applicable and "Cannot access accelerator" in app.reason
    assert tr.check_methods(acc) == {}


def test_cpu_refuses_to_pin_with_a_clear_error():
    acc = get_accelerator("cpu")
    with pytest.raises(DeviceUnavailableError, match="not applicable|pinning_applicability"):
        with tr.copy_method("pin_per_batch", acc, torch.zeros(4, dtype=torch.uint8)):
            pass
    with pytest.raises(DeviceUnavailableError):
        tr.PinnedStaging(acc, 16)


def test_unknown_method_is_a_parameter_error():
    with pytest.raises(ParameterError, match="unknown copy method"):
        with tr.copy_method("telepathy", fake_accelerator(), torch.zeros(4)):
            pass


# --------------------------------------------------------------------------- faked device


def test_every_method_delivers_the_host_bytes(fake_pin):
    acc = fake_accelerator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # DataLoader: "pin_memory ... no accelerator"
        ok = tr.check_methods(acc, nbytes=4096)
    assert ok == {m: True for m in tr.METHODS}
    assert fake_pin, "pin_memory() was used by the pinned methods"


def test_pinned_buffer_waits_for_the_previous_copy_before_overwriting(fake_pin):
    log = []
    acc = fake_accelerator(log)
    staging = tr.PinnedStaging(acc, 64)
    a = torch.arange(64, dtype=torch.uint8)
    b = torch.arange(64, dtype=torch.uint8).flip(0)
    out_a = staging.copy(a)
    assert torch.equal(out_a, a) and log == [("record", "ev0")]
    out_b = staging.copy(b.view(8, 8))
    # the second copy first waited for the event recorded after the first one
    assert log[1:] == [("synchronize", "ev0"), ("record", "ev0")]
    assert torch.equal(out_b, b.view(8, 8)) and out_b.shape == (8, 8)
    assert torch.equal(out_a, a), "the first result was not overwritten"
    f = torch.linspace(0, 1, 8)  # other dtypes travel as bytes and come back as themselves
    assert torch.equal(staging.copy(f), f)
    with pytest.raises(ParameterError, match="does not fit"):
        staging.copy(torch.zeros(65, dtype=torch.uint8))


# --------------------------------------------------------------------------- imports


def test_the_mechanism_imports_no_pandas():
    """A loader_pin_thread worker started by spawn imports this module to unpickle its dataset: keep it light."""
    code = ("import sys; import helpers.pipeline.transfer; "
            "assert 'pandas' not in sys.modules, 'importing transfer imported pandas'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=os.path.dirname(os.path.dirname(__file__)))
