"""generate_chunks: continue every prefix G times, up to its budget (docs/design.md section 2, step 2).

G is ``rollout.group_size``, or ``rollout.full_group_size`` for a full-mode prefix once
chunk mode is on (``AC2Config.samples_per_group``).

Contexts are prompt tokens + prefix tokens, fed as ids and never re-tokenized. A chunk
that ends the answer with eos is ``stop``; one that used its chunk budget is ``length``;
one that reached ``max_response_tokens`` without eos is ``truncated`` (finished, and
graded as it stands).
"""

from __future__ import annotations

from dataclasses import dataclass

from ac2_core.config import AC2Config
from ac2_core.generation import generate_for
from ac2_core.models.store import ModelStore
from ac2_core.stages.common import Problems, StageStats, prompt_ids, read, seed_for, write

STAGE = "generate_chunks"


def finish_reason(sample_reason: str, response_len: int, max_response_tokens: int) -> str:
    if sample_reason == "stop":
        return "stop"
    return "truncated" if response_len >= max_response_tokens else "length"


@dataclass(frozen=True)
class GenerateStats(StageStats):
    chunks: int
    decode_tokens: int
    finished: int  # chunks that ended the answer (eos, or max_response_tokens)
    policy_version: int
    chunks_hash: str


def run(
    cfg: AC2Config,
    *,
    iteration: int,
    problems: str,
    prefixes: str,
    actor: str,
    out_chunks: str,
    store: ModelStore | None = None,
    progress=None,
) -> GenerateStats:
    store = store or ModelStore(cfg)
    probs = Problems.load(problems)
    rows = read(prefixes, "prefixes")
    policy = store.load(actor, kind="actor")
    tok = policy.tokenizer
    prompts = {pid: prompt_ids(tok, probs[pid]["prompt"]) for pid in sorted({r["problem_id"] for r in rows})}
    contexts = [prompts[r["problem_id"]] + r["prefix_token_ids"] for r in rows]
    samples = _continue(cfg, iteration, policy.model, actor, rows, contexts, tok, progress)
    out = []
    for r, ctx, group in zip(rows, contexts, samples):
        for j, s in enumerate(group):
            out.append(
                {
                    "run_id": cfg.run_id,
                    "iteration": iteration,
                    "policy_version": policy.version,
                    "chunk_id": f"{r['prefix_id']}-s{j}",
                    "prefix_id": r["prefix_id"],
                    "problem_id": r["problem_id"],
                    "sample_index": j,
                    "context_tokens": len(ctx),
                    "token_ids": s.token_ids,
                    "logprobs": s.logprobs,
                    "finish_reason": finish_reason(
                        s.finish_reason, len(r["prefix_token_ids"]) + len(s.token_ids), cfg.rollout.max_response_tokens
                    ),
                }
            )
    chunk_hash = write(cfg, STAGE, out_chunks, out, "chunks")
    decoded = sum(len(c["token_ids"]) for c in out)
    return GenerateStats(
        chunks=len(out),
        decode_tokens=decoded,
        finished=sum(c["finish_reason"] != "length" for c in out),
        policy_version=policy.version,
        chunks_hash=chunk_hash,
    )


def _continue(cfg: AC2Config, iteration: int, model, actor: str, rows: list[dict], contexts, tok, progress) -> list:
    """Each row's samples, in row order. Rows are decoded in one call per sample count; the
    rows continued ``group_size`` times draw the stage's seed, so a run without
    ``full_group_size`` samples exactly what it always did."""
    ns = [cfg.samples_per_group(iteration, r["mode"], baseline_rate=r["baseline_rate"]) for r in rows]
    total = sum(ns)
    out: list = [None] * len(rows)
    done = 0
    for n in sorted(set(ns)):  # each count its own call and seed stream: their order changes no sample
        idx = [i for i, m in enumerate(ns) if m == n]
        stream = STAGE if n == cfg.rollout.group_size else f"{STAGE}/n{n}"

        def step(k: int, _: int, offset: int = done) -> None:
            if progress:
                progress(offset + k, total)

        got = generate_for(
            cfg,
            model,
            actor,
            [contexts[i] for i in idx],
            [rows[i]["budget"] for i in idx],
            n=n,
            eos_id=tok.eos_token_id,
            pad_id=tok.pad_token_id,
            seed=seed_for(cfg, iteration, stream),
            temperature=cfg.rollout.temperature,
            progress=step,
        )
        for i, group in zip(idx, got):
            out[i] = group
        done += len(idx) * n
    return out
