"""model.device: how it resolves, the error for an absent cuda, and what it leaves alone."""

from __future__ import annotations

import pytest
import torch

from ac2_core.config import ConfigError, load_config
from ac2_core.models.device import resolve_device
from ac2_core.training.deepspeed_backend import _check_same_device
from tests.conftest import TOY, tiny_config


def test_auto_is_cuda_exactly_when_this_machine_has_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")


def test_cuda_without_cuda_names_the_field_and_the_way_out(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"model\.device is 'cuda' but .*; set model\.device to auto or cpu"):
        resolve_device("cuda")


def test_an_unknown_device_is_refused_with_the_field():
    with pytest.raises(ConfigError, match=r"model\.device"):
        tiny_config(model__device="gpu")


def test_device_says_where_not_what_so_hashes_ignore_it():
    # one config serves a pipeline's GPU and CPU tasks (device auto resolves per task)
    base = load_config(TOY)
    for device in ("cpu", "cuda"):
        other = load_config(TOY, {"model.device": device})
        assert other.model.device == device
        assert other.config_hash() == base.config_hash()
        assert other.bootstrap_hash() == base.bootstrap_hash()
    assert load_config(TOY, {"model.dtype": "bfloat16"}).config_hash() != base.config_hash()  # dtype is what


def test_deepspeed_refuses_a_model_off_its_accelerator():
    model = torch.nn.Linear(2, 1)  # on the CPU
    _check_same_device(model, "cpu")
    with pytest.raises(ValueError, match=r"accelerator \(cuda\) but the model is on cpu: set model\.device to cuda"):
        _check_same_device(model, "cuda")
