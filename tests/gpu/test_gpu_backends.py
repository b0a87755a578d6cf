"""GPU checks of the backends, for a machine with CUDA (skipped without it).

Run on a GPU machine with ``pytest -q -s tests/gpu``; ``-s`` shows the measured numbers
(tokens/s, step times, log-prob gaps). On the tiny model in bf16:

- hf generation: well-formed rows, behaviour log-probs that a recompute agrees with;
- actor and critic updates with the torch backend, and with DeepSpeed ZeRO 2 and 3
  (when importable; nccl, world size 1) against the torch backend's step;
- the vllm backend (when a CUDA build of vLLM is importable) against hf recomputed
  log-probs.

These checks call the backends directly with inputs on the model's device; the stages
themselves run on CUDA in ``test_gpu_iteration.py`` (one AC2 iteration, ``model.device``).
"""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch

from ac2_core.config import TinyModelConfig
from ac2_core.generation import generate
from ac2_core.models.critic import Critic
from ac2_core.models.hf import save_model
from ac2_core.models.tiny import build_tiny_model
from ac2_core.models.tokenizer import build_tokenizer
from ac2_core.training.torch_backend import Trainer as TorchTrainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CFG = TinyModelConfig(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=384)
HYPER = {"lr": 1e-3, "weight_decay": 0.0, "max_grad_norm": 1.0}
# bf16 has an 8-bit mantissa: a log-prob near -5 is only good to about 0.02, and batch
# shapes change the rounding; a wrong temperature or a shifted token is off by far more.
BF16_LOGPROB_ATOL = 0.1


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(["12+34=46;#46\n", "7+8=15;#15\n", "99+1=100;#100\n"])


def _model(tok, dtype=torch.bfloat16):
    return build_tiny_model(tok, CFG, seed=0).to("cuda", dtype)


def _contexts(tok):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in ("12+34=", "7+8=15;", "1", "99+1=100;")]


def _recomputed(model, contexts, samples, temperature):
    """log_softmax(logits / T) of each sampled token, context by context, in float32."""
    gaps = []
    for ctx, s in zip(contexts, samples):
        ids = torch.tensor([ctx + s.token_ids], device="cuda")
        with torch.no_grad():
            logits = model(input_ids=ids).logits.float()[0, len(ctx) - 1 : -1]
        lp = torch.log_softmax(logits / temperature, -1).gather(-1, ids[0, len(ctx) :, None]).squeeze(-1)
        gaps.append((lp.cpu() - torch.tensor(s.logprobs)).abs().max().item())
    return max(gaps)


def _lm_batches(tok, k):
    texts = [f"{k}{i}+{i}7={k}9;#{i}\n" for i in range(8)]
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    width = max(map(len, ids))
    ids = [x + [tok.pad_token_id] * (width - len(x)) for x in ids]
    return [torch.tensor(ids[j : j + 4], device="cuda") for j in (0, 4)]


def _lm_loss(model, input_ids):
    return model(input_ids=input_ids, labels=input_ids).loss / 2, {}


def test_hf_generation_bf16(tok):
    model = _model(tok)
    ctx = _contexts(tok)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = generate(model, ctx, [64] * 4, n=8, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seed=0, temperature=0.8)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    n_tokens = sum(len(s.token_ids) for g in out for s in g)
    print(f"hf generate bf16: {n_tokens} tokens in {seconds:.2f} s ({n_tokens / seconds:.0f} tokens/s)")
    for group in out:
        assert len(group) == 8
        for s in group:
            assert 1 <= len(s.token_ids) <= 64 and len(s.logprobs) == len(s.token_ids)
            assert all(lp <= 0 for lp in s.logprobs)
    gap = _recomputed(model, [c for c, g in zip(ctx, out) for _ in g], [s for g in out for s in g], 0.8)
    print(f"hf generate bf16: max |behaviour - recomputed| log-prob {gap:.3g}")
    assert gap < BF16_LOGPROB_ATOL


