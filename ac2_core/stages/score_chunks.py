"""score_chunks: terminal rewards, critic values, and (prediction, outcome) pairs
(DESIGN.md section 2, step 3).

- A finished chunk gets the grader's reward R; an unfinished one gets V(x, s+c; ref).
  A finished chunk the grader could not score (the judge failed) is kept ungraded:
  reward and target null, ``grade_error`` says why, and it makes no critic pairs.
- Every chunk also gets V(x, s; ref) at its start.
- Every finished trajectory is scored by the critic at each chunk boundary: these
  (prediction, outcome) pairs are scored here, before ``update_critic`` trains on the
  outcomes, so readiness is always measured out of sample.
"""

from __future__ import annotations

from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.models.store import ModelStore
from ac2_core.replay import cut_points
from ac2_core.stages.common import Problems, read, write
from ac2_core.tasks import Grade, grade_many

# The critic's code (torch, transformers) is imported only when a critic is used: under grpo
# this stage grades with the actor's tokenizer alone, and a fresh KFP task then starts in
# about a second instead of five.

STAGE = "score_chunks"


def grade_finished(cfg: AC2Config, probs: Problems, finished: list[tuple[dict, list[int]]], tok) -> dict[str, Grade]:
    """chunk_id -> Grade of each (chunk row, response token ids), graded as one batch."""
    grades = grade_many(
        cfg.task,
        [probs[c["problem_id"]] for c, _ in finished],
        [tok.decode(response, skip_special_tokens=True) for _, response in finished],
        [f"chunk {c['chunk_id']}" for c, _ in finished],
    )
    return {c["chunk_id"]: g for (c, _), g in zip(finished, grades)}


def run(
    cfg: AC2Config,
    *,
    iteration: int,
    problems: str,
    replay: str,
    prefixes: str,
    chunks: str,
    actor: str,
    critic: str | None,
    out_scored_chunks: str,
    out_critic_pairs: str,
    store: ModelStore | None = None,
) -> dict:
    store = store or ModelStore(cfg)
    probs = Problems.load(problems)
    prefix_by_id = {p["prefix_id"]: p for p in read(prefixes, "prefixes")}
    rows = read(chunks, "chunks")
    use_critic = cfg.uses_critic
    if use_critic and critic is None:
        raise ValueError("algorithm ac2 needs a critic checkpoint for score_chunks")

    ckpt = store.load(critic, kind="critic") if use_critic else None
    tok = store.tokenizer(actor, kind="actor")  # rewards are graded on the decoded text

    scored, pairs, requests = [], [], []  # requests: (row index, slot, critic input)
    builder = None
    if use_critic:
        from ac2_core.stages.critic_io import CriticInputs

        builder = CriticInputs(cfg, tok, probs, read(replay, "replay"))
    for c in rows:
        if c["prefix_id"] not in prefix_by_id:
            raise ValueError(f"{chunks}: chunk {c['chunk_id']} refers to prefix {c['prefix_id']}, absent from {prefixes}")
    grades = grade_finished(
        cfg,
        probs,
        [(c, prefix_by_id[c["prefix_id"]]["prefix_token_ids"] + c["token_ids"]) for c in rows if c["finish_reason"] != "length"],
        tok,
    )
    for c in rows:
        p = prefix_by_id[c["prefix_id"]]
        response = p["prefix_token_ids"] + c["token_ids"]
        finished = c["finish_reason"] != "length"
        grade = grades.get(c["chunk_id"])
        reward = grade.reward if grade is not None else None
        i = len(scored)
        scored.append(
            {
                "run_id": cfg.run_id,
                "iteration": iteration,
                "policy_version": c["policy_version"],
                "chunk_id": c["chunk_id"],
                "prefix_id": c["prefix_id"],
                "problem_id": c["problem_id"],
                "mode": p["mode"],
                "source_trajectory_id": p["source_trajectory_id"],
                "ref_trajectory_id": p["ref_trajectory_id"],
                "response_token_ids": response,
                "finished": finished,
                "reward": reward,
                "value_start": None,
                "value_end": None,
                "target": reward,
                "target_source": ("reward" if reward is not None else "ungraded") if finished else "critic",
                "grade_error": grade.error if grade is not None else None,
                "critic_flops": 0.0,
            }
        )
        if builder is None:
            continue
        pid, ref = c["problem_id"], p["ref_trajectory_id"]
        requests.append((i, "value_start", builder.build(pid, ref, p["prefix_token_ids"])))
        if not finished:
            requests.append((i, "value_end", builder.build(pid, ref, response)))
            continue
        if reward is None:  # ungraded: no outcome to pair predictions with
            continue
        for cut in cut_points(len(response), cfg.rollout.chunk_tokens, finished=True):
            pairs.append(
                {
                    "run_id": cfg.run_id,
                    "iteration": iteration,
                    "policy_version": c["policy_version"],
                    "pair_id": f"{c['chunk_id']}-c{cut}",
                    "problem_id": c["problem_id"],
                    "trajectory_id": c["chunk_id"],
                    "cut": cut,
                    "ref_trajectory_id": p["ref_trajectory_id"],
                    "prediction": None,
                    "outcome": reward,
                    "critic_tokens": 0,
                }
            )
            requests.append((i, len(pairs) - 1, builder.build(pid, ref, response[:cut])))

    if ckpt is not None and requests:
        _apply_critic(cfg, ckpt, critic, requests, scored, pairs)
    scored_hash = write(cfg, STAGE, out_scored_chunks, scored, "scored_chunks")
    write(cfg, STAGE, out_critic_pairs, pairs, "critic_pairs")
    rewards = [s["reward"] for s in scored if s["finished"] and s["reward"] is not None]
    return {
        "chunks": len(scored),
        "finished": sum(s["finished"] for s in scored),
        "ungraded": sum(s["target_source"] == "ungraded" for s in scored),
        "mean_reward": sum(rewards) / len(rewards) if rewards else float("nan"),
        "critic_pairs": len(pairs),
        "critic_inputs": len({tuple(r[2]) for r in requests}),
        "critic_flops": sum(s["critic_flops"] for s in scored),
        "scored_chunks_hash": scored_hash,
    }


def _apply_critic(cfg: AC2Config, ckpt, critic_uri: str, requests, scored, pairs) -> None:
    from ac2_core.math import attention_width, count_non_embedding_params, critic_flops

    inputs = [r[2] for r in requests]
    match cfg.critic.scoring_backend:
        case "hf":
            from ac2_core.generation.scoring import score_inputs

            values = score_inputs(ckpt.model, inputs, pad_id=ckpt.tokenizer.pad_token_id, batch_size=cfg.critic.score_batch_size)
        case "vllm":
            from ac2_core.generation import vllm as vllm_backend

            folder = storage.local_model_dir(critic_uri, kind="critic")
            settings = vllm_backend.EngineSettings.from_config(cfg)
            values = vllm_backend.score(folder, ckpt.model.value_head, inputs, settings=settings)
    n_params = count_non_embedding_params(ckpt.model)
    n_layers, d_attn = attention_width(ckpt.model.backbone.config)
    charged = set()
    for (i, slot, x), v in zip(requests, values):
        if isinstance(slot, int):
            pairs[slot]["prediction"] = v
            pairs[slot]["critic_tokens"] = len(x)
        else:
            scored[i][slot] = v
            if slot == "value_end":
                scored[i]["target"] = v
        if tuple(x) not in charged:  # identical inputs are computed once; charge the first row
            charged.add(tuple(x))
            scored[i]["critic_flops"] += critic_flops(n_params=n_params, n_layers=n_layers, d_attn=d_attn, n_tokens=len(x))
