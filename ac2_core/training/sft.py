"""Supervised warm start on reference solutions, before RL.

RL from a random tiny model finds no reward, so the actor first learns to imitate
worked solutions. The learning rate follows a cosine from ``lr`` down to
``min_lr_ratio * lr`` over ``steps`` (1.0: constant). Training runs all ``steps``, or stops
at the first evaluation that reaches ``target_score`` when one is given; a fixed length
gives the same warm start on every machine, where a threshold on one noisy evaluation
does not.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase


def sft_warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    solutions: list[str],
    **kwargs,
) -> dict:
    """Train ``model`` in place on ``prompt + solution + eos`` (see ``train_lm`` for the rest).

    The loss is next-token cross-entropy on the solution and eos tokens only.
    """
    if len(prompts) != len(solutions) or not prompts:
        raise ValueError(f"prompts and solutions: expected equal non-zero lengths, found {len(prompts)} and {len(solutions)}")
    return train_lm(
        model, [_example(tokenizer, p, s) for p, s in zip(prompts, solutions)], pad_id=tokenizer.pad_token_id, **kwargs
    )


def train_lm(
    model: PreTrainedModel,
    examples: list[tuple[list[int], int]],
    *,
    pad_id: int,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    eval_fn: Callable[[PreTrainedModel], float] | None = None,
    eval_every: int = 50,
    target_score: float | None = None,
    min_lr_ratio: float = 1.0,
    log: Callable[[str], None] = print,
    label: str = "warm start",
    progress_every: int | None = None,
) -> dict:
    """Train ``model`` in place for at most ``steps`` steps on token-id ``examples``:
    ``(ids, n)`` is fitted by next-token cross-entropy on ``ids[n:]`` (what follows the first ``n``).

    Every ``eval_every`` steps (and after the last step) ``eval_fn(model)`` is called with the
    model in eval mode; with a ``target_score``, training stops at the first score >= it.
    Between those reports, every ``progress_every`` steps, a line gives the step and the mean
    loss of those steps: progress only (``runner.progress`` times the phase from it), not history.
    Returns ``{"steps": steps taken, "score": last score or None, "history": [...]}``,
    one history entry ``{"step", "loss", "score"}`` per report. The model ends in eval mode.
    """
    if not examples:
        raise ValueError("no examples to train on")
    if steps < 0 or batch_size < 1 or eval_every < 1:
        raise ValueError(f"expected steps >= 0, batch_size >= 1, eval_every >= 1; found {steps}, {batch_size}, {eval_every}")
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    # cosine from lr to min_lr_ratio * lr over the planned steps
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(k, steps) / max(steps, 1)))
    )
    order = _batches(len(examples), batch_size, seed)
    history: list[dict] = []
    score = None
    losses: list[float] = []
    step = 0
    model.train()
    while step < steps:
        batch = [examples[i] for i in next(order)]
        input_ids, attention_mask, loss_mask = _collate(batch, pad_id, device)
        loss = _loss(model, input_ids, attention_mask, loss_mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        step += 1
        if step % eval_every and step != steps:
            if progress_every and step % progress_every == 0:
                recent = losses[-progress_every:]
                log(f"{label} step {step}/{steps} loss {sum(recent) / len(recent):.3f}")
            continue
        if eval_fn is not None:
            model.eval()
            score = float(eval_fn(model))
            model.train()
        mean_loss = sum(losses) / len(losses)
        losses = []
        history.append({"step": step, "loss": mean_loss, "score": score})
        shown = "" if eval_fn is None else f" score {score:.2f}"
        log(f"{label} step {step}/{steps} loss {mean_loss:.3f}{shown}")
        if target_score is not None and score is not None and score >= target_score:
            log(f"{label} reached score {score:.2f} >= target {target_score:.2f} at step {step}")
            break
    model.eval()
    return {"steps": step, "score": score, "history": history}


def _example(tokenizer: PreTrainedTokenizerBase, prompt: str, solution: str) -> tuple[list[int], int]:
    """(prompt + solution + eos token ids, number of prompt tokens)."""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    solution_ids = tokenizer.encode(solution, add_special_tokens=False)
    return prompt_ids + solution_ids + [tokenizer.eos_token_id], len(prompt_ids)


def _batches(n: int, batch_size: int, seed: int):
    """Endless batches of example indices: seeded reshuffles of all ``n`` examples."""
    generator = torch.Generator().manual_seed(seed)
    pending: list[int] = []
    while True:
        while len(pending) < batch_size:
            pending += torch.randperm(n, generator=generator).tolist()
        yield pending[:batch_size]
        pending = pending[batch_size:]


def _collate(batch: list[tuple[list[int], int]], pad_id: int, device: torch.device):
    """Right-padded input_ids, attention_mask and loss_mask, each (B, T).

    Right padding keeps positions 0..n-1 for every row's real tokens.
    loss_mask marks the tokens to predict: solution and eos, not prompt or padding.
    """
    T = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), T), dtype=torch.long)
    loss_mask = torch.zeros((len(batch), T), dtype=torch.bool)
    for row, (ids, n_prompt) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        loss_mask[row, n_prompt : len(ids)] = True
    return input_ids.to(device), attention_mask.to(device), loss_mask.to(device)


def _loss(model: PreTrainedModel, input_ids, attention_mask, loss_mask) -> torch.Tensor:
    """Mean cross-entropy over the tokens ``loss_mask`` marks (each predicted from its left)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits  # (B, T, V)
    targets = input_ids[:, 1:]
    mask = loss_mask[:, 1:]
    per_token = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), targets, reduction="none")  # (B, T-1)
    loss = per_token[mask].mean()
    if not math.isfinite(loss.item()):
        raise FloatingPointError("warm start loss is not finite; lower warm_start.lr")
    return loss
