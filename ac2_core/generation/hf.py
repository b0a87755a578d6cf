"""The ``hf`` generation backend: continue token-id contexts with a transformers model.

A small sampling loop over the model's forward with a KV cache (``decoders.py``: one
allocated once per batch for Qwen3 models, transformers' ``DynamicCache`` for others, the
same logits, to the last bit), rather than ``model.generate``: it gives exact behaviour
log-probs under the sampling temperature, a seeded ``torch.Generator`` per batch (no
global RNG), and rows that stop at their own budget. Contexts are token ids and are never
re-tokenized.

It runs where the model is: batches are built on the model's device, sampled there with
a generator on that device, and only the finished rows come back to the CPU. A seed
gives the same samples on every rerun on one kind of device; CPU and CUDA generators are
different algorithms, so a seed's samples differ between the two.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ac2_core.generation.decoders import decoder_for
from ac2_core.models.device import device_of


@dataclass(frozen=True)
class Sample:
    token_ids: list[int]
    logprobs: list[float]  # behaviour log-prob of each token, under the sampling temperature
    finish_reason: str  # "stop" (eos sampled; eos is the last token) | "length" (budget used up)


def _seed_for(seed: int, batch_index: int) -> int:
    # A distinct, reproducible stream per batch: reruns with the same inputs match bit for bit.
    return (seed * 1_000_003 + batch_index * 7_919) % (2**63 - 1)


@torch.no_grad()
def generate(
    model,
    contexts: list[list[int]],
    budgets: list[int],
    *,
    n: int,
    eos_id: int,
    pad_id: int,
    seed: int,
    temperature: float = 1.0,
    greedy: bool = False,
    batch_size: int = 256,
    progress: Callable[[int, int], None] | None = None,
) -> list[list[Sample]]:
    """Continue each context ``n`` times, each continuation adding at most its budget.

    contexts: P lists of token ids (prompt + prefix). budgets: P ints.
    Returns P lists of ``n`` samples, in input order.
    """
    batches = batch_plan(contexts, budgets, n=n, batch_size=batch_size)
    out: list[list[Sample | None]] = [[None] * n for _ in contexts]
    done, total = 0, len(contexts) * n
    for b, batch in enumerate(batches):
        samples = decode_batch(
            model, contexts, budgets, batch, b, eos_id=eos_id, pad_id=pad_id, seed=seed, temperature=temperature, greedy=greedy
        )
        for (p, j), s in zip(batch, samples):
            out[p][j] = s
        done += len(batch)
        if progress:
            progress(done, total)
    return out  # type: ignore[return-value]


def batch_plan(contexts: list[list[int]], budgets: list[int], *, n: int, batch_size: int) -> list[list[tuple[int, int]]]:
    """The batches ``generate`` decodes, as (context, sample) index pairs; batch ``b`` samples
    from seed stream ``b``, so any process that decodes batch ``b`` decodes the same rows."""
    if len(contexts) != len(budgets):
        raise ValueError(f"{len(contexts)} contexts but {len(budgets)} budgets")
    if any(not c for c in contexts):
        raise ValueError("every context needs at least one token (the prompt)")
    rows = [(p, j) for p in range(len(contexts)) for j in range(n)]
    # Rows of one budget decode together, so short chunks never wait for full answers.
    rows.sort(key=lambda r: (budgets[r[0]], r[0], r[1]))
    return [rows[start : start + batch_size] for start in range(0, len(rows), batch_size)]


def decode_batch(
    model, contexts, budgets, batch: list[tuple[int, int]], b: int, *, eos_id, pad_id, seed, temperature, greedy
) -> list[Sample]:
    """The samples of batch ``b`` of ``batch_plan``, in its row order, each clipped to its budget."""
    device = next(model.parameters()).device
    samples = _decode_batch(
        model,
        [contexts[p] for p, _ in batch],
        max(budgets[p] for p, _ in batch),
        eos_id=eos_id,
        pad_id=pad_id,
        generator=torch.Generator(device=device).manual_seed(_seed_for(seed, b)),
        temperature=temperature,
        greedy=greedy,
    )
    return [_clip(s, budgets[p]) for (p, _), s in zip(batch, samples)]


def _clip(s: Sample, budget: int) -> Sample:
    if len(s.token_ids) <= budget:
        return s
    return Sample(s.token_ids[:budget], s.logprobs[:budget], "length")


def _decode_batch(model, contexts, budget, *, eos_id, pad_id, generator, temperature, greedy, decoder=None) -> list[Sample]:
    B = len(contexts)
    width = max(len(c) for c in contexts)
    device = next(model.parameters()).device
    input_ids = torch.full((B, width), pad_id, dtype=torch.long)
    mask = torch.zeros((B, width), dtype=torch.long)
    for i, c in enumerate(contexts):  # left padding: every row's next token sits in the last column
        input_ids[i, width - len(c) :] = torch.tensor(c)
        mask[i, width - len(c) :] = 1
    input_ids, mask = input_ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    # Finished rows stay in the batch (masked, fed pad): dropping them would change the
    # shapes of the matmuls and the sampler's random draws, and so the other rows' bits.
    steps = (decoder or decoder_for(model))(model, input_ids, mask, positions, steps=budget)
    tokens = torch.zeros((B, budget), dtype=torch.long, device=device)
    logps = torch.zeros((B, budget), dtype=torch.float32, device=device)
    lengths = torch.full((B,), budget, dtype=torch.long, device=device)
    alive = torch.ones(B, dtype=torch.bool, device=device)
    pads = torch.full((B,), pad_id, dtype=torch.long, device=device)
    logits = steps.prefill()
    for t in range(budget):
        logprobs = torch.log_softmax(logits.float() / temperature, dim=-1)
        if greedy:
            nxt = logprobs.argmax(-1)
        else:
            nxt = torch.multinomial(logprobs.exp(), 1, generator=generator).squeeze(-1)
        tokens[:, t] = nxt
        logps[:, t] = logprobs.gather(-1, nxt[:, None]).squeeze(-1)
        stopped = alive & (nxt == eos_id)
        lengths[stopped] = t + 1
        alive &= ~stopped
        if t + 1 == budget or not alive.any():
            break
        logits = steps.step(torch.where(alive, nxt, pads), alive)
    tokens, logps, lengths, alive = tokens.cpu(), logps.cpu(), lengths.cpu(), alive.cpu()
    samples = []
    for i in range(B):
        k = int(lengths[i])
        samples.append(Sample(tokens[i, :k].tolist(), logps[i, :k].tolist(), "length" if alive[i] else "stop"))
    return samples


def _response_log_softmax(model, contexts: list[list[int]], responses: list[list[int]], *, pad_id: int, temperature: float):
    """The model's next-token log-distribution at each response position and the response ids.

    Returns ``(logp, ids, spans)``: ``logp`` (B, W - 1, V) over the padded sequences, the padded
    ids (B, W) on the model's device, and each row's (start, length) of its response in ``logp``."""
    device = device_of(model)
    seqs = [c + r for c, r in zip(contexts, responses)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
    ids, attn = ids.to(device), attn.to(device)  # built on the CPU, one copy per micro-batch
    logits = model(input_ids=ids, attention_mask=attn).logits.float()
    logp = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
    # the token at position p is predicted by the logits at p - 1
    spans = [(len(c) - 1, len(r)) for c, r in zip(contexts, responses)]
    return logp, ids, spans


def _per_response_token(values: torch.Tensor, spans: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, W - 1) values laid out as (B, T) response positions, with a (B, T) mask."""
    T = max(n for _, n in spans)
    out = torch.zeros((len(spans), T), device=values.device)
    mask = torch.zeros((len(spans), T), device=values.device)
    for i, (start, n) in enumerate(spans):
        out[i, :n] = values[i, start : start + n]
        mask[i, :n] = 1
    return out, mask


def token_logprobs(model, contexts: list[list[int]], responses: list[list[int]], *, pad_id: int, temperature: float):
    """Log-probs of each response token given its context: (B, T) plus a (B, T) mask, on the model's device."""
    logp, ids, spans = _response_log_softmax(model, contexts, responses, pad_id=pad_id, temperature=temperature)
    return _per_response_token(logp.gather(-1, ids[:, 1:, None]).squeeze(-1), spans)


def token_entropies(model, contexts: list[list[int]], responses: list[list[int]], *, pad_id: int, temperature: float):
    """Entropy (nats) of the model's next-token distribution at each response position, whatever token
    was written there: (B, T) plus a (B, T) mask, on the model's device. High where the model could go
    several ways (a forking token), low where it writes what the context dictates."""
    logp, _, spans = _response_log_softmax(model, contexts, responses, pad_id=pad_id, temperature=temperature)
    return _per_response_token(-(logp.exp() * logp).sum(-1), spans)
