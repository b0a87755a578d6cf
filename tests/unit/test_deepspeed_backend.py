"""The deepspeed training backend against the torch backend, on CPU with gloo (world size 1).

Skipped when DeepSpeed is not installed. The first run in a fresh TORCH_EXTENSIONS_DIR
compiles DeepSpeed's CPU communication op (20 s to 2 min here); later runs load it.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys

import pytest
import torch
from safetensors.torch import load_file

from ac2_core.models.store import ModelStore
from ac2_core.models.tiny import build_tiny_model
from ac2_core.models.tokenizer import build_tokenizer
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from ac2_core.training import deepspeed_backend
from ac2_core.training.torch_backend import Trainer as TorchTrainer
from tests.conftest import tiny_config
from tests.stages.test_stages import run_stages
from tests.unit.test_training import HYPER, SMALL, _batches, _lm_loss, _params

# Measured on the SMALL model after 2 steps at lr 1e-2: losses and stage 0 weights equal
# bit for bit; ZeRO 1/2 weights within 3.9e-7 and ZeRO 3 within 1.2e-6, since the grad
# norm that scales the clipped step is summed in another order (it differed by <= 4.8e-7).
# A step moves a weight by about lr = 1e-2, so 1e-5 still catches any wrong step.
PARAM_ATOL = 1e-5
NORM_RTOL = 1e-5
STAGES = [0, 1, 2, 3]


@pytest.fixture(scope="module", autouse=True)
def _deepspeed():
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'ac2[deepspeed]')")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["12+34=46;#46\n"])


def _assert_close_params(a, b, atol=PARAM_ATOL):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=atol, rtol=0, msg=name)


def _assert_same_stats(ours, ref):
    assert ours["loss"] == pytest.approx(ref["loss"], rel=1e-6)
    assert ours["tokens"] == ref["tokens"]
    assert ours["grad_norm"] == pytest.approx(ref["grad_norm"], rel=NORM_RTOL)


def test_missing_deepspeed_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(ImportError, match=r"ac2\[deepspeed\]"):
        deepspeed_backend._import_deepspeed()


@pytest.mark.parametrize("stage", STAGES)
def test_steps_match_the_torch_backend(tokenizer, stage):
    ref = build_tiny_model(tokenizer, SMALL, seed=0)
    ours = build_tiny_model(tokenizer, SMALL, seed=0)
    torch_trainer = TorchTrainer(ref, **HYPER)
    ds_trainer = deepspeed_backend.Trainer(ours, **HYPER, zero_stage=stage)
    before = _params(ours)
    for k in range(2):  # two micro-batches each; the second step uses Adam's moments
        _assert_same_stats(
            ds_trainer.step(_batches(tokenizer, k), _lm_loss), torch_trainer.step(_batches(tokenizer, k), _lm_loss)
        )
    assert ds_trainer.steps_taken == 2
    assert not ours.training
    _assert_close_params(_params(ours), _params(ref))
    # the weights did move by far more than the tolerance, so the comparison means something
    assert max(float((before[n] - p).abs().max()) for n, p in ours.named_parameters()) > 100 * PARAM_ATOL


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("direction", ["torch->deepspeed", "deepspeed->torch"])
def test_checkpoints_hand_over_between_backends(tokenizer, tmp_path, stage, direction):
    # One step on one backend, save, resume on the other: the second step must be the one
    # an uninterrupted torch run takes (the optimizer state crossed over, in the same layout).
    straight = build_tiny_model(tokenizer, SMALL, seed=0)
    t = TorchTrainer(straight, **HYPER, warmup_steps=3)
    for k in range(2):
        t.step(_batches(tokenizer, k), _lm_loss)

    make_first, make_second = (
        (
            lambda m: TorchTrainer(m, **HYPER, warmup_steps=3),
            lambda m: deepspeed_backend.Trainer(m, **HYPER, warmup_steps=3, zero_stage=stage),
        )
        if direction == "torch->deepspeed"
        else (
            lambda m: deepspeed_backend.Trainer(m, **HYPER, warmup_steps=3, zero_stage=stage),
            lambda m: TorchTrainer(m, **HYPER, warmup_steps=3),
        )
    )
    first_model = build_tiny_model(tokenizer, SMALL, seed=0)
    first = make_first(first_model)
    first.step(_batches(tokenizer, 0), _lm_loss)
    first.save(tmp_path)
    resumed = build_tiny_model(tokenizer, SMALL, seed=0)
    resumed.load_state_dict(first_model.state_dict())
    second = make_second(resumed)
    assert second.load(tmp_path)
    assert second.steps_taken == 1
    assert second.current_lr() == pytest.approx(HYPER["lr"] * 2 / 3)  # warm-up continues from the saved step
    second.step(_batches(tokenizer, 1), _lm_loss)
    _assert_close_params(_params(resumed), _params(straight))


def test_load_refuses_state_of_unknown_parameters(tokenizer, tmp_path):
    model = build_tiny_model(tokenizer, SMALL, seed=0)
    t = TorchTrainer(model, **HYPER)
    t.step(_batches(tokenizer, 0), _lm_loss)
    t.save(tmp_path)
    other = torch.nn.Linear(2, 2)
    ds = deepspeed_backend.Trainer(other, **HYPER, zero_stage=2)
    with pytest.raises(ValueError, match="unknown parameters"):
        ds.load(tmp_path)


@pytest.mark.parametrize("stage", [2, 3])
def test_update_actor_and_critic_match_the_torch_backend(_bootstrap_dir, tmp_path, stage):
    # Iteration 2 of a real run (iteration 1 has no non-zero advantages on the untrained
    # actor): every stage before the updates runs once, then update_actor and
    # update_critic run from those same artifacts with each backend.
    shutil.copytree(_bootstrap_dir, tmp_path / "run" / "bootstrap")
    layout = RunLayout(str(tmp_path / "run"))
    base = tiny_config()
    run_stages(base, layout, 1)
    calls = inprocess.stage_calls(base, layout, 2)
    for call in calls:
        if not call.stage.startswith("update_") and call.stage != "evaluate":
            call.run(base)
    results, weights = {}, {}
    for backend in ("torch", "deepspeed"):
        cfg = tiny_config(training__backend=backend, training__zero_stage=stage)
        store = ModelStore(cfg)
        for call in calls:
            if call.stage.startswith("update_"):
                outputs = {k: str(tmp_path / backend / k) for k in call.kwargs if k.startswith("out_")}
                results[(backend, call.stage)] = dataclasses.replace(call, kwargs=call.kwargs | outputs).run(cfg, store=store)
        weights[backend] = {
            kind: _params(ModelStore(cfg).load(str(tmp_path / backend / f"out_{kind}"), kind=kind).model)
            for kind in ("actor", "critic")
        }
    ours, ref = results[("deepspeed", "update_actor")], results[("torch", "update_actor")]
    assert ref.trained_chunks > 0  # the actor really took a step
    assert ours.loss == pytest.approx(ref.loss, rel=1e-6)
    assert ours.grad_norm == pytest.approx(ref.grad_norm, rel=NORM_RTOL)
    ours, ref = results[("deepspeed", "update_critic")], results[("torch", "update_critic")]
    assert ours.examples == ref.examples > 0
    assert ours.loss_first == pytest.approx(ref.loss_first, rel=1e-6)
    assert ours.loss_last == pytest.approx(ref.loss_last, rel=1e-5)  # after a step: clipped norms differ slightly
    for kind in ("actor", "critic"):
        _assert_close_params(weights["deepspeed"][kind], weights["torch"][kind])


def test_gradient_checkpointing_gives_the_same_step(tokenizer):
    # Recomputing activations in backward must not change the gradient.
    plain = build_tiny_model(tokenizer, SMALL, seed=0)
    checkpointed = build_tiny_model(tokenizer, SMALL, seed=0)
    a = deepspeed_backend.Trainer(plain, **HYPER, zero_stage=2).step(_batches(tokenizer, 0), _lm_loss)
    b = deepspeed_backend.Trainer(checkpointed, **HYPER, zero_stage=2, gradient_checkpointing=True).step(
        _batches(tokenizer, 0), _lm_loss
    )
    assert checkpointed.is_gradient_checkpointing and not plain.is_gradient_checkpointing
    assert b["loss"] == a["loss"] and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6)
    _assert_close_params(_params(checkpointed), _params(plain), atol=1e-7)


@pytest.mark.slow
def test_inprocess_run_on_deepspeed_matches_torch(_bootstrap_dir, tmp_path):
    # Two iterations with models kept in memory between stages: the ZeRO-3 trainer lives on
    # across iterations and writes its weights back, and ends where the torch run ends.
    finals = {}
    for backend in ("torch", "deepspeed"):
        root = tmp_path / backend
        shutil.copytree(_bootstrap_dir, root / "bootstrap")
        cfg = tiny_config(training__backend=backend, training__zero_stage=3)
        inprocess.run(cfg, str(root), log=lambda _: None)
        layout = RunLayout(str(root))
        finals[backend] = {
            kind: _params(ModelStore(cfg).load(layout.output(2, kind), kind=kind).model) for kind in ("actor", "critic")
        }
        # every critic step of both iterations, counted in the saved optimizer state
        state = load_file(str(root / "iter-0002" / "update_critic" / "critic" / "optimizer.safetensors"))
        assert {float(t) for k, t in state.items() if k.endswith("::step")} == {2.0 * cfg.critic.steps_per_iteration}
    for kind in ("actor", "critic"):
        _assert_close_params(finals["deepspeed"][kind], finals["torch"][kind])


def test_a_bf16_critic_trains_though_deepspeed_casts_its_float32_head(tokenizer):
    # DeepSpeed bf16 casts every parameter it trains, the critic's float32 value head too;
    # the critic's forward must then feed the head in the head's dtype (the GPU path, bf16).
    from ac2_core.models.critic import Critic

    critic = Critic.from_actor(build_tiny_model(tokenizer, SMALL, seed=0).to(torch.bfloat16), seed=0)
    ids = _batches(tokenizer, 0)[0]  # two different rows
    targets = torch.tensor([0.0, 1.0])

    def loss_fn(model, _):
        logits = model(ids, torch.ones_like(ids))
        assert logits.dtype == torch.float32
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, targets), {}

    trainer = deepspeed_backend.Trainer(critic, **HYPER, zero_stage=2)
    stats = trainer.step([None], loss_fn)
    assert stats["loss"] == pytest.approx(math.log(2), rel=1e-3)  # V = 0.5 from the zero head
    assert stats["grad_norm"] > 0
    assert critic.value_head.weight.abs().sum() > 0  # the head moved off zero


def _fit_two_steps(critic, ids: torch.Tensor) -> None:
    """Two ZeRO-2 steps of BCE on the two rows of ``ids``, one labelled a failure and one a success."""
    targets = torch.tensor([0.0, 1.0])

    def loss_fn(model, _):
        return torch.nn.functional.binary_cross_entropy_with_logits(model(ids, torch.ones_like(ids)), targets), {}

    trainer = deepspeed_backend.Trainer(critic, **HYPER, zero_stage=2)
    for _ in range(2):
        trainer.step([None], loss_fn)


def test_a_critic_with_surprise_trains_under_deepspeed_and_leaves_its_next_token_head_alone(tokenizer):
    # the next-token head is frozen (read, never trained); ZeRO must train the rest around it
    from ac2_core.models.critic import SURPRISE_FEATURES, Critic
    from ac2_core.models.tokenizer import special_ids

    state = special_ids(tokenizer)["state"]
    critic = Critic.from_actor(build_tiny_model(tokenizer, SMALL, seed=0).to(torch.bfloat16), seed=0, state_id=state)
    lm_before = critic.lm_head.weight.detach().clone()
    ids = _batches(tokenizer, 0)[0].clone()
    ids[:, 2] = state  # the partial answer starts after position 2 in both rows
    _fit_two_steps(critic, ids)
    assert critic.value_head.weight[0, -SURPRISE_FEATURES:].abs().sum() > 0  # the surprise weights moved off zero
    assert torch.equal(critic.lm_head.weight.detach(), lm_before)


def test_a_critic_that_matches_the_reference_trains_its_match_weights_under_deepspeed(tokenizer):
    from ac2_core.models.critic import MATCH_FEATURES, Critic
    from ac2_core.models.tokenizer import special_ids

    ids_of = special_ids(tokenizer)
    model = build_tiny_model(tokenizer, SMALL, seed=0).to(torch.bfloat16)
    critic = Critic.from_actor(model, seed=0, state_id=ids_of["state"], ref_id=ids_of["ref"], surprise=False)
    ids = _batches(tokenizer, 0)[0].clone()
    ids[:, 0], ids[:, 2] = ids_of["ref"], ids_of["state"]  # a one-token reference, then the partial answer
    _fit_two_steps(critic, ids)
    hidden = critic.backbone.config.hidden_size
    assert critic.value_head.weight[0, hidden : hidden + MATCH_FEATURES].abs().sum() > 0  # the match weights moved
