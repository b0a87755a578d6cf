"""The supervised warm start, on a real tiny model."""

from __future__ import annotations

import pytest
import torch

from ac2_core.config import TinyModelConfig
from ac2_core.models.tiny import build_tiny_model
from ac2_core.models.tokenizer import build_tokenizer
from ac2_core.tasks.arith import generate_problems
from ac2_core.training.sft import sft_warm_start

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=128)


@pytest.fixture(scope="module")
def data():
    rows = generate_problems(n_terms=3, max_value=99, train_size=64, val_size=1, seed=0).to_pylist()
    train = [r for r in rows if r["split"] == "train"]
    tokenizer = build_tokenizer(r["prompt"] + r["solution"] for r in train)
    return tokenizer, [r["prompt"] for r in train], [r["solution"] for r in train]


def _solution_loss(model, tokenizer, prompt, solution):
    """Mean next-token cross-entropy of solution + eos after the prompt, computed directly."""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    target = tokenizer.encode(solution, add_special_tokens=False) + [tokenizer.eos_token_id]
    ids = torch.tensor([prompt_ids + target])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
    return torch.nn.functional.cross_entropy(logits, torch.tensor(target)).item()


def test_short_run_lowers_the_loss(data):
    tokenizer, prompts, solutions = data
    model = build_tiny_model(tokenizer, SMALL, seed=0)
    before = _solution_loss(model, tokenizer, prompts[0], solutions[0])
    lines = []
    result = sft_warm_start(
        model, tokenizer, prompts, solutions, steps=30, batch_size=16, lr=3e-3, seed=0, eval_every=10, log=lines.append
    )
    after = _solution_loss(model, tokenizer, prompts[0], solutions[0])
    assert not model.training
    assert result["steps"] == 30 and result["score"] is None
    assert [h["step"] for h in result["history"]] == [10, 20, 30]
    # From about ln(260) = 5.6 (uniform) to the digit/operator distribution and beyond.
    assert after < 0.6 * before
    assert result["history"][-1]["loss"] < 0.6 * result["history"][0]["loss"]
    assert lines[0].startswith("warm start step 10/30 loss ")


def test_same_seed_same_weights(data):
    tokenizer, prompts, solutions = data
    models = [build_tiny_model(tokenizer, SMALL, seed=1) for _ in range(2)]
    for model in models:
        sft_warm_start(model, tokenizer, prompts, solutions, steps=3, batch_size=8, lr=1e-3, seed=5, log=lambda _: None)
    a, b = (m.state_dict() for m in models)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_stops_at_first_evaluation_reaching_target(data):
    tokenizer, prompts, solutions = data
    model = build_tiny_model(tokenizer, SMALL, seed=0)
    scores = iter([0.0, 0.1, 0.25, 0.9])
    calls = []

    def eval_fn(m):
        calls.append(m.training)
        return next(scores)

    lines = []
    result = sft_warm_start(
        model, tokenizer, prompts, solutions, steps=100, batch_size=4, lr=1e-3, seed=0,
        eval_fn=eval_fn, eval_every=2, target_score=0.2, log=lines.append,
    )  # fmt: skip
    assert result["steps"] == 6 and result["score"] == 0.25
    assert [(h["step"], h["score"]) for h in result["history"]] == [(2, 0.0), (4, 0.1), (6, 0.25)]
    assert calls == [False, False, False]  # evaluated in eval mode
    assert "warm start step 6/100 loss" in lines[2] and lines[2].endswith("score 0.25")


def test_evaluates_after_the_last_step_too_and_progress_lines_leave_the_history_alone(data):
    tokenizer, prompts, solutions = data
    model = build_tiny_model(tokenizer, SMALL, seed=0)
    steps_seen, lines = [], []
    result = sft_warm_start(
        model, tokenizer, prompts, solutions, steps=5, batch_size=4, lr=1e-3, seed=0,
        eval_fn=lambda m: steps_seen.append(1) or 0.0, eval_every=3, target_score=1.0, log=lines.append,
        progress_every=1,
    )  # fmt: skip
    assert [h["step"] for h in result["history"]] == [3, 5] and len(steps_seen) == 2
    assert result["steps"] == 5 and result["score"] == 0.0
    # a progress line at every step between the evaluations; at 3 and 5 the evaluation's report stands in for it
    assert [line.split(" loss ")[0] for line in lines] == [f"warm start step {k}/5" for k in range(1, 6)]
    assert [line.endswith("score 0.00") for line in lines] == [False, False, True, False, True]


def test_rejects_mismatched_inputs(data):
    tokenizer, prompts, solutions = data
    model = build_tiny_model(tokenizer, SMALL, seed=0)
    with pytest.raises(ValueError, match="prompts and solutions"):
        sft_warm_start(model, tokenizer, prompts, solutions[:-1], steps=1, batch_size=1, lr=1e-3, seed=0)
