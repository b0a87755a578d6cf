"""The Arrow schema of every artifact table, declared once.

Tables are checked against these on write and on read (``storage.write_table`` /
``storage.read_table``). Bump ``SCHEMA_VERSION`` when a schema changes; manifests
carry it, so an old artifact is refused with a message instead of misread.
"""

from __future__ import annotations

import pyarrow as pa

# 2: problems.metadata; ungraded chunks (grade_error, nullable targets, metrics counts)
# 3: metrics.critic_auc and metrics.full_rollout_tokens
# 4: metrics.algorithm, config_hash and the training statistics; the samples table
# 5: prefixes.baseline_rate and scored_chunks.baseline_rate (a one-answer refresh's baseline)
# 6: advantages.token_advantages (the critic's credit along a whole answer)
SCHEMA_VERSION = 6

_tokens = pa.list_(pa.int32())

# Columns every per-iteration table carries (docs/design.md section 3).
_run = [
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("iteration", pa.int32(), nullable=False),
]
_versioned = [*_run, pa.field("policy_version", pa.int32(), nullable=False)]

PROBLEMS = pa.schema(
    [
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),  # train | val
        pa.field("task", pa.string(), nullable=False),  # which grader judges it
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("answer", pa.string()),  # final answer the grader checks, if the task has one
        pa.field("solution", pa.string()),  # a known-good worked solution (SFT warm start), if any
        pa.field("metadata", pa.string()),  # JSON: grading material (rubrics, guidelines, source), if any
    ]
)

REPLAY = pa.schema(
    [
        *_run,  # iteration the trajectory was produced in
        pa.field("policy_version", pa.int32(), nullable=False),
        pa.field("trajectory_id", pa.string(), nullable=False),
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("source_trajectory_id", pa.string()),  # the trajectory its prefix was cut from
        pa.field("token_ids", _tokens, nullable=False),  # response tokens so far (prompt excluded)
        pa.field("finished", pa.bool_(), nullable=False),
        pa.field("reward", pa.float32()),  # terminal reward, when finished
    ]
)

PREFIXES = pa.schema(
    [
        *_versioned,
        pa.field("prefix_id", pa.string(), nullable=False),
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("mode", pa.string(), nullable=False),  # full | chunk
        pa.field("source_trajectory_id", pa.string()),  # replayed trajectory it was cut from (chunk mode)
        pa.field("prefix_token_ids", _tokens, nullable=False),
        pa.field("budget", pa.int32(), nullable=False),  # most tokens a continuation may add
        pa.field("ref_trajectory_id", pa.string()),  # reference solution for the critic, if any
        pa.field("cut_scan_tokens", pa.int32()),  # tokens the actor read to place an uncertain or entropy cut; null at a boundary
        # a full-mode prefix trained against its problem's replayed success rate (advantage.full_groups:
        # replay_rate): that rate; null for every other prefix
        pa.field("baseline_rate", pa.float32()),
    ]
)

CHUNKS = pa.schema(
    [
        *_versioned,
        pa.field("chunk_id", pa.string(), nullable=False),
        pa.field("prefix_id", pa.string(), nullable=False),
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("context_tokens", pa.int32(), nullable=False),  # prompt + prefix length it was decoded after
        pa.field("token_ids", _tokens, nullable=False),
        pa.field("logprobs", pa.list_(pa.float32()), nullable=False),  # behaviour log-probs, one per token
        pa.field("finish_reason", pa.string(), nullable=False),  # stop | length | truncated
    ]
)

SCORED_CHUNKS = pa.schema(
    [
        *_versioned,
        pa.field("chunk_id", pa.string(), nullable=False),
        pa.field("prefix_id", pa.string(), nullable=False),
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("mode", pa.string(), nullable=False),
        pa.field("source_trajectory_id", pa.string()),
        pa.field("ref_trajectory_id", pa.string()),
        pa.field("baseline_rate", pa.float32()),  # its prefix's baseline_rate
        pa.field("response_token_ids", _tokens, nullable=False),  # prefix + chunk: the trajectory so far
        pa.field("finished", pa.bool_(), nullable=False),
        pa.field("reward", pa.float32()),  # grader's reward, when finished
        pa.field("value_start", pa.float32()),  # V(x, s; ref)
        pa.field("value_end", pa.float32()),  # V(x, s+c; ref), when not finished
        pa.field("target", pa.float32()),  # y(c); null when ungraded
        pa.field("target_source", pa.string(), nullable=False),  # reward | critic | ungraded
        pa.field("grade_error", pa.string()),  # why a finished chunk has no reward (judge failed); else null
        pa.field("critic_flops", pa.float64(), nullable=False),  # critic forward work spent on this row and its pairs
    ]
)

CRITIC_PAIRS = pa.schema(
    [
        *_versioned,
        pa.field("pair_id", pa.string(), nullable=False),
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("trajectory_id", pa.string(), nullable=False),  # a finished chunk's trajectory
        pa.field("cut", pa.int32(), nullable=False),  # state = response_token_ids[:cut]
        pa.field("ref_trajectory_id", pa.string()),
        pa.field("prediction", pa.float32(), nullable=False),  # V before the critic trained on it
        pa.field("outcome", pa.float32(), nullable=False),
        pa.field("critic_tokens", pa.int32(), nullable=False),  # length of the critic input for this state
    ]
)

