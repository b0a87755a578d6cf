"""The torch Trainer on a tiny real Qwen3 model: save, reload and resume bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from ac2_core.config import TinyModelConfig
from ac2_core.models.hf import load_model, save_model
from ac2_core.models.tiny import build_tiny_model
from ac2_core.models.tokenizer import build_tokenizer
from ac2_core.training.optim_state import GROUPS, TENSORS
from ac2_core.training.torch_backend import Trainer

SMALL = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=32, intermediate_size=16)
HYPER = {"lr": 1e-2, "weight_decay": 0.1, "max_grad_norm": 1.0}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["12+34=46;#46\n"])


def _batches(tokenizer, step: int) -> list[torch.Tensor]:
    """Two micro-batches of token ids; each step trains on different text."""
    texts = [f"{step}{i}+{i}7={step}9;#{i}\n" for i in range(4)]
    return [torch.tensor([tokenizer.encode(t, add_special_tokens=False) for t in texts[j : j + 2]]) for j in (0, 2)]


def _lm_loss(model, input_ids):
    # Each of the 2 micro-batches is half the batch, so halve its loss.
    loss = model(input_ids=input_ids, labels=input_ids).loss / 2
    return loss, {"tokens": float(input_ids.numel())}


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _assert_equal_params(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_step_returns_summed_stats_and_moves_the_weights(tokenizer):
    model = build_tiny_model(tokenizer, SMALL, seed=0)
    before = _params(model)
    stats = Trainer(model, **HYPER).step(_batches(tokenizer, 0), _lm_loss)
    # Two micro-batches of 2 sequences: tokens add up over both.
    assert stats["tokens"] == sum(b.numel() for b in _batches(tokenizer, 0))
    assert stats["loss"] > 0 and stats["grad_norm"] > 0
    assert not model.training  # back in eval mode after the step
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_resume_from_saved_state_is_bit_identical(tokenizer, tmp_path):
    # Straight: two steps in one process.
    straight = build_tiny_model(tokenizer, SMALL, seed=0)
    trainer = Trainer(straight, **HYPER)
    trainer.step(_batches(tokenizer, 0), _lm_loss)
    trainer.step(_batches(tokenizer, 1), _lm_loss)

    # Resumed: one step, save model + optimizer, load both fresh, one more step.
    first = build_tiny_model(tokenizer, SMALL, seed=0)
    t1 = Trainer(first, **HYPER)
    t1.step(_batches(tokenizer, 0), _lm_loss)
    save_model(first, tokenizer, tmp_path)
    t1.save(tmp_path)

    resumed, _ = load_model(tmp_path)
    t2 = Trainer(resumed, **HYPER)
    assert t2.load(tmp_path) is True
    _assert_equal_params(_params(resumed), _params(first))
    t2.step(_batches(tokenizer, 1), _lm_loss)
    _assert_equal_params(_params(resumed), _params(straight))

    # The comparison is sensitive: without the optimizer state the second step differs.
    cold, _ = load_model(tmp_path)
    Trainer(cold, **HYPER).step(_batches(tokenizer, 1), _lm_loss)
    assert any(not torch.equal(p, straight.get_parameter(n)) for n, p in cold.named_parameters())


def test_optimizer_state_is_safetensors_and_json_by_parameter_name(tokenizer, tmp_path):
    model = build_tiny_model(tokenizer, SMALL, seed=0)
    trainer = Trainer(model, **HYPER)
    trainer.step(_batches(tokenizer, 0), _lm_loss)
    trainer.save(tmp_path)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["optimizer.json", "optimizer.safetensors"]
    raw = (tmp_path / TENSORS).read_bytes()
    assert raw[8:9] == b"{" and raw[:1] != b"\x80" and raw[:2] != b"PK"
    # safetensors: an 8-byte little-endian header length, then a JSON header. A pickle
    # starts with 0x80 and a torch.save zip with "PK".
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_len])
    names = [n for n, _ in model.named_parameters()]
    assert {k for k in header if k != "__metadata__"} == {f"{n}::{f}" for n in names for f in ("step", "exp_avg", "exp_avg_sq")}
    tensors = load_file(str(tmp_path / TENSORS))
    state = trainer.optimizer.state[model.get_parameter(names[0])]
    assert torch.equal(tensors[f"{names[0]}::exp_avg"], state["exp_avg"])

    groups = json.loads((tmp_path / GROUPS).read_text())["param_groups"]
    assert len(groups) == 1
    assert groups[0]["params"] == names
    assert groups[0]["lr"] == HYPER["lr"] and groups[0]["weight_decay"] == HYPER["weight_decay"]


def test_load_without_saved_state_returns_false(tokenizer, tmp_path):
    model = build_tiny_model(tokenizer, SMALL, seed=0)
    trainer = Trainer(model, **HYPER)
    assert trainer.load(tmp_path) is False
    assert trainer.optimizer.state_dict()["state"] == {}


def test_state_of_an_unknown_parameter_is_refused(tokenizer, tmp_path):
    model = build_tiny_model(tokenizer, SMALL, seed=0)
    trainer = Trainer(model, **HYPER)
    trainer.step(_batches(tokenizer, 0), _lm_loss)
    trainer.save(tmp_path)
    tensors = load_file(str(tmp_path / TENSORS))
    renamed = {k.replace("model.norm.weight", "model.gone.weight"): v for k, v in tensors.items()}
    assert renamed.keys() != tensors.keys()
    save_file(renamed, str(tmp_path / TENSORS))

    fresh = Trainer(build_tiny_model(tokenizer, SMALL, seed=0), **HYPER)
    with pytest.raises(ValueError, match="unknown parameter model.gone.weight"):
        fresh.load(tmp_path)


def test_lr_warmup_is_linear_and_survives_a_checkpoint(tokenizer, tmp_path):
    model = build_tiny_model(tokenizer, SMALL, seed=0)
    trainer = Trainer(model, **{**HYPER, "lr": 4e-3}, warmup_steps=4)
    seen = []
    for step in range(2):
        trainer.step(_batches(tokenizer, step), _lm_loss)
        seen.append(trainer.optimizer.param_groups[0]["lr"])
    # step k (1-based) uses lr * k / 4: 1e-3, then 2e-3
    assert seen == pytest.approx([1e-3, 2e-3], rel=1e-12)
    save_model(model, tokenizer, tmp_path)
    trainer.save(tmp_path)
    resumed, _ = load_model(tmp_path)
    again = Trainer(resumed, **{**HYPER, "lr": 4e-3}, warmup_steps=4)
    assert again.load(tmp_path) and again.steps_taken == 2
    for step in range(2, 5):
        again.step(_batches(tokenizer, step), _lm_loss)
        seen.append(again.optimizer.param_groups[0]["lr"])
    # steps 3, 4 and 5: 3e-3, then the full 4e-3 from step 4 on
    assert seen[2:] == pytest.approx([3e-3, 4e-3, 4e-3], rel=1e-12)
