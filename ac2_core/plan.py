"""A sizing plan for one config on a number of GPUs per task: memory per GPU, FLOPs and time of one iteration.

``ac2 plan --config C --gpus N`` prints it; ``docs/scale.md`` explains each line.

- The iteration's work follows the config and three assumptions (``Shape``): prompt
  length, decoded tokens per full answer (default: the budget, ``max_response_tokens``),
  and the share of problems in chunk mode (default 0: every problem decodes whole
  answers, as GRPO and AC2's critic warm-up do; the costliest iteration). FLOPs are those
  of ``ac2_core.math.flops``, the metrics' own accounting.
- Memory per GPU of each GPU stage, for the backends and process counts of the config,
  with every process of a stage holding its share (``ac2_core.config.parallel``).
- Time at stated per-GPU rates (``Rates``): decode is bound by reading the weights and the
  KV cache once per step (or, for hf, by a per-layer step cost measured on an H200);
  prefill, critic scoring and training by FLOPs at a stated share of peak.

Everything is an estimate from formulas, not a measurement; the formulas are in the
functions below and in docs/scale.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ac2_core.config import AC2Config
from ac2_core.config.parallel import layout
from ac2_core.math.flops import critic_flops, decode_flops, prefill_flops, train_flops

GiB = 1 << 30
BYTES = {"float32": 4, "bfloat16": 2}
TINY_VOCAB = 260  # the byte-level tokenizer: 256 bytes and 4 special tokens (models.tokenizer)


@dataclass(frozen=True)
class Architecture:
    """The sizes of a Qwen3-style decoder (what HF's config.json says)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @classmethod
    def from_hf(cls, config: dict) -> Architecture:
        heads = config["num_attention_heads"]
        return cls(
            hidden=config["hidden_size"],
            layers=config["num_hidden_layers"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            intermediate=config["intermediate_size"],
            vocab=config["vocab_size"],
            tied=bool(config.get("tie_word_embeddings", False)),
        )

    @classmethod
    def of(cls, cfg: AC2Config, arch_file: str | None = None) -> Architecture:
        """The config's model: the tiny model's sizes, or ``config.json`` of a local pretrained path (or ``arch_file``)."""
        if arch_file is None and cfg.model.source == "tiny":
            t = cfg.model.tiny
            return cls(
                t.hidden_size, t.num_layers, t.num_heads, t.num_kv_heads, t.head_dim, t.intermediate_size, TINY_VOCAB, False
            )
        path = Path(arch_file) if arch_file else Path(str(cfg.model.path)) / "config.json"
        if not path.is_file():
            raise ValueError(
                f"model.path {cfg.model.path}: no config.json on this machine to size the model from;"
                " pass --arch FILE (an HF config.json, e.g. pipelines/configs/qwen3-4b-architecture.json)"
            )
        return cls.from_hf(json.loads(path.read_text()))

    @property
    def d_attn(self) -> int:
        return self.heads * self.head_dim

    @property
    def non_embedding(self) -> int:
        """N of ``flops``: every weight outside the embedding and the LM head."""
        q, kv = self.d_attn, self.kv_heads * self.head_dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden + 2 * self.head_dim  # q, k, v, o; q and k norms
        mlp = 3 * self.hidden * self.intermediate  # gate, up, down
        return self.layers * (attention + mlp + 2 * self.hidden) + self.hidden

    @property
    def actor_params(self) -> int:
        return self.non_embedding + self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def critic_params(self) -> int:
        """The backbone (no LM head) and the scalar head."""
        return self.non_embedding + self.vocab * self.hidden + self.hidden + 1

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def activation_elements_per_token(self) -> int:
        """Elements autograd keeps per token and layer with fused (flash or sdpa) attention: the two norms'
        inputs and outputs, q, k, v before and after their norms and rotary, the attention output, and the
        MLP's gate, up, activation and product."""
        q, kv = self.d_attn, self.kv_heads * self.head_dim
        return 5 * self.hidden + 4 * q + 4 * kv + 4 * self.intermediate


@dataclass(frozen=True)
class Rates:
    """Per-GPU rates the time estimate assumes (an H200 SXM; docs/scale.md says where each comes from)."""

    name: str = "H200"
    memory_gib: float = 140.4  # 143,771 MiB, as the GPU check's H200 reported it
    peak_tflops: float = 989.0  # dense bf16
    hbm_tbps: float = 4.8
    decode_bandwidth_share: float = 0.6  # of hbm_tbps that a decode step achieves reading weights and KV
    prefill_mfu: float = 0.5  # share of peak in prefill and critic scoring
    train_mfu: float = 0.35  # share of peak in forward + backward
    hf_layer_step_ms: float = 1.6  # hf decode: one layer of one step, measured (bench/results/gpu_iteration.md)


@dataclass(frozen=True)
class Shape:
    """What one iteration decodes: the assumptions the config cannot say."""

    prompt_tokens: int = 512
    response_tokens: int | None = None  # mean decoded tokens of a full answer; None: max_response_tokens
    ready_share: float = 0.0  # problems in chunk mode


@dataclass
class Plan:
    gpus: int
    arch: Architecture
    rates: Rates
    tokens: dict[str, float] = field(default_factory=dict)
    flops: dict[str, float] = field(default_factory=dict)
    memory: dict[str, dict[str, float]] = field(default_factory=dict)  # stage -> part -> GiB per GPU
    layout: dict[str, str] = field(default_factory=dict)  # stage -> processes x GPUs each
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def make_plan(cfg: AC2Config, *, gpus: int, arch: Architecture, shape: Shape = Shape(), rates: Rates = Rates()) -> Plan:
    """The plan of one iteration of ``cfg`` with ``gpus`` GPUs in each GPU stage's task."""
    if gpus < 1:
        raise ValueError(f"--gpus must be at least 1, found {gpus}")
    plan = Plan(gpus, arch, rates)
    work = _iteration(cfg, arch, shape)
    plan.tokens, plan.flops = work["tokens"], work["flops"]
    for stage, role in (
        ("generate_chunks", "generate"),
        ("score_chunks", "score"),
        ("update_actor", "train"),
        ("update_critic", "train"),
    ):
        if stage in ("score_chunks", "update_critic") and not cfg.uses_critic:
            continue
        lay = layout(cfg, role)
        procs = lay.resolve(gpus)
        plan.layout[stage] = f"{procs} x {lay.gpus_each}"
        if procs * lay.gpus_each != gpus:
            plan.notes.append(f"{stage}: {procs} processes x {lay.gpus_each} GPUs each is not the {gpus} GPUs of its task")
    plan.memory = _memory(cfg, arch, shape, plan)
    if cfg.uses_critic and cfg.critic.kind != "learned":
        plan.notes.append(
            f"critic.kind {cfg.critic.kind}: no critic forwards or training are counted; its memory is a learned critic's"
        )
    plan.seconds = _seconds(cfg, arch, shape, plan, work)
    return plan


def _response(cfg: AC2Config, shape: Shape) -> int:
    return min(shape.response_tokens or cfg.rollout.max_response_tokens, cfg.rollout.max_response_tokens)


def _iteration(cfg: AC2Config, arch: Architecture, shape: Shape) -> dict:
    """Tokens and FLOPs of one iteration under ``shape``."""
    r = cfg.rollout
    R, L, Lp, G = _response(cfg, shape), r.chunk_tokens, shape.prompt_tokens, r.group_size
    Gf = cfg.full_group_samples
    full = round(r.problems_per_iteration * (1 - shape.ready_share))
    new = 0  # full-mode problems that keep G: the new ones, when only revisits decode the smaller group
    if cfg.smaller_groups_for_revisits_only:
        new = min(full, round(r.problems_per_iteration * (1 - r.revisit_fraction)))
    answers = new * G + (full - new) * Gf  # whole answers decoded in full mode
    chunk_prefixes = (r.problems_per_iteration - full) * r.prefixes_per_problem
    prefix = R // 2 // L * L  # a chunk continues an answer from about its middle
    L_chunk = max(1, min(L, R - prefix))
    shape_kw = dict(n_params=arch.non_embedding, n_layers=arch.layers, d_attn=arch.d_attn)
    decode = answers * decode_flops(**shape_kw, start=Lp, n_tokens=R)
    decode += chunk_prefixes * G * decode_flops(**shape_kw, start=Lp + prefix, n_tokens=L_chunk)
    prefill = full * prefill_flops(**shape_kw, n_tokens=Lp) + chunk_prefixes * prefill_flops(**shape_kw, n_tokens=Lp + prefix)
    samples = answers + chunk_prefixes * G
    decoded = answers * R + chunk_prefixes * G * L_chunk
    context_tokens = answers * (Lp + R) + chunk_prefixes * G * (Lp + prefix + L_chunk)
    tokens = {"samples": samples, "decode": decoded, "actor_train": context_tokens * cfg.actor.steps_per_iteration}
    flops = {"decode": decode, "prefill": prefill}
    flops["actor_train"] = train_flops(n_params=arch.non_embedding, n_tokens=tokens["actor_train"])
    if cfg.uses_critic:
        ref = R + 1 if cfg.critic.use_reference else 0
        critic_len = lambda state: min(cfg.critic.max_input_tokens, Lp + ref + 1 + state)  # noqa: E731
        # full answers: a value at every chunk boundary (pairs) and at the start; chunks: start and end
        cuts = [c for c in range(0, R, L)]
        inputs = [critic_len(c) for c in cuts] * answers
        inputs += [critic_len(prefix)] * chunk_prefixes + [critic_len(prefix + L_chunk)] * (chunk_prefixes * G)
        crit_kw = dict(n_params=arch.non_embedding, n_layers=arch.layers, d_attn=arch.d_attn)
        learned = cfg.critic.kind == "learned"  # a diagnostic critic runs no critic forwards and never trains
        flops["critic"] = sum(critic_flops(**crit_kw, n_tokens=n) for n in inputs) if learned else 0
        if cfg.critic.dense:  # one example per finished answer: the whole answer, fitted at every token
            examples, mean_len = answers, critic_len(R)
        else:  # one example per chunk boundary of a finished answer
            examples, mean_len = answers * len(cuts), sum(critic_len(c) for c in cuts) / len(cuts)
        drawn = min(cfg.critic.batch_size, examples)
        tokens["critic_inputs"] = len(inputs) if learned else 0
        tokens["critic_input_tokens"] = sum(inputs) if learned else 0
        tokens["critic_train"] = round(cfg.critic.steps_per_iteration * drawn * mean_len) if learned else 0
        flops["critic_train"] = train_flops(n_params=arch.non_embedding, n_tokens=tokens["critic_train"])
        tokens["critic_input_max"] = critic_len(R)
    tokens["context_max"] = Lp + R
    return {"tokens": tokens, "flops": flops}


def _training_state(cfg: AC2Config, params: int, procs: int) -> dict[str, float]:
    """Weights, gradients and optimizer state per GPU (GiB) for the training backend and ZeRO stage."""
    b = BYTES[cfg.model.dtype]
    t = cfg.training
    if t.backend == "torch":  # AdamW's moments in the parameters' dtype, everything replicated
        return {"weights": params * b / GiB, "gradients": params * b / GiB, "optimizer": 2 * params * b / GiB}
    master = 4 if b == 2 else 0  # DeepSpeed keeps fp32 master weights for a bf16 model
    z = t.zero_stage
    return {
        "weights": params * b / (procs if z >= 3 else 1) / GiB,
        "gradients": params * b / (procs if z >= 2 else 1) / GiB,
        "optimizer": params * (8 + master) / (procs if z >= 1 else 1) / GiB,
    }


def _memory(cfg: AC2Config, arch: Architecture, shape: Shape, plan: Plan) -> dict[str, dict[str, float]]:
    b = BYTES[cfg.model.dtype]
    kvb = arch.kv_bytes_per_token(b)
    R, Lp = _response(cfg, shape), shape.prompt_tokens
    out: dict[str, dict[str, float]] = {}
    g = cfg.generation
    if g.backend == "vllm":
        weights = arch.actor_params * b / g.tensor_parallel_size / GiB
        kv = g.kv_cache_gib or max(0.0, g.gpu_memory_utilization * plan.rates.memory_gib - weights)
        out["generate_chunks"] = {"weights": weights, "kv_cache": kv}
    else:
        rows = min(g.batch_size, plan.tokens["samples"])
        out["generate_chunks"] = {"weights": arch.actor_params * b / GiB, "kv_cache": rows * (Lp + R) * kvb / GiB}
    procs = {s: int(v.split(" x ")[0]) for s, v in plan.layout.items()}
    T = Lp + R
    mb = cfg.actor.micro_batch_size
    act = arch.activation_elements_per_token() * b
    actor = _training_state(cfg, arch.actor_params, procs["update_actor"])
    ckpt = cfg.training.backend == "deepspeed" and cfg.training.gradient_checkpointing
    # with checkpointing: each layer's input, and one layer's activations while it is recomputed
    actor["activations"] = mb * T * (arch.layers * arch.hidden * b + act if ckpt else arch.layers * act) / GiB
    actor["logits"] = mb * T * arch.vocab * (b + 3 * 4) / GiB  # token_logprobs: the logits, and 3 float32 copies
    out["update_actor"] = actor
    if cfg.uses_critic:
        Tc = plan.tokens["critic_input_max"]
        sb = cfg.critic.score_batch_size
        weights = arch.critic_params * b / (g.tensor_parallel_size if cfg.critic.scoring_backend == "vllm" else 1) / GiB
        out["score_chunks"] = {"weights": weights, "activations": sb * Tc * (2 * arch.hidden + 2 * arch.intermediate) * b / GiB}
        critic = _training_state(cfg, arch.critic_params, procs["update_critic"])
        mbc = cfg.critic.micro_batch_size
        critic["activations"] = mbc * Tc * (arch.layers * arch.hidden * b + act if ckpt else arch.layers * act) / GiB
        out["update_critic"] = critic
    # ac2 loads models with eager attention (models.hf.ATTN_IMPLEMENTATION): it materialises the T x T scores
    eager = arch.heads * T * T * (b + 4) / GiB
    plan.notes.append(
        f"eager attention (what ac2 loads models with) adds {eager:,.1f} GiB of attention scores per sequence and layer at"
        f" {T} tokens, kept for backward in training; the figures above assume fused (sdpa or flash) attention"
    )
    for stage, parts in out.items():
        parts["total"] = sum(parts.values())
        if parts["total"] > plan.rates.memory_gib:
            plan.notes.append(
                f"{stage} needs {parts['total']:,.1f} GiB per GPU,"
                f" more than the {plan.rates.memory_gib} GiB of an {plan.rates.name}"
            )
    return out


def _seconds(cfg: AC2Config, arch: Architecture, shape: Shape, plan: Plan, work: dict) -> dict[str, float]:
    rates = plan.rates
    b = BYTES[cfg.model.dtype]
    peak = rates.peak_tflops * 1e12
    g = cfg.generation
    R, Lp = _response(cfg, shape), shape.prompt_tokens
    samples = work["tokens"]["samples"]
    decoded = work["tokens"]["decode"]
    mean_context = Lp + R / 2
    tp = g.tensor_parallel_size if g.backend == "vllm" else 1
    engines = max(1, plan.gpus // tp)
    weights_bytes = arch.actor_params * b / tp
    kv_per_seq = mean_context * arch.kv_bytes_per_token(b) / tp
    if g.backend == "vllm":
        kv_gib = plan.memory["generate_chunks"]["kv_cache"]
        concurrent = max(1, min(math.ceil(samples / engines), int(kv_gib * GiB / kv_per_seq)))
        overhead = 0.0
    else:
        concurrent = min(g.batch_size, math.ceil(samples / engines))
        overhead = arch.layers * rates.hf_layer_step_ms / 1e3
    step_bytes = weights_bytes + concurrent * kv_per_seq
    step_flops = concurrent * (work["flops"]["decode"] / max(decoded, 1)) / tp
    step = max(
        step_bytes / (rates.hbm_tbps * 1e12 * rates.decode_bandwidth_share), step_flops / (peak * rates.prefill_mfu), overhead
    )
    steps = math.ceil(decoded / engines / concurrent)
    out = {"decode": steps * step, "prefill": work["flops"]["prefill"] / (plan.gpus * peak * rates.prefill_mfu)}
    plan.tokens["decode_concurrency"] = concurrent
    out["generate_chunks"] = out["decode"] + out["prefill"]
    out["update_actor"] = work["flops"]["actor_train"] / (plan.gpus * peak * rates.train_mfu)
    if cfg.uses_critic:
        out["score_chunks"] = work["flops"]["critic"] / (plan.gpus * peak * rates.prefill_mfu)
        out["update_critic"] = work["flops"]["critic_train"] / (plan.gpus * peak * rates.train_mfu)
    # update_actor and update_critic run side by side, each in its own task
    updates = max(out["update_actor"], out.get("update_critic", 0.0))
    out["iteration"] = out["generate_chunks"] + out.get("score_chunks", 0.0) + updates
    return out


def render(plan: Plan, cfg: AC2Config, shape: Shape) -> str:
    """The plan as the text ``ac2 plan`` prints."""
    a, r = plan.arch, plan.rates
    lines = [
        f"# ac2 plan: {cfg.run_id}, {plan.gpus} GPUs per GPU task ({r.name}: {r.memory_gib} GiB, {r.peak_tflops:g} dense"
        f" TFLOP/s, {r.hbm_tbps:g} TB/s)",
        "",
        f"model: {a.layers} layers, hidden {a.hidden}, {a.heads}/{a.kv_heads} heads of {a.head_dim}, vocab {a.vocab};"
        f" {a.actor_params / 1e9:.3g}B parameters, N = {a.non_embedding / 1e9:.3g}B non-embedding; {cfg.model.dtype}",
        f"iteration: {cfg.rollout.problems_per_iteration} problems x {cfg.rollout.group_size} samples, prompts of"
        f" {shape.prompt_tokens} tokens, full answers of {_response(cfg, shape)} decoded tokens, {shape.ready_share:.0%} of"
        f" problems in chunk mode (chunks of {cfg.rollout.chunk_tokens})",
        f"backends: generation {cfg.generation.backend}, critic scoring {cfg.critic.scoring_backend}, training"
        f" {cfg.training.backend}" + (f" ZeRO-{cfg.training.zero_stage}" if cfg.training.backend == "deepspeed" else ""),
        "",
        "## Memory per GPU (GiB)",
        "",
        "| stage | processes x GPUs | weights | gradients | optimizer | activations | logits | KV cache | total |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for stage, parts in plan.memory.items():
        cells = [
            f"{parts[k]:,.1f}" if k in parts else ""
            for k in ("weights", "gradients", "optimizer", "activations", "logits", "kv_cache")
        ]
        lines.append(f"| {stage} | {plan.layout.get(stage, '')} | " + " | ".join(cells) + f" | {parts['total']:,.1f} |")
    f, t = plan.flops, plan.tokens
    lines += ["", "## One iteration", "", "| work | tokens | FLOPs |", "|---|---:|---:|"]
    lines.append(f"| decode | {t['decode']:,} | {f['decode']:.3e} |")
    lines.append(f"| prefill | | {f['prefill']:.3e} |")
    if "critic" in f:
        lines.append(f"| critic scoring | {t['critic_input_tokens']:,} | {f['critic']:.3e} |")
    lines.append(f"| actor training | {t['actor_train']:,} | {f['actor_train']:.3e} |")
    if "critic_train" in f:
        lines.append(f"| critic training | {t['critic_train']:,} | {f['critic_train']:.3e} |")
    s = plan.seconds
    lines += ["", f"## Time at the rates above (decode: {t['decode_concurrency']} sequences at once per engine)", ""]
    lines += ["| stage | seconds |", "|---|---:|"]
    for stage in ("generate_chunks", "score_chunks", "update_actor", "update_critic"):
        if stage in s:
            lines.append(f"| {stage} | {s[stage]:,.1f} |")
    lines.append(f"| iteration (the updates side by side) | {s['iteration']:,.1f} |")
    if plan.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in plan.notes]
    return "\n".join(lines) + "\n"
