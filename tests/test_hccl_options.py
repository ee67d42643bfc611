"""Tests for helpers.comm.hccl_options: the hccl_config dict and the torch_npu import guard."""

from __future__ import annotations

import sys
import types

import pytest

from helpers.comm import hccl_options as ho
from helpers.errors import DeviceUnavailableError, ParameterError


class _FakeOptions:
    """Stands in for torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options."""

    def __init__(self):
        self.hccl_config = {}


@pytest.fixture
def fake_torch_npu(monkeypatch):
    root = types.ModuleType("torch_npu")
    c = types.ModuleType("torch_npu._C")
    c10d = types.ModuleType("torch_npu._C._distributed_c10d")
    c10d.ProcessGroupHCCL = types.SimpleNamespace(Options=_FakeOptions)
    root._C = c
    c._distributed_c10d = c10d
    monkeypatch.setitem(sys.modules, "torch_npu", root)
    monkeypatch.setitem(sys.modules, "torch_npu._C", c)
    monkeypatch.setitem(sys.modules, "torch_npu._C._distributed_c10d", c10d)
    return c10d


def test_options_carry_the_documented_keys(fake_torch_npu):
    opts = ho.hccl_process_group_options(buffer_size_mb=400, op_expansion_mode=3)
    assert isinstance(opts, _FakeOptions)
    assert opts.hccl_config == {"hccl_buffer_size": 400, "hccl_op_expansion_mode": 3}


def test_unset_parameters_are_left_out(fake_torch_npu):
    assert ho.hccl_process_group_options().hccl_config == {}
    assert ho.hccl_process_group_options(op_expansion_mode=0).hccl_config == {"hccl_op_expansion_mode": 0}


def test_optional_keys(fake_torch_npu):
    opts = ho.hccl_process_group_options(group_name="grads", qos_service_level=7, qos_traffic_class=224)
    assert opts.hccl_config == {"group_name": "grads", "qos_service_level": 7, "qos_traffic_class": 224}


@pytest.mark.parametrize("kwargs, fragment", [
    ({"buffer_size_mb": 0}, "buffer_size_mb=0"),
    ({"buffer_size_mb": 1.5}, "integer"),
    ({"buffer_size_mb": True}, "integer"),
    ({"op_expansion_mode": 4}, "op_expansion_mode=4"),
    ({"op_expansion_mode": -1}, "out of range"),
    ({"op_expansion_mode": "AIV"}, "integers 0-3"),
    ({"group_name": "x" * 33}, "32"),
    ({"group_name": ""}, "32"),
    ({"qos_service_level": 8}, "0 to 7"),
    ({"qos_traffic_class": 256}, "0 to 255"),
])
def test_invalid_values_are_refused_before_torch_npu_is_touched(monkeypatch, kwargs, fragment):
    def boom(name):
        raise AssertionError("torch_npu must not be imported for invalid values")

    monkeypatch.setattr(ho.importlib, "import_module", boom)
    with pytest.raises(ParameterError, match=fragment):
        ho.hccl_process_group_options(**kwargs)


def test_without_torch_npu_the_error_says_what_to_do(monkeypatch):
    # None in sys.modules makes `import torch_npu` raise ImportError, whatever is installed.
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    with pytest.raises(DeviceUnavailableError, match="set_env.sh"):
        ho.hccl_process_group_options(buffer_size_mb=200)


def test_torch_npu_that_fails_to_load_is_reported(monkeypatch):
    def fail(name):
        raise RuntimeError("Failed to load the backend extension: torch_npu")

    monkeypatch.setattr(ho.importlib, "import_module", fail)
    with pytest.raises(DeviceUnavailableError, match="Failed to load"):
        ho.hccl_process_group_options(op_expansion_mode=2)


def test_hccl_config_needs_no_torch_npu():
    assert ho.hccl_config(200, 1) == {"hccl_buffer_size": 200, "hccl_op_expansion_mode": 1}
    assert set(ho.OP_EXPANSION_MODES) == {0, 1, 2, 3}


def test_pg_options_keyword_exists_in_torch():
    import inspect

    import torch.distributed as dist

    assert "pg_options" in inspect.signature(dist.init_process_group).parameters
    assert "pg_options" in inspect.signature(dist.new_group).parameters
