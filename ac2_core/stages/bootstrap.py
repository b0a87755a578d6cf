"""bootstrap: before iteration 1, the problem set, the initial actor and critic, and the empty
iteration-0 tables, so that every iteration, the first included, reads the same inputs.

- problems: the task's problems (``cfg.task``).
- actor: a tiny Qwen3-architecture model with a byte-level tokenizer trained on the
  task's text, warm-started by SFT on worked solutions for ``warm_start.max_steps`` (or a
  pretrained HF directory, ``model.source=pretrained``).
- critic: the actor's backbone plus a fresh value head (V = 0.5 everywhere at first); with
  ``critic.read_steps``, a copy of the backbone first learns to read a reference.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ac2_core import storage
from ac2_core.config import AC2Config, TaskConfig
from ac2_core.generation import generate
from ac2_core.models.critic import Critic, build_critic_input
from ac2_core.models.hf import load_model
from ac2_core.models.store import Checkpoint, ModelStore
from ac2_core.models.tiny import build_tiny_model
from ac2_core.models.tokenizer import build_tokenizer, special_ids
from ac2_core.stages.common import Problems, StageStats, prompt_ids, seed_for
from ac2_core.stages.evaluate import validation_score
from ac2_core.tasks import arith, grade_many, problems_for

STAGE = "bootstrap"


def sampled_score(model, tok, rows: list[dict], *, task: TaskConfig, max_tokens: int, temperature: float, seed: int) -> float:
    """Mean reward of one sampled answer per row; answers the grader could not score are left out."""
    samples = generate(
        model,
        [prompt_ids(tok, r["prompt"]) for r in rows],
        [max_tokens] * len(rows),
        n=1,
        eos_id=tok.eos_token_id,
        pad_id=tok.pad_token_id,
        seed=seed,
        temperature=temperature,
    )
    grades = grade_many(
        task,
        rows,
        [tok.decode(g[0].token_ids, skip_special_tokens=True) for g in samples],
        [f"warm-start answer to {r['problem_id']}" for r in rows],
    )
    rewards = [g.reward for g in grades if g.reward is not None]
    return sum(rewards) / len(rewards) if rewards else 0.0  # nothing graded: the target is not shown to be reached


def demonstrations(cfg: AC2Config, rows: list[dict], *, stream: int) -> list[str]:
    """The worked solutions of ``rows`` as the warm start shows them: exact, or (arith with
    ``warm_start.slip_rate``) written by a careless hand, seeded by ``stream``. With
    ``warm_start.misconception_rate`` a share of the problems is worked out under a misconception,
    the same problems in every stream: the critic's reading pairs agree on it, as two answers
    written by one mind would, so reading teaches that an answer follows its reference there."""
    ws = cfg.warm_start
    if not ws.slip_rate and not ws.misconception_rate:
        return [r["solution"] for r in rows]
    rng = np.random.default_rng([cfg.seed, cfg.task.seed, stream])
    out = []
    for r in rows:
        terms = arith.terms_of(r["prompt"])
        wrong = arith.misconceived(terms, rate=ws.misconception_rate, seed=cfg.task.seed)
        out.append(
            arith.slipped_solution(terms, slip_rate=ws.slip_rate, rng=rng, misconceived=wrong, digits=ws.misconception_digits)
        )
    return out


def reading_examples(cfg: AC2Config, tok, rows: list[dict]) -> list[tuple[list[int], int]]:
    """One per problem: the critic's input layout with one demonstration as the reference and
    another, drawn apart, as the partial answer; the loss falls on that answer and its eos.

    Where the two agree the answer can be copied from the reference; where the second has left
    the first (a slip), it must be worked out: so the backbone learns to line an answer up with
    a reference and to notice when the two part. A critic without the reference
    (``critic.use_reference: false``) reads in its own layout, the answer under the prompt alone.
    """
    ids = special_ids(tok)
    refs, answers = demonstrations(cfg, rows, stream=1), demonstrations(cfg, rows, stream=2)
    examples = []
    for r, ref, answer in zip(rows, refs, answers):
        state = tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
        x = build_critic_input(
            prompt_ids(tok, r["prompt"]),
            tok.encode(ref, add_special_tokens=False) if cfg.critic.use_reference else None,
            state,
            ref_id=ids["ref"],
            state_id=ids["state"],
            max_tokens=cfg.critic.max_input_tokens,
        )
        examples.append((x, x.index(ids["state"]) + 1))  # the answer's tokens that fit (cut from its start if too long)
    return examples


PROGRESS_LINES = 25  # about this many lines a phase (warm start, critic reading) shows its progress in, besides evaluations


def _progress_every(steps: int) -> int:
    return max(steps // PROGRESS_LINES, 1)


def _initial_critic(cfg: AC2Config, actor, tok, rows: list[dict], log: Callable[[str], None]) -> Critic:
    """The actor's backbone, after ``critic.read_steps`` of reading, with a zero value head."""
    # a critic with surprise keeps the next-token head; the reference match is added by the first fit (update_critic), so
    # one bootstrap serves runs with and without it
    state_id = special_ids(tok)["state"] if cfg.critic.surprise else None
    if not cfg.critic.read_steps:
        return Critic.from_actor(actor, seed=cfg.seed, state_id=state_id)
    import copy

    from ac2_core.training.sft import train_lm

    reader = copy.deepcopy(actor)  # the actor itself is left as it is
    train = [r for r in rows if r["split"] == "train" and r["solution"]]
    log(f"critic reading: {cfg.critic.read_steps} steps on {len(train)} pairs of demonstrations")
    train_lm(
        reader,
        reading_examples(cfg, tok, train),
        pad_id=tok.pad_token_id,
        steps=cfg.critic.read_steps,
        batch_size=cfg.warm_start.batch_size,
        lr=cfg.critic.read_lr,
        seed=cfg.seed,
        eval_every=max(cfg.critic.read_steps // 4, 1),
        min_lr_ratio=0.1,
        log=log,
        label="critic reading",
        progress_every=_progress_every(cfg.critic.read_steps),
    )
    return Critic.from_actor(reader, seed=cfg.seed, state_id=state_id)


def _initial_actor(cfg: AC2Config, rows: list[dict], device: torch.device, log: Callable[[str], None]):
    """The actor on ``device``, warm-started there."""
    if cfg.model.source == "pretrained":
        local = storage.local_model_dir(cfg.model.path, kind="actor") if storage.exists(cfg.model.path) else cfg.model.path
        model, tok = load_model(local, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
        return model.to(device), tok
    tok = build_tokenizer(r["prompt"] + (r["solution"] or "") for r in rows)
    # initialised on the CPU whatever the device, so a seed gives the same initial weights everywhere
    model = build_tiny_model(tok, cfg.model.tiny, seed=cfg.seed).to(device)
    ws = cfg.warm_start
    if ws.max_steps == 0:
        return model, tok
    train = [r for r in rows if r["split"] == "train" and r["solution"]]
    held_out = train[-ws.eval_problems :]  # scored, never trained on
    train = train[: -ws.eval_problems] or train
    train = [{**r, "solution": demo} for r, demo in zip(train, demonstrations(cfg, train, stream=0))]
    stop = f", stopping early at score {ws.target_score}" if ws.target_score is not None else ""
    log(f"warm start: SFT on {len(train)} worked solutions, {ws.max_steps} steps{stop}")
    result = _sft(cfg, model, tok, train, held_out, log)
    log(f"warm start: {result['steps']} steps, sampled score {result['score']}")
    return model, tok


def _sft(cfg, model, tok, train, held_out, log):
    from ac2_core.training.sft import sft_warm_start

    ws = cfg.warm_start
    score = lambda m: sampled_score(  # noqa: E731
        m,
        tok,
        held_out,
        task=cfg.task,
        max_tokens=cfg.rollout.max_response_tokens,
        temperature=cfg.rollout.temperature,
        seed=seed_for(cfg, 0, STAGE),
    )
    return sft_warm_start(
        model,
        tok,
        [r["prompt"] for r in train],
        [r["solution"] for r in train],
        steps=ws.max_steps,
        batch_size=ws.batch_size,
        lr=ws.lr,
        seed=cfg.seed,
        eval_fn=score,
        eval_every=ws.eval_every,
        target_score=ws.target_score,
        min_lr_ratio=ws.min_lr_ratio,
        log=log,
        progress_every=_progress_every(ws.max_steps),
    )


def initial_metrics(cfg: AC2Config, model, tok, problems: Problems) -> dict:
    """Iteration 0 of the metrics table: the initial policy's validation score, no compute yet."""
    val_score, ungraded_val = validation_score(cfg, model, tok, problems)
    row = {
        "run_id": cfg.run_id,
        "iteration": 0,
        "policy_version": 0,
        # the bootstrap is shared by runs of either algorithm (--bootstrap-from): it names itself
        "algorithm": "bootstrap",
        "config_hash": cfg.bootstrap_hash(),
        "val_score": val_score,
        "readiness_share": 0.0,
        "chunk_groups": 0,
        "full_groups": 0,
        "mean_train_reward": None,
        "ungraded_chunks": 0,
        "ungraded_val": ungraded_val,
        "critic_error": None,
        "critic_auc": None,
        "full_rollout_tokens": 0.0,
        **dict.fromkeys(("actor_loss", "clip_fraction", "grad_norm", "kl", "entropy", "critic_loss")),
    }
    for key in ("decode_tokens", "decode_flops", "prefill_flops", "critic_flops", "train_flops"):
        row[key] = row[f"cum_{key}"] = 0
    return row


@dataclass(frozen=True)
class BootstrapStats(StageStats):
    problems: int
    problems_hash: str
    actor_hash: str
    critic_hash: str


def run(
    cfg: AC2Config,
    *,
    iteration: int = 0,
    out_problems: str,
    out_actor: str,
    out_critic: str,
    out_replay: str,
    out_scored_chunks: str,
    out_readiness: str,
    out_metrics: str,
    log: Callable[[str], None] = print,
) -> BootstrapStats:
    """Write the problem set, actor (version 0), critic (version 0), and the empty
    iteration-0 tables (replay, scored chunks, readiness) and the metrics table's row 0."""
    if iteration != 0:
        raise ValueError(f"the bootstrap is iteration 0; found iteration {iteration}")
    table = problems_for(cfg.task)
    if table.num_rows == 0:
        raise ValueError("the task produced an empty problem set")
    store = ModelStore(cfg)
    device = store.device  # an absent cuda is an error before any model is built
    with torch.random.fork_rng():  # leave the caller's global RNG untouched
        torch.manual_seed(cfg.seed)
        model, tok = _initial_actor(cfg, table.to_pylist(), device, log)
    rows = table.to_pylist()
    key = cfg.bootstrap_hash()  # bootstraps are shared by runs that agree on these fields
    problems_hash = storage.write_table(out_problems, table, kind="problems", stage=STAGE, config_hash=key).content_hash
    actor_hash = store.save(out_actor, Checkpoint("actor", model, tok, 0), stage=STAGE, config_hash=key)
    with torch.random.fork_rng():
        torch.manual_seed(cfg.seed)
        critic_ckpt = Checkpoint("critic", _initial_critic(cfg, model, tok, rows, log), tok, 0)
    critic_hash = store.save(out_critic, critic_ckpt, stage=STAGE, config_hash=key)
    for kind, uri in (("replay", out_replay), ("scored_chunks", out_scored_chunks), ("readiness", out_readiness)):
        storage.write_table(uri, storage.table_from_rows([], kind), kind=kind, stage=STAGE, config_hash=key)
    initial = initial_metrics(cfg, model, tok, Problems({r["problem_id"]: r for r in rows}))
    storage.write_table(out_metrics, storage.table_from_rows([initial], "metrics"), kind="metrics", stage=STAGE, config_hash=key)
    stats = BootstrapStats(table.num_rows, problems_hash, actor_hash, critic_hash)
    log(f"bootstrap: {json.dumps(stats.as_dict())}")
    return stats
