"""score_chunks: terminal rewards, critic values, and (prediction, outcome) pairs
(docs/design.md section 2, step 3).

- A finished chunk gets the grader's reward R; an unfinished one gets V(x, s+c; ref).
  A finished chunk the grader could not score (the judge failed) is kept ungraded:
  reward and target null, ``grade_error`` says why, and it makes no critic pairs.
- Every chunk also gets V(x, s; ref) at its start.
- Every finished trajectory is scored by the critic at each chunk boundary: these
  (prediction, outcome) pairs are scored here, before ``update_critic`` trains on the
  outcomes, so readiness is always measured out of sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.models.store import ModelStore
from ac2_core.replay import cut_points
from ac2_core.stages.common import Problems, StageStats, read, write
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


@dataclass(frozen=True)
class ScoreStats(StageStats):
    chunks: int
    finished: int
    ungraded: int
    mean_reward: float  # over graded finished chunks; nan when there are none
    critic_pairs: int
    critic_inputs: int  # distinct critic inputs scored
    critic_flops: float
    scored_chunks_hash: str


@dataclass(frozen=True)
class CriticRequest:
    """One state to score, and where its value goes."""

    row: int  # the scored_chunks row it belongs to; the critic FLOPs are charged there
    problem_id: str
    ref: str | None  # the reference trajectory shown to the critic
    state: list[int]  # the partial answer
    field: Literal["value_start", "value_end", "prediction"]  # prediction: of critic_pairs row ``pair``
    pair: int | None = None


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
) -> ScoreStats:
    store = store or ModelStore(cfg)
    probs = Problems.load(problems)
    prefix_by_id = {p["prefix_id"]: p for p in read(prefixes, "prefixes")}
    rows = read(chunks, "chunks")
    if cfg.uses_critic and critic is None:
        raise ValueError("algorithm ac2 needs a critic checkpoint for score_chunks")
    for c in rows:
        if c["prefix_id"] not in prefix_by_id:
            raise ValueError(f"{chunks}: chunk {c['chunk_id']} refers to prefix {c['prefix_id']}, absent from {prefixes}")

    tok = store.tokenizer(actor, kind="actor")  # rewards are graded on the decoded text
    responses = [prefix_by_id[c["prefix_id"]]["prefix_token_ids"] + c["token_ids"] for c in rows]
    grades = grade_finished(
        cfg, probs, [(c, response) for c, response in zip(rows, responses) if c["finish_reason"] != "length"], tok
    )
    scored, pairs, requests = [], [], []
    for c, response in zip(rows, responses):
        p = prefix_by_id[c["prefix_id"]]
        scored.append(_scored_row(cfg, iteration, c, p, response, grades.get(c["chunk_id"])))
        if cfg.uses_critic:
            requests += _critic_requests(cfg, iteration, len(scored) - 1, scored[-1], p, pairs)

    if requests and cfg.critic.kind == "learned":
        from ac2_core.stages.critic_io import CriticInputs

        builder = CriticInputs(cfg, tok, probs, read(replay, "replay"))
        ckpt = store.load(critic, kind="critic")
        one_by_one = requests
        if cfg.critic.dense and cfg.critic.scoring_backend == "hf":
            one_by_one = _apply_critic_along(cfg, ckpt, builder, requests, scored, pairs)  # returns what it could not
        if one_by_one:
            inputs = [builder.build(r.problem_id, r.ref, r.state) for r in one_by_one]
            _apply_critic(cfg, ckpt, critic, one_by_one, inputs, scored, pairs)
        _apply_oracle_on_groups(cfg, iteration, probs, tok, prefix_by_id, requests, scored, pairs)
    elif requests and cfg.critic.kind == "oracle":
        _apply_oracle(probs, tok, requests, scored, pairs)
    elif requests:
        _apply_blind(requests, scored, pairs)
    scored_hash = write(cfg, STAGE, out_scored_chunks, scored, "scored_chunks")
    write(cfg, STAGE, out_critic_pairs, pairs, "critic_pairs")
    rewards = [s["reward"] for s in scored if s["finished"] and s["reward"] is not None]
    return ScoreStats(
        chunks=len(scored),
        finished=sum(s["finished"] for s in scored),
        ungraded=sum(s["target_source"] == "ungraded" for s in scored),
        mean_reward=sum(rewards) / len(rewards) if rewards else float("nan"),
        critic_pairs=len(pairs),
        critic_inputs=len({(r.problem_id, r.ref, tuple(r.state)) for r in requests}),
        critic_flops=sum(s["critic_flops"] for s in scored),
        scored_chunks_hash=scored_hash,
    )


def _scored_row(cfg: AC2Config, iteration: int, c: dict, p: dict, response: list[int], grade: Grade | None) -> dict:
    """A chunk's scored_chunks row before the critic: its reward (if finished and graded) is its target."""
    finished = c["finish_reason"] != "length"
    reward = grade.reward if grade is not None else None
    return {
        "run_id": cfg.run_id,
        "iteration": iteration,
        "policy_version": c["policy_version"],
        "chunk_id": c["chunk_id"],
        "prefix_id": c["prefix_id"],
        "problem_id": c["problem_id"],
        "mode": p["mode"],
        "source_trajectory_id": p["source_trajectory_id"],
        "ref_trajectory_id": p["ref_trajectory_id"],
        "baseline_rate": p["baseline_rate"],
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


def _critic_requests(cfg: AC2Config, iteration: int, i: int, row: dict, p: dict, pairs: list[dict]) -> list[CriticRequest]:
    """What the critic scores for scored row ``i``: V at its start; V at its end if unfinished; if it
    finished with a reward, V at each chunk boundary of the answer (appending those pairs to ``pairs``)."""
    pid, ref, response = row["problem_id"], p["ref_trajectory_id"], row["response_token_ids"]
    requests = [CriticRequest(i, pid, ref, p["prefix_token_ids"], "value_start")]
    if not row["finished"]:
        return [*requests, CriticRequest(i, pid, ref, response, "value_end")]
    if row["reward"] is None:  # ungraded: no outcome to pair predictions with
        return requests
    for cut in cut_points(len(response), cfg.rollout.chunk_tokens, finished=True):
        pairs.append(
            {
                "run_id": cfg.run_id,
                "iteration": iteration,
                "policy_version": row["policy_version"],
                "pair_id": f"{row['chunk_id']}-c{cut}",
                "problem_id": pid,
                "trajectory_id": row["chunk_id"],
                "cut": cut,
                "ref_trajectory_id": ref,
                "prediction": None,
                "outcome": row["reward"],
                "critic_tokens": 0,
            }
        )
        requests.append(CriticRequest(i, pid, ref, response[:cut], "prediction", pair=len(pairs) - 1))
    return requests


def _put(r: CriticRequest, value: float, scored: list[dict], pairs: list[dict]) -> None:
    match r.field:
        case "prediction":
            pairs[r.pair]["prediction"] = value
        case "value_end":
            scored[r.row]["value_end"] = scored[r.row]["target"] = value
        case "value_start":
            scored[r.row]["value_start"] = value


def _apply_oracle(probs: Problems, tok, requests: list[CriticRequest], scored: list[dict], pairs: list[dict]) -> None:
    """The diagnostic oracle (``critic.kind: oracle``): its depth rates come from this
    iteration's finished, graded full-mode answers; it costs no critic FLOPs."""
    from ac2_core.stages.oracle_critic import oracle_value, whole_answer_rates

    depths, rates = whole_answer_rates(
        scored, lambda pid: probs[pid]["solution"], lambda ids: tok.decode(ids, skip_special_tokens=True)
    )
    texts: dict[tuple, str] = {}
    for r in requests:
        key = tuple(r.state)
        if key not in texts:
            texts[key] = tok.decode(r.state, skip_special_tokens=True)
        _put(r, oracle_value(probs[r.problem_id]["solution"], texts[key], depths, rates), scored, pairs)


def _apply_oracle_on_groups(
    cfg: AC2Config, iteration: int, probs: Problems, tok, prefix_by_id: dict, requests: list[CriticRequest], scored, pairs
) -> None:
    """The diagnostic hybrids (``critic.oracle_groups``, ``critic.oracle_from_iteration``): the
    chunk groups they name take the oracle's values at their states in place of the learned
    critic's. The learned predictions on whole answers' cuts (``critic_pairs``) stay, so the
    critic trains, gates and is measured as it would without the hybrid."""
    from ac2_core.stages.oracle_critic import chunk_group_class

    every = cfg.critic.oracle_from_iteration is not None and iteration >= cfg.critic.oracle_from_iteration
    if not (every or cfg.critic.oracle_groups):
        return
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(scored):
        if s["mode"] == "chunk":
            groups.setdefault(s["prefix_id"], []).append(i)
    chosen = set()
    for prefix_id, rows in groups.items():
        continuations = [(decode(scored[i]["response_token_ids"]), scored[i]["finished"], scored[i]["reward"]) for i in rows]
        kind = chunk_group_class(
            probs[scored[rows[0]]["problem_id"]]["solution"],
            decode(prefix_by_id[prefix_id]["prefix_token_ids"]),
            continuations,
            cfg.replay.success_threshold,
        )
        if every or kind in cfg.critic.oracle_groups:
            chosen.update(rows)
    if chosen:
        _apply_oracle(probs, tok, [r for r in requests if r.row in chosen and r.field != "prediction"], scored, pairs)


def _apply_blind(requests: list[CriticRequest], scored: list[dict], pairs: list[dict]) -> None:
    """The diagnostic blind critic (``critic.kind: blind``): one value for every state, this
    iteration's success rate of its finished, graded full-mode answers (add-one smoothed). An
    unfinished chunk then has no advantage within its group; only a chunk that finished can
    differ from its siblings, by its reward. It costs no critic FLOPs."""
    from ac2_core.stages.oracle_critic import whole_answers

    rewards = [s["reward"] for s in whole_answers(scored)]
    value = (sum(rewards) + 1.0) / (len(rewards) + 2.0)
    for r in requests:
        _put(r, value, scored, pairs)


def _apply_critic_along(cfg: AC2Config, ckpt, builder, requests: list[CriticRequest], scored, pairs) -> list[CriticRequest]:
    """Score every request of a chunk in one pass over its whole response (``critic.dense``):
    each state asked for is a prefix of the response, and the causal critic's value at the
    state's last token is the value of that state alone. Returns the requests of chunks whose
    input had to be cut (``max_input_tokens``): those are scored one state at a time."""
    from ac2_core.generation.scoring import score_positions
    from ac2_core.math import attention_width, count_non_embedding_params, critic_flops

    by_row: dict[int, list[CriticRequest]] = {}
    for r in requests:
        by_row.setdefault(r.row, []).append(r)
    passes, left = [], []
    for row, rs in by_row.items():
        along = builder.build_along(rs[0].problem_id, rs[0].ref, scored[row]["response_token_ids"])
        if along is None:
            left += rs
            continue
        x, head = along
        passes.append((row, rs, x, [head + len(r.state) for r in rs]))
    values = score_positions(
        ckpt.model,
        [(x, positions) for _, _, x, positions in passes],
        pad_id=ckpt.tokenizer.pad_token_id,
        batch_size=cfg.critic.score_batch_size,
    )
    n_params = count_non_embedding_params(ckpt.model)
    n_layers, d_attn = attention_width(ckpt.model.backbone.config)
    charged = set()
    for (row, rs, x, positions), vs in zip(passes, values):
        for r, position, v in zip(rs, positions, vs):
            _put(r, v, scored, pairs)
            if r.field == "prediction":
                pairs[r.pair]["critic_tokens"] = position + 1
        if tuple(x) not in charged:  # identical responses are run once; charge the first
            charged.add(tuple(x))
            scored[row]["critic_flops"] += critic_flops(n_params=n_params, n_layers=n_layers, d_attn=d_attn, n_tokens=len(x))
    return left


def _apply_critic(cfg: AC2Config, ckpt, critic_uri: str, requests: list[CriticRequest], inputs, scored, pairs) -> None:
    from ac2_core.generation import sharded
    from ac2_core.math import attention_width, count_non_embedding_params, critic_flops

    match cfg.critic.scoring_backend:
        case "hf" | "vllm" if sharded.wanted(cfg, "score"):  # generation.num_processes processes
            values = sharded.score(cfg, critic_uri, inputs, pad_id=ckpt.tokenizer.pad_token_id)
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
    for r, x, v in zip(requests, inputs, values):
        _put(r, v, scored, pairs)
        if r.field == "prediction":
            pairs[r.pair]["critic_tokens"] = len(x)
        if tuple(x) not in charged:  # identical inputs are computed once; charge the first row
            charged.add(tuple(x))
            scored[r.row]["critic_flops"] += critic_flops(n_params=n_params, n_layers=n_layers, d_attn=d_attn, n_tokens=len(x))
