"""update_critic: fit V to outcomes with BCE (docs/design.md section 2, step 6).

Inputs are the states of this iteration's finished trajectories at chunk boundaries
(the ``critic_pairs`` already scored out of sample), with the problem and reference
solution in front. With ``critic.replay_iterations > 0`` the finished answers that replay
holds from the last iterations are fitted too. With ``critic.td_weight > 0`` the start
state of each unfinished chunk is also fitted to the bootstrapped V(s+c).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch

from ac2_core.config import AC2Config
from ac2_core.math import critic_bce_loss
from ac2_core.models.device import device_of
from ac2_core.models.state import update_stats
from ac2_core.models.store import Checkpoint, ModelStore
from ac2_core.models.tokenizer import special_ids
from ac2_core.replay import choose_reference, cut_points
from ac2_core.stages import data_parallel
from ac2_core.stages.common import Problems, StageStats, read, rng_for
from ac2_core.stages.critic_io import CriticInputs

STAGE = "update_critic"


Example = tuple[list[int], list[tuple[int, float, float]]]  # critic input, (position, target, weight) to fit
Answer = tuple[str, str | None, list[int], float, list[int]]  # problem, reference, response, outcome, cuts


def recent_answers(cfg: AC2Config, replay: list[dict], iteration: int) -> list[Answer]:
    """The finished, graded trajectories replay holds from the last ``critic.replay_iterations``
    iterations before ``iteration``, each cut at its chunk boundaries and shown, as a fresh
    answer would be, the problem's latest success other than itself.

    An iteration decodes a few dozen whole answers, so a critic fitted on its own pairs alone
    sees few states after a departure from a correct solution; replay holds the answers of the
    iterations before (research log, section 20). They were judged by a policy a few updates
    older, and none of them is among this iteration's out-of-sample pairs.
    """
    span = cfg.critic.replay_iterations
    if span == 0:
        return []
    by_problem: dict[str, list[dict]] = defaultdict(list)
    for t in replay:
        by_problem[t["problem_id"]].append(t)
    threshold = cfg.replay.success_threshold
    answers = []
    for t in sorted(replay, key=lambda t: t["trajectory_id"]):
        if not (t["finished"] and t["reward"] is not None and iteration - span <= t["iteration"] < iteration):
            continue
        ref = None
        if cfg.critic.use_reference:
            ref = choose_reference(by_problem[t["problem_id"]], exclude=t["trajectory_id"], success_threshold=threshold)
        cuts = cut_points(len(t["token_ids"]), cfg.rollout.chunk_tokens, finished=True)
        answers.append((t["problem_id"], ref, t["token_ids"], t["reward"], cuts))
    return answers


def training_examples(
    cfg: AC2Config, builder: CriticInputs, pairs: list[dict], scored: list[dict], replayed: list[Answer] = ()
) -> list[Example]:
    """Every distinct critic input with the positions it fits: pairs and ``replayed`` answers
    (``recent_answers``), plus TD examples when enabled.

    A pair fits its state's last token. With ``critic.dense`` the states of one finished
    answer are fitted in one input, the whole answer, at every token: position ``head + c``
    ends the state of ``c`` tokens (the backbone is causal), each at weight ``1/L``, so that an
    answer weighs about as much as its pairs (one per ``L`` tokens). An answer whose input
    had to be cut keeps its pairs.

    The G samples of a group share their early states, so many inputs are the same. They are
    merged into one example per (input, position) with the weighted mean target and the
    summed weight: ``sum_i w_i BCE(x, y_i)`` and ``W BCE(x, sum_i w_i y_i / W)`` have the same gradient.
    """
    response = {s["chunk_id"]: s["response_token_ids"] for s in scored}
    fits: list[tuple[list[int], int, float, float]] = []  # (input, position, target, weight)
    by_trajectory: dict[str, list[dict]] = {}
    for p in pairs:
        by_trajectory.setdefault(p["trajectory_id"], []).append(p)
    answers: list[Answer] = [
        (ps[0]["problem_id"], ps[0]["ref_trajectory_id"], response[tid], ps[0]["outcome"], [p["cut"] for p in ps])
        for tid, ps in by_trajectory.items()
    ]
    for pid, ref, answer, outcome, cuts in [*answers, *replayed]:
        along = builder.build_along(pid, ref, answer) if cfg.critic.dense else None
        if along is not None:
            x, head = along
            # each state weighs 1/L, the same for every answer: a state that several answers share
            # is fitted to their mean outcome, and an answer weighs about its number of pairs
            weight = 1.0 / cfg.rollout.chunk_tokens
            fits.extend((x, head + c, outcome, weight) for c in range(len(answer)))
            continue
        for cut in cuts:
            x = builder.build(pid, ref, answer[:cut])
            fits.append((x, len(x) - 1, outcome, 1.0))
    if cfg.critic.td_weight > 0:
        L = cfg.rollout.chunk_tokens
        for s in scored:
            if not s["finished"]:
                # an unfinished chunk starts at the last chunk boundary before its end
                start = s["response_token_ids"][: (len(s["response_token_ids"]) - 1) // L * L]
                x = builder.build(s["problem_id"], s["ref_trajectory_id"], start)
                fits.append((x, len(x) - 1, s["value_end"], cfg.critic.td_weight))
    merged: dict[tuple, dict[int, list[float]]] = {}
    for x, pos, y, w in fits:
        acc = merged.setdefault(tuple(x), {}).setdefault(pos, [0.0, 0.0])
        acc[0] += w * y
        acc[1] += w
    return [(list(x), [(pos, wy / w, w) for pos, (wy, w) in sorted(at.items())]) for x, at in merged.items()]


@dataclass(frozen=True)
class CriticStats(StageStats):
    examples: int
    critic_tokens: int  # of the distinct inputs, before the per-step draw
    loss_first: float
    loss_last: float
    critic_version: int
    critic_hash: str


def _match_as_configured(cfg: AC2Config, ckpt: Checkpoint) -> None:
    """The critic's first fit gives its head the reference match (and its "has left" indicator) when
    ``critic.reference_match`` (and ``critic.reference_left_flag``) asks, and takes it away when not: the
    bootstrap makes its critic without, so one bootstrap serves every layout."""
    critic = ckpt.model
    wanted = (cfg.critic.reference_match, cfg.critic.reference_left_flag)
    if (critic.match, critic.left_flag) == wanted:
        return
    if ckpt.version != 0:
        raise ValueError(
            f"critic {ckpt.uri} was fitted {_match_layout(critic.match, critic.left_flag)} and the config asks for"
            f" {_match_layout(*wanted)} (critic.reference_match, critic.reference_left_flag): a fitted value head keeps"
            " its inputs"
        )
    ids = special_ids(ckpt.tokenizer)
    ref_id = ids["ref"] if cfg.critic.reference_match else None
    ckpt.model = critic.with_reference_match(ref_id, ids["state"], left_flag=cfg.critic.reference_left_flag)


def _match_layout(match: bool, left_flag: bool) -> str:
    if not match:
        return "without the reference match"
    return "with the reference match" + (" and its left flag" if left_flag else " without its left flag")


@data_parallel.launches(STAGE, CriticStats)  # over training.num_processes processes, when more than one
def run(
    cfg: AC2Config,
    *,
    iteration: int,
    problems: str,
    replay: str,
    critic: str,
    critic_pairs: str,
    scored_chunks: str,
    out_critic: str,
    store: ModelStore | None = None,
) -> CriticStats:
    store = store or ModelStore(cfg)
    ckpt = store.take(critic, kind="critic")
    ckpt.trained_tokens = 0
    _match_as_configured(cfg, ckpt)
    replay_rows = read(replay, "replay")
    builder = CriticInputs(cfg, ckpt.tokenizer, Problems.load(problems), replay_rows)
    examples = training_examples(
        cfg,
        builder,
        read(critic_pairs, "critic_pairs"),
        read(scored_chunks, "scored_chunks"),
        recent_answers(cfg, replay_rows, iteration),
    )
    pad = ckpt.tokenizer.pad_token_id
    rng = rng_for(cfg, iteration, STAGE)

    def loss_fn(model, part):
        mb, total_weight = part
        device = device_of(model)
        width = max(len(x) for x, _ in mb)
        ids = torch.full((len(mb), width), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, (x, _) in enumerate(mb):
            ids[i, : len(x)] = torch.tensor(x)
            attn[i, : len(x)] = 1
        logits = model(ids.to(device), attn.to(device), every_position=True)  # (B, T)
        rows = torch.tensor([i for i, (_, at) in enumerate(mb) for _ in at], device=device)
        cols = torch.tensor([pos for _, at in mb for pos, _, _ in at], device=device)
        targets = torch.tensor([y for _, at in mb for _, y, _ in at], dtype=torch.float32, device=device)
        weights = torch.tensor([w for _, at in mb for _, _, w in at], dtype=torch.float32, device=device)
        share = float(weights.sum()) / total_weight  # micro-batch losses sum to the step's weighted mean
        return critic_bce_loss(logits[rows, cols], targets, weights) * share, {}

    if not cfg.critic.train_backbone:
        # the head alone: a backbone trained by the value loss drifts away from the frozen next-token head
        # that a critic with surprise reads (its features lost their signal within ~90 steps online)
        ckpt.model.backbone.requires_grad_(False)
    trainer = store.trainer(ckpt)
    history = []
    # a diagnostic critic (oracle, blind) is never trained: its checkpoint only passes through
    for _ in range(cfg.critic.steps_per_iteration if examples and cfg.critic.kind == "learned" else 0):
        # each step fits a seeded draw of at most batch_size examples
        pick = sorted(rng.choice(len(examples), size=min(cfg.critic.batch_size, len(examples)), replace=False))
        batch = [examples[i] for i in pick]
        total_weight = sum(w for _, at in batch for _, _, w in at)
        mb = cfg.critic.micro_batch_size
        history.append(trainer.step([(batch[i : i + mb], total_weight) for i in range(0, len(batch), mb)], loss_fn))
        ckpt.trained_tokens += sum(len(x) for x, _ in batch)
    ckpt.version += 1
    ckpt.stats = update_stats(history, {"loss": "critic_loss"})
    critic_hash = store.save(out_critic, ckpt, stage=STAGE)
    return CriticStats(
        examples=len(examples),
        critic_tokens=sum(len(x) for x, _ in examples),
        loss_first=history[0]["loss"] if history else 0.0,
        loss_last=history[-1]["loss"] if history else 0.0,
        critic_version=ckpt.version,
        critic_hash=critic_hash,
    )