def test_actor_and_critic_updates_bf16_torch(tok):
    actor = _model(tok)
    before = {n: p.detach().clone() for n, p in actor.named_parameters()}
    trainer = TorchTrainer(actor, **HYPER)
    t0 = time.perf_counter()
    stats = trainer.step(_lm_batches(tok, 0), _lm_loss)
    torch.cuda.synchronize()
    print(f"torch actor step bf16: {time.perf_counter() - t0:.3f} s, loss {stats['loss']:.4f}")
    assert torch.isfinite(torch.tensor(stats["loss"])) and stats["grad_norm"] > 0
    assert any(not torch.equal(before[n], p) for n, p in actor.named_parameters())

    critic = Critic.from_actor(_model(tok), seed=0).to("cuda")  # bf16 backbone, float32 value head
    ids = _lm_batches(tok, 1)[0]
    targets = torch.tensor([0.0, 1.0, 1.0, 0.0], device="cuda")

    def critic_loss(model, _):
        logits = model(ids, torch.ones_like(ids)).float()
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, targets), {}

    first = TorchTrainer(critic, **HYPER).step([None], critic_loss)
    assert torch.isfinite(torch.tensor(first["loss"])) and first["grad_norm"] > 0


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed")
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_step_matches_torch_bf16(tok, stage):
    from ac2_core.training.deepspeed_backend import Trainer as DeepSpeedTrainer

    ref, ours = _model(tok), _model(tok)
    a = TorchTrainer(ref, **HYPER).step(_lm_batches(tok, 0), _lm_loss)
    t0 = time.perf_counter()
    b = DeepSpeedTrainer(ours, **HYPER, zero_stage=stage).step(_lm_batches(tok, 0), _lm_loss)
    torch.cuda.synchronize()
    print(f"deepspeed ZeRO-{stage} step bf16: {time.perf_counter() - t0:.3f} s (incl. engine setup)")
    # same forward on the same bf16 weights: the losses agree to bf16 rounding
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-2)
    # DeepSpeed steps fp32 master weights and rounds them to bf16; torch steps bf16 weights
    # in place, so only agreement to a bf16 ulp of the update is expected
    gap = max((p.float() - q.float()).abs().max().item() for p, q in zip(ours.parameters(), ref.parameters()))
    print(f"deepspeed ZeRO-{stage} vs torch: max weight gap {gap:.3g} after one step at lr {HYPER['lr']}")
    assert gap < 5 * HYPER["lr"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_vllm_backend_bf16(tok, tmp_path):
    from ac2_core.generation import vllm as vllm_backend

    model = build_tiny_model(tok, CFG, seed=0)
    save_model(model, tok, tmp_path / "actor")
    settings = vllm_backend.EngineSettings(dtype="bfloat16", gpu_memory_utilization=0.3, enforce_eager=False)
    ctx = _contexts(tok)
    try:
        t0 = time.perf_counter()
        vllm_backend.engine(tmp_path / "actor", settings)
        print(f"vllm engine start: {time.perf_counter() - t0:.1f} s")
        t0 = time.perf_counter()
        out = vllm_backend.generate(
            tmp_path / "actor", ctx, [64] * 4, n=8, eos_id=tok.eos_token_id, seed=0, temperature=0.8, settings=settings
        )
        seconds = time.perf_counter() - t0
        again = vllm_backend.generate(
            tmp_path / "actor", ctx, [64] * 4, n=8, eos_id=tok.eos_token_id, seed=0, temperature=0.8, settings=settings
        )
    finally:
        vllm_backend.release()
    n_tokens = sum(len(s.token_ids) for g in out for s in g)
    print(f"vllm generate bf16: {n_tokens} tokens in {seconds:.2f} s ({n_tokens / seconds:.0f} tokens/s)")
    assert [[s.token_ids for s in g] for g in out] == [[s.token_ids for s in g] for g in again]
    for group in out:
        assert len(group) == 8 and all(1 <= len(s.token_ids) <= 64 for s in group)
    gap = _recomputed(model.to("cuda", torch.float32), [c for c, g in zip(ctx, out) for _ in g], [s for g in out for s in g], 0.8)
    print(f"vllm bf16 vs hf fp32: max |behaviour - recomputed| log-prob {gap:.3g}")
    assert gap < BF16_LOGPROB_ATOL