READINESS = pa.schema(
    [
        *_run,
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("predictions", pa.list_(pa.float32()), nullable=False),  # sliding window, oldest first
        pa.field("outcomes", pa.list_(pa.float32()), nullable=False),
        pa.field("error", pa.float32()),  # readiness metric on the window; null when undefined
        pa.field("ready", pa.bool_(), nullable=False),
    ]
)

ADVANTAGES = pa.schema(
    [
        *_versioned,
        pa.field("chunk_id", pa.string(), nullable=False),
        pa.field("prefix_id", pa.string(), nullable=False),
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("target", pa.float32()),  # null for an ungraded chunk (weight 0)
        pa.field("baseline", pa.float32(), nullable=False),
        pa.field("advantage", pa.float32(), nullable=False),
        pa.field("weight", pa.float32(), nullable=False),  # 0 where the gate masks a critic target, or ungraded
        # one advantage per token of the chunk where they differ (advantage.full_credit: critic); null: ``advantage``
        pa.field("token_advantages", pa.list_(pa.float32())),
    ]
)

METRICS = pa.schema(
    [
        *_versioned,
        pa.field("algorithm", pa.string(), nullable=False),  # ac2 | grpo: what made the row
        # AC2Config.run_hash of the run that made the row (the bootstrap's row: its bootstrap_hash)
        pa.field("config_hash", pa.string(), nullable=False),
        pa.field("val_score", pa.float32()),  # null on iterations without evaluation
        pa.field("readiness_share", pa.float32(), nullable=False),  # ready problems / problems with a window
        pa.field("chunk_groups", pa.int32(), nullable=False),
        pa.field("full_groups", pa.int32(), nullable=False),
        pa.field("mean_train_reward", pa.float32()),  # over graded finished chunks of this iteration
        pa.field("ungraded_chunks", pa.int32(), nullable=False),  # finished chunks the grader could not score
        pa.field("ungraded_val", pa.int32()),  # validation answers the grader could not score; null without evaluation
        pa.field("critic_error", pa.float32()),  # binned calibration error over this iteration's pairs
        pa.field("critic_auc", pa.float32()),  # AUC of this iteration's pairs, scored before the critic saw them
        pa.field("full_rollout_tokens", pa.float64(), nullable=False),  # full rollouts of the same problems would decode this
        # training statistics, null where the update trained nothing; means over the iteration's optimizer steps
        pa.field("actor_loss", pa.float32()),  # PPO-clip loss (plus KL penalty)
        pa.field("clip_fraction", pa.float32()),  # share of tokens where the clipped branch was active
        pa.field("grad_norm", pa.float32()),  # actor gradient norm before clipping
        pa.field("kl", pa.float32()),  # k3 estimate of KL(behaviour || updated policy) on the trained tokens
        pa.field("entropy", pa.float32()),  # mean -log p of the decoded tokens: the sampling policy's entropy, estimated
        pa.field("critic_loss", pa.float32()),  # weighted BCE of the critic update
        pa.field("decode_tokens", pa.int64(), nullable=False),
        pa.field("decode_flops", pa.float64(), nullable=False),
        pa.field("prefill_flops", pa.float64(), nullable=False),
        pa.field("critic_flops", pa.float64(), nullable=False),
        pa.field("train_flops", pa.float64(), nullable=False),
        pa.field("cum_decode_tokens", pa.int64(), nullable=False),
        pa.field("cum_decode_flops", pa.float64(), nullable=False),
        pa.field("cum_prefill_flops", pa.float64(), nullable=False),
        pa.field("cum_critic_flops", pa.float64(), nullable=False),
        pa.field("cum_train_flops", pa.float64(), nullable=False),
    ]
)

# a few of an iteration's decoded chunks, for people to read (evaluate; the KFP report shows them)
SAMPLES = pa.schema(
    [
        *_versioned,
        pa.field("chunk_id", pa.string(), nullable=False),
        pa.field("problem_id", pa.string(), nullable=False),
        pa.field("mode", pa.string(), nullable=False),  # full | chunk
        pa.field("prompt", pa.string(), nullable=False),
        pa.field("answer", pa.string(), nullable=False),  # the trajectory so far (prefix + chunk), decoded
        pa.field("finished", pa.bool_(), nullable=False),
        pa.field("reward", pa.float32()),  # grader's reward, when finished and graded
        pa.field("target", pa.float32()),  # y(c)
        pa.field("target_source", pa.string(), nullable=False),  # reward | critic | ungraded
    ]
)

TABLES: dict[str, pa.Schema] = {
    "problems": PROBLEMS,
    "replay": REPLAY,
    "prefixes": PREFIXES,
    "chunks": CHUNKS,
    "scored_chunks": SCORED_CHUNKS,
    "critic_pairs": CRITIC_PAIRS,
    "readiness": READINESS,
    "advantages": ADVANTAGES,
    "metrics": METRICS,
    "samples": SAMPLES,
}


def schema_for(table: str) -> pa.Schema:
    try:
        return TABLES[table]
    except KeyError:
        raise ValueError(f"unknown table {table!r}; known tables: {', '.join(TABLES)}") from None
