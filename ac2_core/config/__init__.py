"""One typed config tree for a whole ac2 run.

Every knob of the algorithm (docs/design.md section 2) lives here, documented in one
line. The tree is frozen and forbids unknown keys, so a typo or an out-of-range value
fails before any model loads, with a message that names the field
(``rollout.group_size``). The config travels to every stage as one JSON document
(``AC2Config.model_dump_json``). The sections shared by all (``base``), the Kubernetes
settings of the ``cluster`` section (``cluster``) and how a stage's work spreads over
processes and the GPUs its task gets (``parallel``) have modules of their own.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from ac2_core.config.base import ConfigError, Section, plain_url
from ac2_core.config.cluster import ClusterConfig
from ac2_core.config.parallel import check_gpu_fit


class TinyModelConfig(Section):
    """A Qwen3-architecture model built on the spot (tests and the CPU default)."""

    hidden_size: int = Field(128, ge=32, description="model width")
    num_layers: int = Field(4, ge=1, description="transformer blocks")
    num_heads: int = Field(4, ge=1, description="query heads")
    num_kv_heads: int = Field(2, ge=1, description="key/value heads (GQA)")
    head_dim: int = Field(32, ge=32, description="per-head width; vLLM's CPU attention needs >= 32")
    intermediate_size: int = Field(384, ge=8, description="MLP width")
    max_position_embeddings: int = Field(512, ge=64, description="longest sequence the model accepts")

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        return self


class ModelConfig(Section):
    source: Literal["tiny", "pretrained"] = Field("tiny", description="build a tiny model, or load an HF directory")
    path: str | None = Field(None, description="local path or URI of an HF model directory (source=pretrained)")
    tiny: TinyModelConfig = TinyModelConfig()
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="parameter dtype; float32 on CPU")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where models run: auto (cuda when this machine has it, else cpu), cpu, or cuda (an error without it)"
    )
    threads: int | None = Field(
        None, ge=1, description="torch CPU threads per process; unset: OMP_NUM_THREADS, else the CPUs it may use (threads.py)"
    )
    trust_remote_code: bool = Field(False, description="allow model code from the checkpoint; off unless asked for")

    @model_validator(mode="after")
    def _path_for_pretrained(self) -> ModelConfig:
        if self.source == "pretrained" and not self.path:
            raise ValueError("path is required when source is pretrained")
        return self


class TaskColumnsConfig(Section):
    """Which column of the problem file holds each field; unset: the default of ``task.shape``."""

    problem_id: str | None = Field(None, description="stable problem id; unset: derived from the problem text")
    problem: str | None = Field(None, description="problem statement")
    answer: str | None = Field(None, description="final answer (shape final_answer)")
    solution: str | None = Field(None, description="reference solution or proof")
    rubrics: str | None = Field(None, description="grading checkpoints, a string or a list of strings (shape fineproofs)")
    guidelines: str | None = Field(None, description="grading guidelines text (shape proofbench)")
    source: str | None = Field(None, description="where the problem comes from (kept as metadata)")
    reward_mean: str | None = Field(None, description="mean reward of earlier samples, for the difficulty filter")


class JudgeConfig(Section):
    """An OpenAI-compatible chat endpoint that grades proofs against a rubric (``tasks.judge``).

    The API key is never part of the config: ``api_key_env`` names the environment
    variable that holds it (e.g. from a Kubernetes secret).
    """

    base_url: str = Field(..., description="endpoint root, e.g. http://127.0.0.1:8000/v1; /chat/completions is appended")
    model: str = Field(..., min_length=1, description="model name sent with each request (vllm serve: the served model name)")
    api_key_env: str | None = Field(None, description="name of the environment variable holding the API key; unset: no key")
    temperature: float = Field(0.0, ge=0, le=2, description="judge sampling temperature")
    max_tokens: int = Field(2048, ge=16, description="longest judge reply")
    timeout_seconds: float = Field(120.0, gt=0, le=3600, description="per-request socket timeout (connect, and each read)")
    max_attempts: int = Field(3, ge=1, le=20, description="tries of one judgement on timeouts, connection errors, 429 and 5xx")
    backoff_seconds: float = Field(1.0, ge=0, le=60, description="wait before the first retry; doubled for each further one")
    max_concurrency: int = Field(8, ge=1, le=256, description="judge requests in flight at once")

    @field_validator("base_url")
    @classmethod
    def _plain_http_url(cls, v: str) -> str:
        return plain_url(v, "base_url").rstrip("/")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"api_key_env must be the NAME of an environment variable (e.g. JUDGE_API_KEY), found {v!r}")
        return v


class TaskConfig(Section):
    name: Literal["arith", "math", "proof"] = Field(
        "arith", description="the grader: arith (built-in problems), math (final answers, math-verify), proof (rubric judge)"
    )
    data: str | None = Field(None, description="local path or URI of the problem file (math and proof)")
    n_terms: int = Field(6, ge=2, le=32, description="numbers to add, one written step each")
    max_value: int = Field(99, ge=1, description="terms are drawn from 0..max_value")
    train_size: int = Field(4096, ge=1, description="training problems generated")
    val_size: int = Field(128, ge=1, description="held-out validation problems")
    seed: int = Field(1234, description="seed of the problem generator, independent of the run seed")
    format: Literal["auto", "parquet", "jsonl", "hf_dataset"] = Field(
        "auto", description="file format of data; auto: from the suffix, or a datasets.save_to_disk directory"
    )
    shape: Literal["fineproofs", "proofbench", "final_answer"] = Field(
        "fineproofs", description="layout of data: FineProofs-RL, IMO-ProofBench style, or problems with a final answer"
    )
    columns: TaskColumnsConfig = TaskColumnsConfig()
    val_fraction: float = Field(0.05, ge=0, lt=1, description="share of loaded problems held out (by a seeded hash of the text)")
    min_reward_mean: float | None = Field(None, ge=0, le=1, description="drop loaded problems whose reward_mean is below this")
    max_reward_mean: float | None = Field(None, ge=0, le=1, description="drop loaded problems whose reward_mean is above this")
    val_data: str | None = Field(
        None, description="a separate validation file (e.g. IMO-ProofBench); set: every problem of data trains"
    )
    val_shape: Literal["fineproofs", "proofbench", "final_answer"] = Field("proofbench", description="layout of val_data")
    val_columns: TaskColumnsConfig = Field(TaskColumnsConfig(), description="columns of val_data (task.columns are data's)")
    judge: JudgeConfig | None = Field(None, description="the rubric judge's endpoint; required by task proof, unused otherwise")

    @model_validator(mode="after")
    def _data_for_loaded_tasks(self) -> TaskConfig:
        if self.name != "arith" and not self.data:
            raise ValueError(f"data is required for task {self.name}: a path or URI of a Parquet, JSONL or datasets file")
        return self

    @model_validator(mode="after")
    def _shape_fits_the_grader(self) -> TaskConfig:
        if self.name == "math" and self.shape != "final_answer":
            raise ValueError(f"shape must be final_answer for task math (its grader compares final answers), found {self.shape}")
        if self.name == "proof" and self.shape not in ("fineproofs", "proofbench"):
            raise ValueError(
                f"shape must be fineproofs or proofbench for task proof (the judge needs rubrics), found {self.shape}"
            )
        return self

    @model_validator(mode="after")
    def _val_data_fits(self) -> TaskConfig:
        if self.val_data is None:
            return self
        if self.name == "arith":
            raise ValueError("val_data is for tasks that load data (math, proof), not arith")
        if self.val_fraction != 0:
            raise ValueError(f"val_fraction must be 0 when val_data is set (validation comes from it), found {self.val_fraction}")
        if (self.name == "math") != (self.val_shape == "final_answer"):
            raise ValueError(f"val_shape {self.val_shape} does not fit task {self.name} (math: final_answer; proof: the others)")
        return self

    @model_validator(mode="after")
    def _judge_only_for_proofs(self) -> TaskConfig:
        if self.name == "proof" and self.judge is None:
            raise ValueError("judge is required for task proof: set task.judge.base_url and task.judge.model")
        if self.name != "proof" and self.judge is not None:
            raise ValueError(f"judge is used only by task proof; remove it for task {self.name}")
        return self

    @model_validator(mode="after")
    def _reward_bounds_ordered(self) -> TaskConfig:
        lo, hi = self.min_reward_mean, self.max_reward_mean
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(f"min_reward_mean ({lo}) must not exceed max_reward_mean ({hi})")
        return self


class WarmStartConfig(Section):
    """Supervised warm start on reference solutions, before RL."""

    added_later = ("misconception_rate", "misconception_digits")  # left out of the dump at their defaults (Section)

    max_steps: int = Field(600, ge=0, description="SFT steps (all of them, unless target_score stops earlier); 0 skips it")
    batch_size: int = Field(64, ge=1, description="sequences per SFT step")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate")
    min_lr_ratio: float = Field(1.0, gt=0, le=1, description="cosine decay of lr to this share of it by max_steps; 1: constant")
    slip_rate: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="arith: share of the demonstrations' steps written with one digit wrong (the total carried on);"
        " imperfect demonstrations, as real SFT data has, leave the policy slips that reward can remove; 0: exact",
    )
    misconception_rate: float = Field(
        0.0,
        ge=0,
        le=1,
        description="arith: share of the problems whose demonstrations drop the carry out of the ones place in every"
        " step whose term ends in one of misconception_digits (a rule the policy learns to write without surprise,"
        " which only a reference exposes); 0: none",
    )
    misconception_digits: tuple[int, ...] = Field(
        (9,),
        min_length=1,
        description="arith: the ones digits of a term that trigger the misconception (each 1-9, distinct): more of"
        " them put more forks in an answer",
    )
    eval_every: int = Field(50, ge=1, description="steps between evaluations of the warm-start candidate")
    eval_problems: int = Field(64, ge=1, description="problems per warm-start evaluation (sampled decoding)")
    target_score: float | None = Field(
        None, gt=0, le=1, description="stop at the first evaluation whose sampled score reaches this; unset: run max_steps"
    )

    @field_validator("misconception_digits")
    @classmethod
    def _digits_that_can_carry(cls, digits: tuple[int, ...]) -> tuple[int, ...]:
        if any(not 1 <= d <= 9 for d in digits) or len(set(digits)) != len(digits):
            raise ValueError(
                f"misconception_digits must be distinct ones digits from 1 to 9 (a 0 never carries), found {list(digits)}"
            )
        return digits


class RolloutConfig(Section):
    added_later = ("full_group_size",)  # left out of the dump at their defaults (Section)
    problems_per_iteration: int = Field(16, ge=1, description="problems drawn each iteration")
    group_size: int = Field(8, ge=2, description="G: samples per prefix")
    chunk_tokens: int = Field(16, ge=1, description="L: token budget of one action chunk")
    max_response_tokens: int = Field(96, ge=1, description="budget of a full answer (full mode)")
    prefixes_per_problem: int = Field(2, ge=1, description="k: prefixes per ready problem in chunk mode")
    prefix_source: Literal["any", "success", "success_only"] = Field(
        "any",
        description="trajectories chunk-mode prefixes are cut from: any replayed one; only those that succeeded "
        "(replay.success_threshold) when the problem has any (success); or only those, a problem without one "
        "planned in full mode, which gives it a fresh answer (success_only: no chunk group starts from a failure, "
        "where the critic has no reference to judge by)",
    )
    prefix_cut: Literal["boundary", "uncertain", "entropy"] = Field(
        "boundary",
        description="where a chunk-mode prefix ends: at a chunk boundary of its trajectory; right before the token "
        "the current actor finds least likely there (uncertain); or right before the position where the current "
        "actor's next-token distribution has the most entropy (entropy: a forking token, whichever way the "
        "trajectory went). The last two cost one forward pass over the trajectory, counted as prefill",
    )
    prefix_max_age: int | None = Field(
        None,
        ge=1,
        description="cut chunk-mode prefixes only from whole answers (not stitched continuations) sampled within the "
        "last this many iterations; a problem without one is rolled out in full, refreshing its replay; unset: any "
        "replayed trajectory, however old",
    )
    full_group_size: int | None = Field(
        None,
        ge=1,
        description="AC2 once chunk mode is on (after critic.warmup_iterations): samples per full-mode group, fewer "
        "than group_size to refresh a problem's states for less decoding; unset: group_size. GRPO ignores it, unless "
        "advantage.full_groups is replay_rate: then it applies to both algorithms, only to problems with a graded "
        "whole answer in their replay (and 1 needs it)",
    )
    probe_fraction: float = Field(0.25, ge=0, le=1, description="share of ready problems kept in full mode as readiness probes")
    revisit_fraction: float = Field(
        0.5, ge=0, le=1, description="share of each iteration's problems drawn from problems with replay"
    )
    temperature: float = Field(1.0, gt=0, description="sampling temperature (behaviour log-probs are taken under it)")
    skip_solved_groups: int = Field(
        0, ge=0, description="skip problems whose last this many full groups were all solved (0: never; a GRPO baseline)"
    )

    @model_validator(mode="after")
    def _chunk_fits(self) -> RolloutConfig:
        if self.chunk_tokens > self.max_response_tokens:
            raise ValueError(
                f"chunk_tokens ({self.chunk_tokens}) must not exceed max_response_tokens ({self.max_response_tokens})"
            )
        return self

    @model_validator(mode="after")
    def _full_groups_smaller(self) -> RolloutConfig:
        if self.full_group_size is not None and self.full_group_size > self.group_size:
            raise ValueError(f"full_group_size ({self.full_group_size}) must not exceed group_size ({self.group_size})")
        return self


class ReplayConfig(Section):
    added_later = ("whole_answers_first", "success_repeats")  # left out of the dump at their defaults (Section)
    max_trajectories_per_problem: int = Field(16, ge=1, description="bound on the replay kept per problem (newest kept)")
    whole_answers_first: bool = Field(
        False,
        description="keep a problem's whole answers ahead of continuations stitched onto a prefix (newest first within "
        "each); off: the newest trajectories, whatever their kind",
    )
    success_threshold: float = Field(
        1.0, gt=0, le=1, description="reward at which a finished trajectory can serve as a reference solution"
    )
    success_repeats: int = Field(
        1,
        ge=1,
        description="AC2: a success is a chunk-mode prefix source or a reference only once this many of its problem's"
        " whole answers in replay wrote exactly its tokens, and the reference is the success the most of them wrote"
        " (the latest among equals). For tasks with one canonical answer text (arith): a success that came back by a"
        " second error, cancelling the first, is seldom written twice (docs/algorithm.md, research log section 27)."
        " 1: every success, the latest as reference",
    )


class ReadinessConfig(Section):
    metric: Literal["discriminating", "binned_calibration", "brier_ratio", "auc"] = Field(
        "discriminating",
        description="discriminating: beats the problem's base rate (AUC >= min_auc, Brier skill > 0) and is calibrated"
        " (binned error <= max_error); or one number against max_error: binned_calibration, brier_ratio, auc (1 - AUC)",
    )
    min_auc: float = Field(0.7, ge=0.5, le=1, description="discriminating: the smallest AUC on a problem's window")
    window: int = Field(32, ge=1, description="(prediction, outcome) pairs kept per problem")
    min_pairs: int = Field(8, ge=1, description="pairs needed before a problem can be ready")
    max_error: float = Field(0.15, ge=0, description="largest error at which a problem is ready")
    n_bins: int = Field(5, ge=1, description="bins of V for binned calibration")
    require_mixed_outcomes: bool = Field(True, description="ready only if the window holds both successes and failures")
    gate: bool = Field(True, description="false: the critic is trusted on every problem with a window (an ablation)")

    @model_validator(mode="after")
    def _window_holds_min_pairs(self) -> ReadinessConfig:
        if self.min_pairs > self.window:
            raise ValueError(f"min_pairs ({self.min_pairs}) must not exceed window ({self.window})")
        return self


class AdvantageConfig(Section):
    # left out of the dump at their defaults (Section)
    added_later = ("full_credit", "credit_lambda", "credit_scale", "credit_needs_reference")
    baseline: Literal["loo", "mean", "critic"] = Field("loo", description="baseline of chunk advantages within a group")
    scale_std: bool = Field(False, description="divide chunk advantages by the group's std")
    std_floor: float = Field(
        0.0, ge=0, description="with scale_std, divide by at least this (a group of near-equal critic targets stays small)"
    )
    grpo_scale_std: bool = Field(True, description="GRPO: divide by the group's reward std")
    full_groups: Literal["grpo", "chunk", "replay_rate"] = Field(
        "grpo",
        description="AC2's full-mode groups: grpo gives them GRPO's advantage (group-mean baseline, std-scaled when "
        "grpo_scale_std), so a problem outside chunk mode trains exactly as under GRPO; chunk gives them the chunk "
        "advantage (baseline, scale_std); replay_rate, past critic.warmup_iterations and for GRPO alike, measures a "
        "revisited problem's answers against its success rate b over the graded whole answers of its replay "
        "(A = R - b, divided by sqrt(b(1-b)) when grpo_scale_std), so a group of one answer has a signal, and gives "
        "GRPO's to a problem without any",
    )
    full_credit: Literal["outcome", "critic"] = Field(
        "outcome",
        description="AC2's finished full-mode answers on problems where the critic is trusted: outcome gives every "
        "token of an answer its one advantage (full_groups); critic gives each chunk_tokens segment the change in "
        "V it brought, V(s_end) - V(s_start) with the reward as the last segment's V(s_end), so the tokens of a "
        "slip carry the loss, not the whole answer. GRPO has no critic and ignores it",
    )
    credit_lambda: float = Field(
        0.0,
        ge=0,
        le=1,
        description="with full_credit critic, the share of each later segment's change in V a segment also takes "
        "(GAE's lambda over segments): 0 gives each segment its own change, 1 gives it R - V(s_start), the reward "
        "against the value where it began, which a critic wrong about where an answer slipped misleads less",
    )
    credit_scale: bool = Field(
        False,
        description="with full_credit critic, divide an answer's credit by the std its outcome advantage was divided "
        "by (grpo_scale_std: its group's reward std, or sqrt(b(1-b)) at its replayed rate), so the tokens of a slip "
        "weigh what the outcome gave them beside the std-scaled chunk rows of the same batch; an answer whose outcome "
        "has no spread to scale by (a group of equal rewards) keeps its credit as it is",
    )
    credit_needs_reference: bool = Field(
        False,
        description="with full_credit critic, credit only the answers whose critic was shown a reference solution; "
        "the others keep their outcome advantage. A learned critic without a reference cannot tell where an "
        "answer slipped, and its flat values put the blame on the answer's last chunk",
    )

    @model_validator(mode="after")
    def _floor_needs_scaling(self) -> AdvantageConfig:
        if self.std_floor > 0 and not self.scale_std:
            raise ValueError(f"std_floor ({self.std_floor}) bounds the std that scale_std divides by; set scale_std true")
        return self

    @model_validator(mode="after")
    def _credit_knobs_need_the_credit(self) -> AdvantageConfig:
        for knob in ("credit_scale", "credit_needs_reference"):
            if getattr(self, knob) and self.full_credit != "critic":
                raise ValueError(f"{knob} shapes the critic's credit along whole answers; set full_credit critic")
        return self


class ActorConfig(Section):
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate of the policy")
    lr_warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear lr warm-up at the start of RL")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    clip_low: float = Field(0.2, gt=0, lt=1, description="PPO ratio clip below 1")
    clip_high: float = Field(0.28, gt=0, description="PPO ratio clip above 1")
    kl_beta: float = Field(0.0, ge=0, description="weight of KL to the initial policy; 0 loads no reference model")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    micro_batch_size: int = Field(64, ge=1, description="sequences per forward/backward")
    steps_per_iteration: int = Field(1, ge=1, description="optimizer steps per iteration (each over the whole batch)")
    loss_aggregation: Literal["token", "row"] = Field(
        "token",
        description="token: every trained token weighs alike (a 16-token chunk weighs 16/100 of a 100-token answer); "
        "row: every trained row weighs alike, its tokens averaged within it",
    )


class CriticConfig(Section):
    # left out of the dump at their defaults (Section)
    added_later = (
        "reference_match", "reference_left_flag", "source_reference", "replay_iterations", "oracle_groups",
        "oracle_from_iteration",
    )  # fmt: skip

    kind: Literal["learned", "oracle", "blind"] = Field(
        "learned",
        description="learned: the critic model; oracle: a DIAGNOSTIC bound for task arith (V = 0 once the partial answer"
        " leaves the canonical solution, else the current policy's success rate from that depth), never for comparisons;"
        " blind: a DIAGNOSTIC that sees nothing of the state (V = this iteration's success rate of whole answers for"
        " every state), the other end of what a critic adds",
    )
    oracle_groups: list[Literal["off_prefix", "mixed", "agreeing"]] = Field(
        [],
        description="a DIAGNOSTIC hybrid for task arith, never for comparisons: the learned critic scores every state"
        " (and is trained, and gates, as usual), but the chunk groups of these classes take the oracle's values."
        " off_prefix: the prefix has already left the worked solution; mixed: the prefix is on it and the"
        " continuations differ in staying on it (a finished one by its reward); agreeing: the prefix is on it and"
        " every continuation stays on, or every one leaves. The three classes hold every chunk group",
    )
    oracle_from_iteration: int | None = Field(
        None,
        ge=1,
        description="a DIAGNOSTIC hybrid for task arith: from this iteration on, every chunk group takes the oracle's"
        " values while the learned critic goes on scoring and training; null: never",
    )
    lr: float = Field(3e-4, gt=0, description="AdamW learning rate of the critic")
    lr_warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear lr warm-up")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")
    steps_per_iteration: int = Field(2, ge=1, description="optimizer steps per iteration on this iteration's pairs")
    batch_size: int = Field(128, ge=1, description="distinct critic inputs drawn for each step")
    micro_batch_size: int = Field(64, ge=1, description="critic inputs per forward/backward")
    td_weight: float = Field(0.0, ge=0, description="weight of bootstrapped V(s+c) targets for unfinished chunks")
    dense: bool = Field(
        False, description="fit V at every token of each finished answer in one pass over it, not only at its chunk boundaries"
    )
    read_steps: int = Field(
        0,
        ge=0,
        description="bootstrap: steps of next-token training that teach the critic's backbone to read a reference (a"
        " demonstration continued under another of the same problem); 0: none, as for a pretrained critic",
    )
    read_lr: float = Field(1e-3, gt=0, description="AdamW learning rate of the reading steps (cosine to a tenth)")
    surprise: bool = Field(
        False,
        description="the value head also reads the partial answer's surprise: the running largest and mean next-token"
        " loss of its tokens under the critic's own next-token head, given the problem and the reference",
    )
    reference_match: bool = Field(
        False,
        description="the value head also reads how the partial answer runs along the reference: the length of the"
        " answer's latest run of tokens the reference holds, and how many written tokens left it (needs use_reference)",
    )
    reference_left_flag: bool = Field(
        False,
        description="the reference match also reads whether any written token has left the reference (1 from the first"
        " one on), beside the log of how many: a head reading the count alone commits slowly a few tokens past a slip"
        " (needs reference_match)",
    )
    source_reference: bool | Literal["always"] = Field(
        False,
        description="true: a chunk-mode prefix whose problem has no other success in replay is shown the success it"
        " was cut from as its reference (its continuations are fresh answers, so none is its own reference); always:"
        " every chunk-mode prefix cut from a success is shown that success, so prefix and reference agree up to the"
        " cut (another success may have taken a route the prefix did not); false: a prefix with no other success has"
        " no reference",
    )
    reference_min_logprob: float | None = Field(
        None,
        le=0,
        description="sample_prefixes weighs each success of a chosen problem by its summed log-probability under the"
        " current actor and shows the critic the most likely one instead of the latest; a success below this is lucky"
        " (the policy seldom writes it again, as when a slip cancels an earlier error): it is neither a reference nor,"
        " under rollout.prefix_source success or success_only, a prefix source. Its tokens are billed as prefill."
        " The sum suits short answers (arith's); null (the default: on the forking toy it did not move the pace,"
        " docs/algorithm.md research log section 22): the latest success, nothing read",
    )
    train_backbone: bool = Field(
        True,
        description="update_critic trains the backbone with the value head; false trains the head alone (the backbone"
        " stays as the bootstrap made it, so a critic with surprise keeps the next-token head it reads in step with it)",
    )
    replay_iterations: int = Field(
        0,
        ge=0,
        description="update_critic also fits the finished answers replay holds from this many iterations before the"
        " current one (each shown the problem's latest other success); 0: this iteration's answers alone",
    )
    warmup_iterations: int = Field(0, ge=0, description="first iterations in full mode only, to fit the critic")
    use_reference: bool = Field(True, description="show the critic a reference solution from replay")
    max_input_tokens: int = Field(384, ge=16, description="critic input cap; the partial answer is cut from its start")
    score_batch_size: int = Field(128, ge=1, description="critic inputs per scoring forward")
    scoring_backend: Literal["hf", "vllm"] = Field(
        "hf",
        description="critic scoring in score_chunks: hf (batched forward) or vllm (a pooling engine on the critic's"
        " backbone; faster per token, but an engine start per process: bench/results/critic_scoring.md)",
    )

    @model_validator(mode="after")
    def _features_score_in_torch(self) -> CriticConfig:
        if self.surprise and self.scoring_backend == "vllm":
            raise ValueError(
                "surprise reads the critic's next-token head, which the vllm pooling engine does not run;"
                " set scoring_backend hf or surprise false"
            )
        if self.reference_match and self.scoring_backend == "vllm":
            raise ValueError(
                "reference_match feeds the value head features the vllm pooling engine does not compute;"
                " set scoring_backend hf or reference_match false"
            )
        if self.reference_match and not self.use_reference:
            raise ValueError("reference_match reads the reference the critic is shown; it needs use_reference true")
        if self.reference_left_flag and not self.reference_match:
            raise ValueError("reference_left_flag is one of the reference-match features; it needs reference_match true")
        if self.source_reference and not self.use_reference:
            raise ValueError("source_reference picks a reference to show the critic; it needs use_reference true")
        if self.reference_min_logprob is not None and not self.use_reference:
            raise ValueError("reference_min_logprob picks a reference to show the critic; it needs use_reference true")
        return self


class GenerationConfig(Section):
    backend: Literal["hf", "vllm"] = Field("hf", description="generation engine: hf (CPU default) or vllm (the ac2[vllm] extra)")
    batch_size: int = Field(256, ge=1, description="sequences decoded together (hf; vllm schedules its own batches)")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vllm: share of GPU memory for weights and KV cache")
    kv_cache_gib: float | None = Field(
        None, gt=0, description="vllm: KV cache size in GiB (needed on CPU; VLLM_CPU_KVCACHE_SPACE overrides it there)"
    )
    enforce_eager: bool = Field(False, description="vllm: no CUDA graphs or compilation (set true on CPU)")
    tensor_parallel_size: int = Field(1, ge=1, description="vllm: GPUs one engine shards the model over")
    max_model_len: int | None = Field(None, ge=16, description="vllm: longest prompt + answer; unset: the model's own limit")
    num_processes: int | None = Field(
        None,
        ge=1,
        description="processes that generate and score critic inputs, each on its own GPUs (hf: batches dealt out;"
        " vllm: an engine each over tensor_parallel_size GPUs); unset: the task's GPUs / tensor_parallel_size, 1 on CPU",
    )
    launch: Literal["auto", "always"] = Field(
        "auto", description="auto: one process works inside the stage's own; always: start even one as a separate process"
    )


class TrainingConfig(Section):
    backend: Literal["torch", "deepspeed"] = Field("torch", description="optimizer loop: torch, or deepspeed (ac2[deepspeed])")
    zero_stage: int = Field(2, ge=0, le=3, description="deepspeed: ZeRO stage 0-3 (partition optimizer state, grads, params)")
    gradient_checkpointing: bool = Field(False, description="deepspeed: recompute activations in backward to save memory")
    num_processes: int | None = Field(
        None, ge=1, description="data-parallel processes of update_actor and update_critic; unset: the task's GPUs, 1 on CPU"
    )
    launch: Literal["auto", "always"] = Field(
        "auto",
        description="auto: one process trains inside the stage's own, more start under torchrun; always: torchrun even for one",
    )

    @model_validator(mode="after")
    def _zero_stage_0_is_one_process(self) -> TrainingConfig:
        if self.backend == "deepspeed" and self.zero_stage == 0 and (self.num_processes or 1) > 1:
            raise ValueError(
                f"num_processes ({self.num_processes}) needs training.zero_stage 1-3 with deepspeed;"
                " for replicated data parallelism use training.backend torch"
            )
        return self


class EvalConfig(Section):
    every: int = Field(1, ge=1, description="evaluate every this many iterations (and at the last)")
    samples_per_problem: int = Field(2, ge=1, description="sampled answers per validation problem")


class RunConfig(Section):
    iterations: int = Field(40, ge=1, description="RL iterations")
    keep_models: int = Field(2, ge=1, description="actor/critic checkpoints kept on disk by local runners (newest)")
    keep_best: bool = Field(True, description="local runners also keep the checkpoints of the best validation score")


class TrackingConfig(Section):
    """Where a local run reports its scalars besides the run folder (``ac2_core.runner.tracking``).

    Not hashed: it says where figures are shown, not what is computed.
    """

    tensorboard: bool = Field(True, description="TensorBoard event files in <run>/tensorboard")
    mlflow_uri: str | None = Field(
        None, description="MLflow tracking URI: sqlite:///mlflow.db, file:./mlruns, http://host:5000; unset: no MLflow"
    )
    mlflow_experiment: str = Field("ac2", min_length=1, description="MLflow experiment the run is logged under")

    @field_validator("mlflow_uri")
    @classmethod
    def _no_credentials(cls, v: str | None) -> str | None:
        if v is not None and v.startswith(("http://", "https://")):
            plain_url(v, "mlflow_uri")
        return v


class StorageConfig(Section):
    """Where artifacts live and how object storage is reached (``ac2_core.storage``).

    Credentials are never part of the config: they come from the environment
    (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, e.g. from a Kubernetes secret).
    """

    endpoint_url: str | None = Field(None, description="S3 endpoint; unset: AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL, then AWS")
    region: str | None = Field(None, description="S3 region; unset: AWS_REGION, AWS_DEFAULT_REGION")
    artifact_root: str | None = Field(None, description="URI or path every artifact must be written under; unset: anywhere")
    max_attempts: int = Field(5, ge=1, le=20, description="tries of one storage request when it fails transiently")
    max_retry_seconds: float = Field(15.0, gt=0, le=600, description="no retry starts later than this after the first try")
    backoff_seconds: float = Field(0.5, ge=0, le=10, description="wait before the first retry; doubled for each further one")
    connect_timeout: float = Field(5.0, gt=0, le=120, description="seconds to open a connection to the endpoint")
    read_timeout: float = Field(10.0, gt=0, le=600, description="seconds without response bytes before a try counts as stalled")
    io_threads: int = Field(8, ge=1, le=64, description="files of a model directory up- or downloaded at once")
    model_cache_entries: int = Field(4, ge=1, description="downloaded checkpoints kept in the local cache (newest used)")

    @model_validator(mode="after")
    def _endpoint_is_a_plain_url(self) -> StorageConfig:
        if self.endpoint_url is not None:
            plain_url(self.endpoint_url, "endpoint_url")
        return self


# storage, cluster, tracking, model.device and model.threads say where artifacts live, where and how
# stages run and where figures are shown, not what they compute: not hashed. (One config serves a
# pipeline's GPU and CPU tasks alike: device auto.) Nor do the process counts: N processes take the
# step one process takes (the same weights up to float rounding).
WHERE = {
    "storage": True,
    "cluster": True,
    "tracking": True,
    "model": {"device", "threads"},
    "training": {"num_processes", "launch"},
    "generation": {"num_processes", "launch"},
}

# What may differ between the runs of one run folder (``ac2_core.runner.record``): where artifacts
# live, stages run and figures are shown (none of it hashed), the run length and what is kept.
SETTLED = {**WHERE, "run": {"iterations", "keep_models", "keep_best"}}


class AC2Config(Section):
    run_id: str = Field("ac2", pattern=r"^[a-z0-9][a-z0-9-]{0,62}$", description="name of the run")
    algorithm: Literal["ac2", "grpo"] = Field("ac2", description="ac2, or the grpo baseline built from the same stages")
    seed: int = Field(0, description="seed of every stochastic stage")
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    rollout: RolloutConfig = RolloutConfig()
    replay: ReplayConfig = ReplayConfig()
    readiness: ReadinessConfig = ReadinessConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    actor: ActorConfig = ActorConfig()
    critic: CriticConfig = CriticConfig()
    generation: GenerationConfig = GenerationConfig()
    training: TrainingConfig = TrainingConfig()
    eval: EvalConfig = EvalConfig()
    run: RunConfig = RunConfig()
    tracking: TrackingConfig = TrackingConfig()
    storage: StorageConfig = StorageConfig()
    cluster: ClusterConfig = ClusterConfig()

    @model_validator(mode="after")
    def _judge_secret_has_a_variable(self) -> AC2Config:
        if self.cluster.judge_secret is not None and (self.task.judge is None or self.task.judge.api_key_env is None):
            raise ValueError(
                "cluster.judge_secret needs task.judge.api_key_env: the name of the env variable the key is given as"
                f" (found task.judge {'unset' if self.task.judge is None else 'without api_key_env'})"
            )
        return self

    @model_validator(mode="after")
    def _slips_only_for_arith(self) -> AC2Config:
        if self.warm_start.slip_rate and self.task.name != "arith":
            raise ValueError(
                f"warm_start.slip_rate writes slips into arith's worked solutions; task {self.task.name} has none (set it to 0)"
            )
        if self.warm_start.misconception_rate and self.task.name != "arith":
            raise ValueError(
                "warm_start.misconception_rate writes a misconception into arith's worked solutions;"
                f" task {self.task.name} has none (set it to 0)"
            )
        if not self.warm_start.misconception_rate and "misconception_digits" in self.warm_start.model_fields_set:
            raise ValueError(
                "warm_start.misconception_digits names the misconception's triggers, but warm_start.misconception_rate"
                " is 0: no problem holds the misconception (set the rate, or leave the digits out)"
            )
        return self

    @model_validator(mode="after")
    def _oracle_only_for_arith(self) -> AC2Config:
        hybrid = [
            key
            for key, on in (
                ("critic.oracle_groups", self.critic.oracle_groups),
                ("critic.oracle_from_iteration", self.critic.oracle_from_iteration is not None),
            )
            if on
        ]
        if (self.critic.kind == "oracle" or hybrid) and self.task.name != "arith":
            what = "critic.kind oracle" if self.critic.kind == "oracle" else hybrid[0]
            raise ValueError(
                f"{what} reads the canonical worked solution, which only task arith has (found task {self.task.name})"
            )
        if hybrid and self.critic.kind != "learned":
            raise ValueError(
                f"{hybrid[0]} gives some chunk groups the oracle's values in place of the learned critic's; critic.kind"
                f" {self.critic.kind} has no learned values to replace (set critic.kind learned, or leave {hybrid[0]} out)"
            )
        return self

    @model_validator(mode="after")
    def _one_rule_picks_the_reference(self) -> AC2Config:
        if self.replay.success_repeats > 1 and self.critic.reference_min_logprob is not None:
            raise ValueError(
                "replay.success_repeats and critic.reference_min_logprob each choose which successes to trust and which"
                " one to show the critic; set one of them (success_repeats 1, or reference_min_logprob null)"
            )
        return self

    @model_validator(mode="after")
    def _one_answer_needs_a_baseline(self) -> AC2Config:
        if self.rollout.full_group_size == 1 and self.advantage.full_groups != "replay_rate":
            raise ValueError(
                "rollout.full_group_size 1 leaves a full-mode answer no group to be measured against; set"
                f" advantage.full_groups replay_rate (found {self.advantage.full_groups})"
            )
        return self

    @model_validator(mode="after")
    def _parallelism_fits_the_cluster(self) -> AC2Config:
        check_gpu_fit(self)
        return self

    @property
    def uses_critic(self) -> bool:
        return self.algorithm == "ac2"

    def chunking_on(self, iteration: int) -> bool:
        """Whether ``iteration`` may roll problems out in chunk mode (AC2 past its critic's warm-up)."""
        return self.uses_critic and iteration > self.critic.warmup_iterations

    @property
    def full_group_samples(self) -> int:
        """Samples of a smaller full-mode group: ``rollout.full_group_size`` when set, else
        ``group_size``. GRPO ignores the field unless its answers are measured against the
        replay rate (``advantage.full_groups: replay_rate``), as AC2's may be."""
        r = self.rollout
        honoured = self.uses_critic or self.advantage.full_groups == "replay_rate"
        return r.full_group_size if honoured and r.full_group_size is not None else r.group_size

    @property
    def smaller_groups_for_revisits_only(self) -> bool:
        """Whether only a revisited problem (one with a graded whole answer to be measured against)
        decodes ``full_group_samples``, a new one keeping ``group_size``: under the replay-rate
        baseline. Read by ``samples_per_group``, the plan and validate's saving bound."""
        return self.advantage.full_groups == "replay_rate"

    def replay_rate_on(self, iteration: int) -> bool:
        """Whether a revisited problem's full-mode answers at ``iteration`` are measured against
        its replayed success rate (``advantage.full_groups: replay_rate``): past the critic's
        warm-up, for GRPO alike, so that the two algorithms then differ only in chunk mode."""
        return self.advantage.full_groups == "replay_rate" and iteration > self.critic.warmup_iterations

    def samples_per_group(self, iteration: int, mode: str, *, baseline_rate: float | None = None) -> int:
        """How many times ``generate_chunks`` continues a prefix of ``mode`` (full | chunk) at ``iteration``.

        Under the replay-rate baseline the smaller full group is only for a prefix that has one
        (``baseline_rate``, its prefixes row's): a problem without a graded whole answer is
        measured within its group, so it keeps ``group_size``. Otherwise AC2's full groups are
        smaller once chunk mode is on."""
        if self.smaller_groups_for_revisits_only:
            smaller = mode == "full" and self.replay_rate_on(iteration) and baseline_rate is not None
        else:
            smaller = mode == "full" and self.chunking_on(iteration)
        return self.full_group_samples if smaller else self.rollout.group_size

    def config_hash(self) -> str:
        """sha256 of the canonical JSON form: identical configs hash identically."""
        canonical = json.dumps(self.model_dump(mode="json", exclude=WHERE), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def run_hash(self) -> str:
        """sha256 of what every iteration of one run folder shares: the config hash's fields less the
        run length and what is kept (``SETTLED``), which a resumed run may change. The metrics
        table's ``config_hash`` column: one value for a whole run, whichever runner and run length."""
        canonical = json.dumps(self.model_dump(mode="json", exclude=SETTLED), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def bootstrap_hash(self) -> str:
        """Hash of the fields that determine the bootstrap (problems, initial actor and critic).

        Runs whose bootstrap hashes match can share one bootstrap: an AC2 run and a GRPO
        run of the same model, task and warm start start from the same weights.
        """
        part = {
            "seed": self.seed,
            "model": self.model.model_dump(mode="json", exclude={"device", "threads"}),
            "task": self.task.model_dump(mode="json"),
            "warm_start": self.warm_start.model_dump(mode="json"),
            # a critic with surprise starts with a next-token head; the others hash as they always did
            "critic_reading": [self.critic.read_steps, self.critic.read_lr, self.critic.max_input_tokens]
            + (["surprise"] if self.critic.surprise else []),
            "eval": self.eval.model_dump(mode="json"),
            "sampling": [self.rollout.max_response_tokens, self.rollout.temperature],
        }
        return hashlib.sha256(json.dumps(part, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def to_json(self) -> str:
        return self.model_dump_json()


def _format_errors(err: ValidationError, origin: str) -> str:
    lines = [f"invalid config {origin}:"]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(top level)"
        match e["type"]:
            case "extra_forbidden":
                lines.append(f"  {field}: unknown key")
            case "value_error" if m := re.match(r"Value error, ([\w.]+) (.*)", e["msg"], re.S):
                # a check's message starts with the field to change: the field itself (a field
                # validator, whose loc ends with it) or one of the section's (a cross-field check)
                if e["loc"] and e["loc"][-1] == m.group(1):
                    name = field
                else:
                    name = f"{field}.{m.group(1)}" if e["loc"] else m.group(1)
                lines.append(f"  {name}: {m.group(1)} {m.group(2)}")
            case _:
                found = e.get("input")
                shown = "" if isinstance(found, dict) else f" (found {found!r})"
                lines.append(f"  {field}: {e['msg']}{shown}")
    return "\n".join(lines)


def parse_config(data: dict, origin: str = "(dict)") -> AC2Config:
    if not isinstance(data, dict):
        raise ConfigError(f"invalid config {origin}: expected a mapping at the top level, found {type(data).__name__}")
    try:
        return AC2Config.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, origin)) from None


def load_config(path: str | Path, overrides: dict | None = None) -> AC2Config:
    """Load and validate a YAML config; ``overrides`` are merged on top (dotted keys allowed)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"config {path} is not valid YAML: {e}") from None
    if isinstance(data, dict):  # otherwise parse_config says the document is not a mapping
        for dotted, value in (overrides or {}).items():
            _set_dotted(data, dotted, value)
    return parse_config(data, str(path))


def config_from_json(text: str) -> AC2Config:
    return parse_config(json.loads(text), "(json)")


def _set_dotted(data: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted}: {key} is not a section")
    node[leaf] = value
