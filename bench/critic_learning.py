"""How fast a critic learns to judge partial answers: the offline bench every critic change is judged on.

    .venv/bin/python bench/critic_learning.py                     # the default conditions
    .venv/bin/python bench/critic_learning.py --conditions dense dense_noref --steps 100 200 500
    .venv/bin/python bench/critic_learning.py --report-only       # rebuild the report from the records
    # a task variant: its own bootstrap and answers under --out, its own report
    .venv/bin/python bench/critic_learning.py --set warm_start.misconception_rate 0.5 --out runs/critic_misconception \
        --results bench/results/critic_learning_misconception.md --conditions surprise_frozen_readslip500_dense ...

The protocol, built from the project's own pieces (the toy config's bootstrap, the hf
sampler, the grader, ``Critic``, ``build_critic_input``, ``critic_bce_loss``):

1. **Answers.** The warm-started actor answers ``--train-problems`` training problems and
   ``--heldout-problems`` other ones, ``--samples`` times each. Every answer is labelled
   with its outcome (the grader's reward).
2. **References.** Each problem also gets ``--samples`` *earlier* answers, sampled apart;
   its reference is the first of them that succeeded, as the replay would give it online
   (an answer is never its own reference). A problem without one has no reference.
3. **States.** Every answer is cut at each chunk boundary (``replay.cut_points``); a state
   is (problem, reference, partial answer) with its answer's outcome.
4. **A condition** (``CONDITIONS``) says how the critic is made and trained; it is trained
   at batch ``--batch`` answers and scored on the held-out answers' states after each of
   ``--steps``. Scores: AUC over all states, over states past the first chunk (at least one
   chunk written) and over those with a reference; the value gap (mean V on states that
   went on to succeed minus on those that failed), and the binned calibration error.
5. **The ceiling** (arith only): the predictor "the partial answer agrees with the canonical
   solution so far", calibrated by depth on the training states; likewise against the
   reference shown to the critic.
6. **The misconception** (arith with ``warm_start.misconception_rate``, a DIAGNOSTIC): how often
   an answer that meets the misconception's trigger writes it, and the next-token loss of the
   trigger's token under the actor and under each reading condition's backbone, by what the
   answer wrote there (``trigger_tokens``): does the policy's surprise, or the reader's, tell
   the misconception from the right step?

Decoded tokens are counted (the answers, and the reference answers) and reported, since a
critic warm-started on such answers charges them to AC2. Not a test: no timings are
asserted. One torch thread; run it under ``nice``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import publish  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "critic_learning.md"
MARKER = "<!-- analysis: text below this line is kept when the tables are rewritten -->"


@dataclass(frozen=True)
class Condition:
    """How one critic is made and trained (the fields not named keep their defaults)."""

    use_reference: bool = True
    dense: bool = False  # fit V at every position of an answer in one forward, not only at chunk boundaries
    lr: float = 1e-4
    read_steps: int = 0  # steps of reference-reading LM pretraining of the critic's backbone before the value fit
    read_lr: float = 1e-3
    read_on: str = "answers"  # answers: sampled answers under their references; demos: worked solutions copied;
    # slipdemos: one slipped worked solution read under another of the same problem (no decoding needed)
    prefit_steps: int = 0  # steps of a dense value fit on graded slipped demonstrations (no decoding) before the answers
    prefit_slip: float = 0.1  # their slip rate a step; the reference shown is the worked solution
    aux_lm: float = 0.0  # weight of a next-token loss on the answer, in the critic's layout, beside the value loss
    train_backbone: bool = True  # false: the value fit trains the head alone (critic.train_backbone)
    surprise: bool = (
        False  # the library's critic with surprise (critic.surprise): the value head also reads the answer's surprise
    )
    answers: int | None = None  # fit the value on the first this many training answers (None: all)
    backbone: str = "actor"  # actor: the warm-started actor's; bootstrap: the bootstrap's critic (critic.read_steps)
    read_continues: int = 0  # the reading goes on from this condition's cached reading of this many steps (a fresh AdamW)
    # > 0: the reading weights each answer token by its own next-token loss, capped at this many nats, so it dwells
    # on the tokens it cannot yet predict (where a reference can tell what the problem alone does not) and less on
    # the many it already can; the cap keeps unpredictable ones (a slip in the answer) from taking over
    read_focus: float = 0.0
    reference_match: bool = False  # critic.reference_match: the head also reads the answer's run along the reference
    left_flag: bool = False  # critic.reference_left_flag: ... and whether any written token has left it
    note: str = ""
    overrides: dict = field(default_factory=dict)  # reserved for critic options of the library

    def __post_init__(self):
        if self.aux_lm and self.surprise:  # fit_step's auxiliary path feeds the head the hidden state alone
            raise ValueError("a condition cannot have both aux_lm and surprise")


_SURPRISE_READ500 = Condition(
    dense=True, lr=3e-4, read_steps=500, read_on="slipdemos", surprise=True, note="reads its own surprise beside the hidden state"
)

CONDITIONS: dict[str, Condition] = {
    "cuts": Condition(note="the project's critic as it was: states at chunk boundaries"),
    "cuts_noref": Condition(use_reference=False),
    "cuts_lr3e-4": Condition(lr=3e-4),
    "dense": Condition(dense=True, note="V fitted at every position of each answer, one forward per answer"),
    "dense_lr3e-4": Condition(dense=True, lr=3e-4),
    "dense_lr1e-3": Condition(dense=True, lr=1e-3),
    "dense_noref": Condition(dense=True, use_reference=False),
    "dense_noref_lr3e-4": Condition(dense=True, use_reference=False, lr=3e-4),
    "read_dense": Condition(dense=True, lr=3e-4, read_steps=300, note="backbone first reads: LM on reference + answer"),
    "read1000_dense": Condition(dense=True, lr=3e-4, read_steps=1000),
    "read_dense_noref": Condition(dense=True, lr=3e-4, read_steps=300, use_reference=False),
    "read1000_dense_noref": Condition(dense=True, lr=3e-4, read_steps=1000, use_reference=False),
    "read3000_dense": Condition(dense=True, lr=3e-4, read_steps=3000),
    "readdemo_dense": Condition(dense=True, lr=3e-4, read_steps=300, read_on="demos", note="reads worked solutions: copying"),
    "readdemo1000_dense": Condition(dense=True, lr=3e-4, read_steps=1000, read_on="demos"),
    "read_cuts": Condition(lr=3e-4, read_steps=300),
    "readslip_dense": Condition(dense=True, lr=3e-4, read_steps=1000, read_on="slipdemos", note="reads slipped solutions"),
    "readslip_dense_noref": Condition(dense=True, lr=3e-4, read_steps=1000, read_on="slipdemos", use_reference=False),
    "readslip_dense_2k": Condition(dense=True, lr=3e-4, read_steps=1000, read_on="slipdemos", answers=2000),
    "dense_2k": Condition(dense=True, lr=3e-4, answers=2000),
    "slipfit_dense": Condition(dense=True, lr=3e-4, prefit_steps=500, note="first fits V on graded slipped solutions"),
    "readslip_slipfit_dense": Condition(dense=True, lr=3e-4, read_steps=1000, read_on="slipdemos", prefit_steps=500),
    "readslip_slipfit_dense_noref": Condition(
        dense=True, lr=3e-4, read_steps=1000, read_on="slipdemos", prefit_steps=500, use_reference=False
    ),
    "readslip500_dense": Condition(dense=True, lr=3e-4, read_steps=500, read_on="slipdemos"),
    "readslip500_dense_noref": Condition(dense=True, lr=3e-4, read_steps=500, read_on="slipdemos", use_reference=False),
    "readslip500_dense_aux": Condition(
        dense=True, lr=3e-4, read_steps=500, read_on="slipdemos", aux_lm=1.0, note="keeps reading while it fits V"
    ),
    "readslip500_dense_aux_noref": Condition(
        dense=True, lr=3e-4, read_steps=500, read_on="slipdemos", aux_lm=1.0, use_reference=False
    ),
    "dense_aux": Condition(dense=True, lr=3e-4, aux_lm=1.0),
    # the library's critic with surprise; each has a twin without the reference (``_noref``, below)
    "surprise_readslip500_dense": _SURPRISE_READ500,
    "surprise_frozen_readslip500_dense": replace(_SURPRISE_READ500, train_backbone=False, note="trains the head alone"),
    "frozen_readslip500_dense": Condition(dense=True, lr=3e-4, read_steps=500, read_on="slipdemos", train_backbone=False),
    "surprise_dense": Condition(dense=True, lr=3e-4, surprise=True, note="the actor's backbone, no reading"),
    "surprise_dense_noref": Condition(dense=True, lr=3e-4, surprise=True, use_reference=False),
    "bootstrap_dense": Condition(dense=True, lr=3e-4, backbone="bootstrap", note="the bootstrap's critic (it read)"),
    "bootstrap_dense_noref": Condition(dense=True, lr=3e-4, backbone="bootstrap", use_reference=False),
    # the toy's own critic (toy.yaml): the bootstrap's reading backbone with surprise, the head fitted alone
    "library": Condition(dense=True, lr=3e-4, backbone="bootstrap", train_backbone=False, note="the toy config's critic"),
    "library_match": Condition(
        dense=True, lr=3e-4, backbone="bootstrap", train_backbone=False, reference_match=True, note="... matching the reference"
    ),
}
CONDITIONS["library_match_left"] = replace(CONDITIONS["library_match"], left_flag=True, note="... and whether it has left")
CONDITIONS["surprise_frozen_readslip500+500_dense"] = replace(
    CONDITIONS["surprise_frozen_readslip500_dense"], read_steps=1000, read_continues=500, note="reads 500 steps more"
)
CONDITIONS["surprise_frozen_readslip500_match_dense"] = replace(
    CONDITIONS["surprise_frozen_readslip500_dense"], reference_match=True, note="... and reads its run along the reference"
)
CONDITIONS["surprise_frozen_readslip500focus2_dense"] = replace(
    CONDITIONS["surprise_frozen_readslip500_dense"], read_focus=2.0, note="reads where it cannot yet predict"
)
CONDITIONS |= {
    f"{name}_noref": replace(CONDITIONS[name], use_reference=False, note="")
    for name in (
        "surprise_readslip500_dense",
        "surprise_frozen_readslip500_dense",
        "surprise_frozen_readslip500+500_dense",
        "surprise_frozen_readslip500focus2_dense",
        "library",
    )
}


# ---------------------------------------------------------------- data


def load_cfg(args):
    from ac2_core.config import load_config

    return load_config(args.config, dict(args.set))


def bootstrap(args, cfg):
    """The toy bootstrap (cached under --out): problems, the warm-started actor."""
    from ac2_core import storage
    from ac2_core.runner import inprocess
    from ac2_core.runner.layout import RunLayout

    layout = RunLayout(str(Path(args.out) / "bootstrap"))
    if not storage.exists(layout.bootstrap("metrics")):
        t0 = time.perf_counter()
        inprocess.run_bootstrap(cfg, layout, log=lambda m: print(f"[bootstrap] {m}", flush=True))
        print(f"[bootstrap] {time.perf_counter() - t0:.0f}s", flush=True)
    return layout


def sample_answers(args, cfg, layout) -> dict:
    """Labelled answers and reference answers, cached as JSON under --out."""
    path = Path(args.out) / f"answers-{args.train_problems}-{args.heldout_problems}-{args.samples}.json"
    if path.exists():
        return json.loads(path.read_text())
    if args.report_only:  # a report is rebuilt from records, never from freshly decoded answers
        raise SystemExit(f"--report-only: no answers at {path}; give the run's --train-problems, --heldout-problems, --samples")
    from ac2_core.generation import generate
    from ac2_core.models.store import ModelStore
    from ac2_core.stages.common import Problems, prompt_ids
    from ac2_core.tasks import grade_many

    ckpt = ModelStore(cfg).load(layout.bootstrap("actor"), kind="actor")
    model, tok = ckpt.model, ckpt.tokenizer
    train_ids = Problems.load(layout.bootstrap("problems")).ids("train")
    probs = Problems.load(layout.bootstrap("problems"))
    need = args.train_problems + args.heldout_problems
    if need > len(train_ids):
        raise SystemExit(f"--train-problems + --heldout-problems = {need}: the task has {len(train_ids)} training problems")
    ids = train_ids[:need]
    rows = [probs[p] for p in ids]
    contexts = [prompt_ids(tok, r["prompt"]) for r in rows]
    out = {"train": ids[: args.train_problems], "heldout": ids[args.train_problems :], "answers": {}, "decoded_tokens": 0}
    t0 = time.perf_counter()
    for role, seed in (("labelled", 11), ("reference", 22)):
        samples = generate(
            model,
            contexts,
            [cfg.rollout.max_response_tokens] * len(contexts),
            n=args.samples,
            eos_id=tok.eos_token_id,
            pad_id=tok.pad_token_id,
            seed=seed,
            temperature=cfg.rollout.temperature,
        )
        flat = [(r, s) for r, group in zip(rows, samples) for s in group]
        grades = grade_many(
            cfg.task,
            [r for r, _ in flat],
            [tok.decode(s.token_ids, skip_special_tokens=True) for _, s in flat],
            ["bench"] * len(flat),
        )
        for (r, s), g in zip(flat, grades):
            entry = out["answers"].setdefault(r["problem_id"], {"labelled": [], "reference": []})
            entry[role].append({"ids": s.token_ids, "reward": g.reward, "finished": s.finish_reason == "stop"})
        out["decoded_tokens"] += sum(len(s.token_ids) for _, s in flat)
        print(f"[answers] {role}: {len(flat)} answers, {time.perf_counter() - t0:.0f}s", flush=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(path)
    return out


@dataclass
class Answer:
    problem_id: str
    prompt: list[int]
    ref: list[int] | None
    response: list[int]
    outcome: float
    cuts: list[int]
    canonical: str  # the task's worked solution (the ceiling compares against it)
    ref_text: str | None


def answers_of(cfg, tok, probs, data: dict, split: str) -> list[Answer]:
    from ac2_core.replay import cut_points
    from ac2_core.stages.common import prompt_ids

    threshold = cfg.replay.success_threshold
    result = []
    for pid in data[split]:
        entry = data["answers"][pid]
        ref = next((a["ids"] for a in entry["reference"] if a["reward"] is not None and a["reward"] >= threshold), None)
        for a in entry["labelled"]:
            if a["reward"] is None:
                continue
            result.append(
                Answer(
                    pid,
                    prompt_ids(tok, probs[pid]["prompt"]),
                    ref,
                    a["ids"],
                    a["reward"],
                    cut_points(len(a["ids"]), cfg.rollout.chunk_tokens, finished=a["finished"]),
                    probs[pid]["solution"] or "",
                    None if ref is None else tok.decode(ref, skip_special_tokens=True),
                )
            )
    return result


# ---------------------------------------------------------------- critic


def critic_input(cfg, tok, a: Answer, state: list[int], use_reference: bool) -> list[int]:
    from ac2_core.models.critic import build_critic_input

    return build_critic_input(
        a.prompt,
        a.ref if use_reference else None,
        state,
        ref_id=tok.convert_tokens_to_ids("<|ref|>"),
        state_id=tok.convert_tokens_to_ids("<|state|>"),
        max_tokens=cfg.critic.max_input_tokens,
    )


def batch_tensors(inputs: list[list[int]], pad_id: int, device):
    """Right-padded ids and attention mask, (B, T), on ``device``."""
    import torch

    width = max(len(x) for x in inputs)
    ids = torch.full((len(inputs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, x in enumerate(inputs):
        ids[i, : len(x)] = torch.tensor(x)
        mask[i, : len(x)] = 1
    return ids.to(device), mask.to(device)


def position_logits(critic, inputs: list[list[int]], pad_id: int):
    """The value head's logit at every position of each right-padded input: (B, T)."""
    ids, mask = batch_tensors(inputs, pad_id, critic.value_head.weight.device)
    return critic(ids, mask, every_position=True)


def examples(cfg, tok, answers: list[Answer], cond: Condition) -> list[tuple[list[int], list[int], float]]:
    """(critic input, positions to fit, outcome) per answer (dense) or per state (cuts)."""
    out = []
    for a in answers:
        if cond.dense:
            x = critic_input(cfg, tok, a, a.response, cond.use_reference)
            head = len(x) - len(a.response)
            if head >= 0 and x[head:] == a.response:  # not cut: each position is one state's last token
                out.append((x, [head - 1 + c for c in range(len(a.response))], a.outcome))
                continue
        for c in a.cuts:
            x = critic_input(cfg, tok, a, a.response[:c], cond.use_reference)
            out.append((x, [len(x) - 1], a.outcome))
    return out


def make_critic(cfg, actor, tok, answers: list[Answer], cond: Condition, seed: int, bootstrap_critic: str, cache: Path):
    """The critic: the actor's backbone (after ``read_steps`` of reference reading) and a zero head."""
    import torch

    from ac2_core.models.critic import Critic

    if cond.backbone == "bootstrap":  # the library's own critic, as the bootstrap made it (it reads when the config says)
        from ac2_core.models.store import ModelStore
        from ac2_core.models.tokenizer import special_ids

        critic = ModelStore(cfg).load(bootstrap_critic, kind="critic").model
        if cond.reference_match:  # as a run's first fit gives it (update_critic)
            ids = special_ids(tok)
            critic = critic.with_reference_match(ids["ref"], ids["state"], left_flag=cond.left_flag)
        return critic.train().to(device=next(actor.parameters()).device, dtype=torch.float32)
    backbone_src = actor
    if cond.read_steps:
        backbone_src = read_backbone(cfg, actor, tok, answers, cond, seed, cache)
    ids = {
        "state_id": tok.convert_tokens_to_ids("<|state|>") if cond.surprise or cond.reference_match else None,
        "ref_id": tok.convert_tokens_to_ids("<|ref|>") if cond.reference_match else None,
        "surprise": cond.surprise,
    }
    return Critic.from_actor(backbone_src, seed=seed, **ids).train().to(torch.float32)


def read_backbone(cfg, actor, tok, answers: list[Answer], cond: Condition, seed: int, cache: Path):
    """A copy of ``actor`` after ``cond``'s reading, cached under ``cache`` (safetensors) by
    everything the reading depends on, so conditions that read alike read once."""
    import torch
    from transformers import AutoModelForCausalLM

    key = f"read-{cond.read_on}-{cond.read_steps}-{cond.read_lr:g}-{'ref' if cond.use_reference else 'noref'}-{seed}"
    if cond.read_continues:  # not the reading of read_steps from the start
        key += f"-from{cond.read_continues}"
    if cond.read_focus:
        key += f"-focus{cond.read_focus:g}"
    if cfg.warm_start.misconception_rate:  # the reading pairs hold the misconception: another reading
        key += f"-misconception{cfg.warm_start.misconception_rate:g}"
    path = cache / key
    if (path / "config.json").exists():
        print(f"    reading: cached at {path}", flush=True)
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(next(actor.parameters()).device)
    if cond.read_continues:  # go on from the shorter reading, which must be cached
        model = read_backbone(
            cfg, actor, tok, answers, replace(cond, read_steps=cond.read_continues, read_continues=0), seed, cache
        )
    else:
        model = copy.deepcopy(actor)
    read_pretrain(cfg, model, tok, answers, cond, seed)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp)
    tmp.replace(path)
    return model


def read_pretrain(cfg, model, tok, answers: list[Answer], cond: Condition, seed: int) -> None:
    """Next-token LM on critic-layout inputs (problem, reference, answer): the answer's tokens
    are predicted with the reference in view, so the backbone learns to read it. A condition
    without the reference reads in its own layout (problem, answer)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    seqs = []
    slips = np.random.default_rng(seed + 1)
    for a in answers:
        if cond.read_on in ("demos", "slipdemos"):
            # demos: the worked solution as reference and as the answer (pure copying); slipdemos: two
            # independently slipped ones, so the answer sometimes leaves the reference and must be computed on
            slip = 0.0 if cond.read_on == "demos" else 0.1
            # a variant whose demonstrations hold a misconception (warm_start.misconception_rate) holds it in both
            # of a problem's demonstrations alike, as the bootstrap's reading pairs do
            wrong = cfg.warm_start.misconception_rate
            ref, state = (slipped_demo(tok, a, slip, slips, wrong, cfg.task.seed) for _ in range(2))
            x = critic_input(cfg, tok, Answer(a.problem_id, a.prompt, ref, [], 0.0, [], "", None), state, cond.use_reference)
            seqs.append((x, len(x) - len(state)))
        elif a.ref is not None:
            x = critic_input(cfg, tok, a, a.response, cond.use_reference)
            seqs.append((x, len(x) - len(a.response)))
    # a continued reading draws other batches than the reading it continues
    rng = np.random.default_rng([seed, cond.read_continues] if cond.read_continues else seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cond.read_lr)
    model.train()
    for step in range(cond.read_continues, cond.read_steps):
        batch = [seqs[i] for i in rng.choice(len(seqs), size=min(64, len(seqs)), replace=False)]
        ids, mask = batch_tensors([x for x, _ in batch], tok.pad_token_id, next(model.parameters()).device)
        loss_mask = torch.zeros_like(ids, dtype=torch.bool)
        for i, (x, head) in enumerate(batch):
            loss_mask[i, head : len(x)] = True
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        token_loss = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")[loss_mask[:, 1:]]
        if cond.read_focus:
            weight = token_loss.detach().clamp(max=cond.read_focus)
            loss = (weight * token_loss).sum() / weight.sum()
        else:
            loss = token_loss.mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % 100 == 0:
            print(f"    read step {step + 1}: loss {loss.item():.3f}", flush=True)
    model.eval()


def slipped_demo(tok, a: Answer, slip: float, rng, misconception: float = 0.0, task_seed: int = 0) -> list[int]:
    """A worked solution of ``a``'s problem with slips at ``slip`` a step (arith), then EOS; under the
    misconception if the problem is one of the ``misconception`` share (``arith.misconceived``)."""
    from ac2_core.tasks import arith

    terms = arith.terms_of(tok.decode(a.prompt))
    wrong = arith.misconceived(terms, rate=misconception, seed=task_seed)
    text = arith.slipped_solution(terms, slip_rate=slip, rng=rng, misconceived=wrong)
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def slip_examples(cfg, tok, answers: list[Answer], cond: Condition, rng, n: int) -> list[tuple[list[int], list[int], float]]:
    """``n`` dense examples that cost no decoding: a slipped solution of a random problem, graded,
    under the worked solution as its reference (a success, as replay's references are)."""
    from ac2_core.tasks import arith

    out = []
    for i in rng.choice(len(answers), size=n):
        a = answers[i]
        ref, response = slipped_demo(tok, a, 0.0, rng), slipped_demo(tok, a, cond.prefit_slip, rng)
        outcome = arith.grade(str(sum(arith.terms_of(tok.decode(a.prompt)))), tok.decode(response, skip_special_tokens=True))
        demo = Answer(a.problem_id, a.prompt, ref, response, outcome, [], "", None)
        out += examples(cfg, tok, [demo], cond)
    return out


def fit_step(cfg, critic, opt, batch, pad_id: int, lm_head=None, aux_lm: float = 0.0) -> int:
    """One BCE step of V on ``batch`` of (input, positions, outcome); returns the positions fitted.
    With ``lm_head`` the backbone also predicts each fitted position's next token (weight ``aux_lm``)."""
    import torch
    import torch.nn.functional as F

    from ac2_core.math import critic_bce_loss

    ids, mask = batch_tensors([x for x, _, _ in batch], pad_id, critic.value_head.weight.device)
    if lm_head is None:
        logits = critic(ids, mask, every_position=True)
    else:
        hidden = critic._hidden(ids, mask)
        logits = critic._head(hidden)
    rows = torch.tensor([i for i, (_, pos, _) in enumerate(batch) for _ in pos], device=logits.device)
    cols = torch.tensor([c for _, pos, _ in batch for c in pos], device=logits.device)
    targets = torch.tensor([y for _, pos, y in batch for _ in pos], dtype=torch.float32, device=logits.device)
    loss = critic_bce_loss(logits[rows, cols], targets)
    if lm_head is not None:  # the next token exists at every fitted position but an answer's last
        nxt = cols + 1 < mask.sum(dim=1)[rows]
        loss = loss + aux_lm * F.cross_entropy(lm_head(hidden[rows[nxt], cols[nxt]]), ids[rows[nxt], cols[nxt] + 1])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], cfg.critic.max_grad_norm)
    opt.step()
    return len(targets)


def train_and_score(cfg, tok, actor, train: list[Answer], heldout: list[Answer], cond: Condition, args):
    """Train a critic for ``cond``; yields a record at each of ``args.steps``."""
    import numpy as np
    import torch

    critic = make_critic(
        cfg,
        actor,
        tok,
        train,
        cond,
        seed=args.seed,
        bootstrap_critic=str(Path(args.out) / "bootstrap" / "bootstrap" / "critic"),
        cache=Path(args.out),
    )
    data = examples(cfg, tok, train[: cond.answers], cond)
    lm_head = copy.deepcopy(actor.lm_head).float() if cond.aux_lm else None  # trained with the critic
    if not cond.train_backbone:
        critic.backbone.requires_grad_(False)
    params = [p for p in critic.parameters() if p.requires_grad] + (list(lm_head.parameters()) if lm_head is not None else [])
    opt = torch.optim.AdamW(params, lr=cond.lr)
    fit = lambda batch: fit_step(cfg, critic, opt, batch, tok.pad_token_id, lm_head, cond.aux_lm)  # noqa: E731
    rng = np.random.default_rng(args.seed)
    step, t0, cpu0 = 0, time.perf_counter(), time.process_time()
    positions_seen = 0
    critic.train()
    for pre in range(cond.prefit_steps):  # graded slipped solutions: fresh ones every step
        positions_seen += fit(slip_examples(cfg, tok, train, cond, rng, args.batch))
        if (pre + 1) % 100 == 0:
            print(f"    prefit step {pre + 1} ({time.perf_counter() - t0:.0f}s)", flush=True)
    for target in sorted(args.steps):
        critic.train()
        while step < target:
            batch = [data[i] for i in rng.choice(len(data), size=min(args.batch, len(data)), replace=False)]
            positions_seen += fit(batch)
            step += 1
        critic.eval()
        scores = score(cfg, tok, critic, heldout, cond)
        print(f"    step {step}: " + "  ".join(f"{k} {v:.3f}" for k, v in scores.items() if isinstance(v, float)), flush=True)
        yield {
            "steps": step,
            "cpu_s": time.process_time() - cpu0,
            "wall_s": time.perf_counter() - t0,
            "fitted_states": positions_seen,
            **scores,
        }


def score(cfg, tok, critic, heldout: list[Answer], cond: Condition) -> dict:
    """V at every chunk boundary of every held-out answer, and the scores of those values."""
    import torch

    arith = cfg.task.name == "arith"  # only arith has a worked solution to leave
    values, outcomes, depth, has_ref, left, first = [], [], [], [], [], []
    with torch.no_grad():
        for start in range(0, len(heldout), 128):
            part = heldout[start : start + 128]
            inputs = [critic_input(cfg, tok, a, a.response, cond.use_reference) for a in part]
            v = torch.sigmoid(position_logits(critic, inputs, tok.pad_token_id)).cpu()
            for i, (a, x) in enumerate(zip(part, inputs)):
                head = len(x) - len(a.response)
                gone = False  # whether the answer had left the worked solution at its previous cut
                for c in a.cuts:
                    values.append(float(v[i, head - 1 + c]))
                    outcomes.append(a.outcome)
                    depth.append(c)
                    has_ref.append(a.ref is not None)
                    left.append(arith and has_left(tok, a, c))
                    first.append(left[-1] and not gone)
                    gone = left[-1]
    arith_only = (left, first) if arith else (None, None)
    return summarize(values, outcomes, depth, has_ref, cfg.rollout.chunk_tokens, *arith_only)


def has_left(tok, a: Answer, c: int) -> bool:
    """Whether ``a``'s first ``c`` tokens have left its problem's worked solution (arith)."""
    return not a.canonical.startswith(tok.decode(a.response[:c], skip_special_tokens=True))


def summarize(
    values, outcomes, depth, has_ref, chunk: int, left: list[bool] | None = None, first: list[bool] | None = None
) -> dict:
    from ac2_core.math.readiness import auc_error, binned_calibration_error

    def auc(sel):
        v = [x for x, s in zip(values, sel) if s]
        o = [x for x, s in zip(outcomes, sel) if s]
        return 1.0 - auc_error(v, o)

    past = [d >= chunk for d in depth]
    succ = [v for v, o in zip(values, outcomes) if o >= 0.5]
    fail = [v for v, o in zip(values, outcomes) if o < 0.5]
    out = {
        "auc": auc([True] * len(values)),
        "auc_past": auc(past),
        "auc_past_ref": auc([p and r for p, r in zip(past, has_ref)]),
        "gap": statistics.fmean(succ) - statistics.fmean(fail),
        "ece": binned_calibration_error(values, outcomes, n_bins=10),
        "states": len(values),
    }
    # arith: the states past a departure from the worked solution, with a reference
    gone = [(v, o) for v, o, g, r in zip(values, outcomes, left, has_ref) if g and r] if left is not None else []
    if gone:
        out["v_left"] = statistics.fmean(v for v, _ in gone)  # what the critic says there
        out["rate_left"] = statistics.fmean(o for _, o in gone)  # what a calibrated one would say
    # ... at the first cut past the departure alone: how soon the critic commits
    just = [(v, o) for v, o, f, r in zip(values, outcomes, first, has_ref) if f and r] if first is not None else []
    if just:
        out["v_first_left"] = statistics.median(v for v, _ in just)
        out["above_half_first_left"] = statistics.fmean(v > 0.5 for v, _ in just)
        out["rate_first_left"] = statistics.fmean(o for _, o in just)
    return out


def token_losses(model, prefix: list[int], response: list[int]):
    """The next-token loss of each token of ``response`` read after ``prefix``: (len(response),)."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([prefix + response], device=device)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
    return -logp[torch.arange(ids.shape[1] - 1, device=device), ids[0, 1:]][len(prefix) - 1 :].cpu()


def answer_surprise(tok, model, answers: list[Answer], with_reference: bool) -> list:
    """Per answer, the next-token loss of each of its tokens under ``model``: in the critic's
    layout (problem, reference, answer) or, without the reference, in the actor's own."""
    ref_id, state_id = tok.convert_tokens_to_ids("<|ref|>"), tok.convert_tokens_to_ids("<|state|>")

    def head(a: Answer) -> list[int]:
        return a.prompt + ([ref_id] + a.ref if a.ref else []) + [state_id] if with_reference else a.prompt

    return [token_losses(model, head(a), a.response) for a in answers]


def surprise_predictor(cfg, sources: list[tuple[list, list]], train: list[Answer], heldout: list[Answer]) -> dict:
    """V from the answer's surprise so far: a logistic fit on the training states of (largest
    and mean next-token loss of the written tokens under each source, ``answer_surprise`` of
    the training and of the held-out answers; the depth). Trains no backbone: it asks how much
    a model that predicts the answer already knows about its fate."""
    import torch

    def features(answers, losses):
        rows, outcome, depth, has_ref = [], [], [], []
        for i, a in enumerate(answers):
            for c in a.cuts:
                row = [c / cfg.rollout.max_response_tokens]
                for per_answer in losses:
                    seg = per_answer[i][:c]
                    row += [float(seg.max()) if c else 0.0, float(seg.mean()) if c else 0.0]
                rows.append(row)
                outcome.append(a.outcome)
                depth.append(c)
                has_ref.append(a.ref is not None)
        return torch.tensor(rows), outcome, depth, has_ref

    x, y, _, _ = features(train, [t for t, _ in sources])
    mean, std = x.mean(0), x.std(0).clamp(min=1e-6)
    w = torch.zeros(x.shape[1] + 1, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=200)
    target = torch.tensor(y)
    design = torch.cat([(x - mean) / std, torch.ones(len(x), 1)], 1)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(design @ w, target)
        loss.backward()
        return loss

    opt.step(closure)
    hx, outcome, depth, has_ref = features(heldout, [h for _, h in sources])
    with torch.no_grad():
        v = torch.sigmoid(torch.cat([(hx - mean) / std, torch.ones(len(hx), 1)], 1) @ w).tolist()
    return summarize(v, outcome, depth, has_ref, cfg.rollout.chunk_tokens)


def ceiling(cfg, tok, train: list[Answer], heldout: list[Answer]) -> dict[str, dict]:
    """Agreement predictors (arith): P(success | agrees so far, depth) fitted on ``train``."""
    result = {}
    for name, against in (("agree_canonical", lambda a: a.canonical), ("agree_reference", lambda a: a.ref_text)):
        table: dict[tuple, list[float]] = {}

        def key(a, c, against=against):
            ref = against(a)
            if ref is None:
                return ("noref", c)
            return (ref.startswith(tok.decode(a.response[:c], skip_special_tokens=True)), c)

        for a in train:
            for c in a.cuts:
                table.setdefault(key(a, c), []).append(a.outcome)
        rate = {k: statistics.fmean(v) for k, v in table.items()}
        base = statistics.fmean(a.outcome for a in train)
        values, outcomes, depth, has_ref = [], [], [], []
        for a in heldout:
            for c in a.cuts:
                values.append(rate.get(key(a, c), base))
                outcomes.append(a.outcome)
                depth.append(c)
                has_ref.append(a.ref is not None)
        result[name] = summarize(values, outcomes, depth, has_ref, cfg.rollout.chunk_tokens)
    return result


def layout_nll(tok, model, heldout: list[Answer], n: int = 256) -> dict[str, float]:
    """The backbone's next-token loss on held-out answers (with a reference) in the actor's
    layout and in the critic's: how much of what the actor computes survives the critic's input."""
    ref_id, state_id = tok.convert_tokens_to_ids("<|ref|>"), tok.convert_tokens_to_ids("<|state|>")
    heads = {
        "actor: prompt answer": lambda a: a.prompt,
        "critic: prompt <|ref|> reference <|state|> answer": lambda a: a.prompt + [ref_id] + a.ref + [state_id],
        "critic without reference: prompt <|state|> answer": lambda a: a.prompt + [state_id],
    }
    shown = [a for a in heldout if a.ref is not None][:n]
    losses = {name: [token_losses(model, head(a), a.response).mean().item() for a in shown] for name, head in heads.items()}
    return {name: statistics.fmean(v) for name, v in losses.items()}


def trigger_tokens(tok, answers: list[Answer]) -> list[tuple[int, int, str]]:
    """(answer, token, kind) where each answer first meets a step the misconception changes
    (``arith.misconceived_sum``), or first leaves the worked solution elsewhere (arith only, a
    DIAGNOSTIC). Kinds: ``misconception`` (the answer wrote the misconceived digit), ``correct at
    a trigger`` (the right one), ``slip at a trigger`` (another), ``slip`` (it left the solution at a
    step the misconception leaves alone). An answer is followed until it first leaves the solution."""
    from ac2_core.tasks import arith

    found = []
    for i, a in enumerate(answers):
        text = tok.decode(a.response, skip_special_tokens=True)
        if len(text) != len([t for t in a.response if t != tok.eos_token_id]):
            continue  # not one token a character: positions would not line up
        terms = arith.terms_of(tok.decode(a.prompt, skip_special_tokens=True))
        total, at = terms[0], 0
        for term in terms[1:]:
            step = f"{total}+{term}={total + term};"
            head = at + len(step) - len(f"{total + term};")  # where the step's result starts
            # with the step's ';': 2+9 writes 11 or 1, which part at the second token ('1' against ';')
            right, wrong = f"{total + term};", f"{arith.misconceived_sum(total, term)};"
            if right != wrong and text[at:head] == step[: head - at] and len(text) > head:
                j = next(k for k in range(len(right)) if right[k] != wrong[k])
                if text[head : head + j] == right[:j] and len(text) > head + j:
                    kind = {right[j]: "correct at a trigger", wrong[j]: "misconception"}.get(text[head + j], "slip at a trigger")
                    found.append((i, head + j, kind))
                break  # the first trigger an answer meets on the solution, whatever it wrote
            if not text.startswith(step, at):
                off = next((k for k in range(at, min(len(text), at + len(step))) if text[k] != step[k - at]), None)
                if off is not None:
                    found.append((i, off, "slip"))
                break
            at += len(step)
            total += term
    return found


def misconception_surprise(tok, models: dict, answers: list[Answer]) -> list[dict]:
    """The next-token loss of the tokens ``trigger_tokens`` finds, by kind, under each of ``models``
    (name -> (model, layout): ``actor`` the prompt alone, ``critic`` problem, reference and state
    marker, ``critic_noref`` problem and state marker). Answers with a reference only, the states
    the headline AUC is taken on. Also the share of trigger answers that wrote the misconception."""
    ref_id, state_id = tok.convert_tokens_to_ids("<|ref|>"), tok.convert_tokens_to_ids("<|state|>")
    heads = {
        "actor": lambda a: a.prompt,
        "critic": lambda a: a.prompt + [ref_id] + a.ref + [state_id],
        "critic_noref": lambda a: a.prompt + [state_id],
    }
    shown = [a for a in answers if a.ref is not None]
    found = trigger_tokens(tok, shown)
    rows = []
    for name, (model, layout) in models.items():
        wanted = sorted({i for i, _, _ in found})
        losses = {i: token_losses(model, heads[layout](shown[i]), shown[i].response) for i in wanted}
        by_kind: dict[str, list[float]] = {}
        for i, pos, kind in found:
            by_kind.setdefault(kind, []).append(float(losses[i][pos]))
        typical = [float(x) for i in wanted for x in losses[i]]
        by_kind["every answer token (for scale)"] = typical
        for kind, v in by_kind.items():
            rows.append({"condition": f"{name}: {kind}", "misconception": True, "tokens": len(v), "loss": statistics.fmean(v)})
    return rows


# ---------------------------------------------------------------- report


def report(records: list[dict], meta: dict, reproduce: str) -> str:
    """The Markdown report: the ceiling, then condition x steps, from every record (newest wins)."""
    latest: dict[tuple, dict] = {}
    for r in records:
        latest[(r["condition"], r.get("steps", 0))] = r
    ceilings = [r for (_, _), r in latest.items() if r.get("ceiling")]
    layouts = [r for r in latest.values() if r.get("layout")]
    surprises = [r for r in latest.values() if r.get("surprise")]
    misconceptions = [r for r in latest.values() if r.get("misconception")]
    runs = sorted((r for r in latest.values() if "steps" in r), key=lambda r: (r["condition"], r["steps"]))
    lines = [
        "# Critic learning: how well a critic judges partial answers, against training steps",
        "",
        f"Reproduce: `{reproduce}`",
        "",
        f"Data: {meta['train']:,} answers of {meta['train_problems']:,} problems to train on, {meta['heldout']:,} answers of"
        f" {meta['heldout_problems']:,} other problems held out ({meta['states']:,} held-out states at chunk boundaries);"
        f" success rate {meta['success']:.3f}; {meta['with_ref']:.0%} of the answers have a reference. Decoded:"
        f" {meta['decoded']:,} tokens (the answers and the reference answers). Batch: {meta['batch']} answers (dense) or"
        " states (cuts) per step, AdamW.",
        "",
        "Scores on the held-out states: **AUC past the first chunk, with a reference** (the headline: the states a ready"
        " problem's chunks reach), AUC past the first chunk, AUC on all states, the value gap (mean V on states whose"
        " answer succeeded minus on those that failed) and the binned calibration error (10 bins).",
        "",
        "## The ceiling (arith): does the partial answer still agree?",
        "",
        "| predictor | AUC past 1st chunk, with ref | AUC past 1st chunk | AUC | gap | calibration error |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [_predictor_row(r) for r in ceilings]
    lines += [
        "",
        "agree_canonical: P(success | the partial answer is a prefix of the worked solution, depth), fitted on the training"
        " states; agree_reference: the same against the reference the critic is shown.",
        "",
        *(
            [
                "## Predictors that train no backbone: the answer's surprise so far",
                "",
                "V = a logistic fit on the training states of the depth and the largest and mean next-token loss of the"
                " tokens written so far (`surprise_predictor`): under the warm-started actor in its own layout (no"
                " reference), under the read backbone in the critic's layout (with the reference), or both.",
                "",
                "| predictor | AUC past 1st chunk, with ref | AUC past 1st chunk | AUC | gap | calibration error |",
                "|---|---:|---:|---:|---:|---:|",
                *(_predictor_row(r) for r in surprises),
                "",
            ]
            if surprises  # fitted apart from the conditions; a report without such records has no such table
            else []
        ),
        "## The backbone in the critic's layout",
        "",
        "The warm-started actor's next-token loss on held-out answers that have a reference, a token, as the critic"
        " copies it (before any reading or value fit):",
        "",
        "| layout | answer loss a token |",
        "|---|---:|",
        *(f"| {r['condition'].replace('|', chr(92) + '|')} | {r['nll']:.3f} |" for r in layouts),
        "",
        *(
            [
                "## The misconception (`warm_start.misconception_rate`, a DIAGNOSTIC): what surprise says at its trigger",
                "",
                "A trigger is the first step of an answer, still on the worked solution, whose result the misconception"
                " changes (a term ending in 9 with a carry out of the ones place); its token is the first digit where"
                " the right and the misconceived results differ. Held-out answers that have a reference; the next-token"
                " loss of that token under each model in its own layout (the actor: the prompt; a reader: the critic's"
                " layout, with or without the reference). `slip`: the token where an answer first left the solution at"
                " a step the misconception leaves alone.",
                "",
                "| what | tokens | loss a token, or share |",
                "|---|---:|---:|",
                *(f"| {r['condition']} | {r['tokens']:,} | {r.get('share', r.get('loss', 0.0)):.3f} |" for r in misconceptions),
                "",
            ]
            if misconceptions  # only a variant with the misconception has such records
            else []
        ),
        "## Critics: condition x steps",
        "",
        "| condition | what it is | steps | AUC past 1st chunk, with ref | AUC past 1st chunk | AUC | gap | calibration error |"
        " V after leaving the solution (its success rate) | median V at the first cut past leaving (its success rate)"
        " | fitted states | device | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in runs:
        cond = CONDITIONS.get(r["condition"])
        what = describe(cond) if cond else ""
        lines.append(
            f"| {r['condition']} | {what} | {r['steps']} | {r['auc_past_ref']:.3f} | {r['auc_past']:.3f} | {r['auc']:.3f} |"
            f" {r['gap']:.3f} | {r['ece']:.3f} | {_left(r)} | {_first_left(r)} | {r['fitted_states']:,}"
            f" | {r.get('device', 'cpu')} | {r.get('load', 0):.1f} |"
        )
    lines += ["", MARKER, ""]
    return "\n".join(lines)


def _left(r: dict) -> str:
    """V on the states past a departure from the worked solution, and how often they succeed (arith; newer records)."""
    return f"{r['v_left']:.3f} ({r['rate_left']:.3f})" if "v_left" in r else "-"


def _first_left(r: dict) -> str:
    """The median V at the first cut past a departure, the share of those values above 0.5, and how often such
    states succeed (arith; newer records)."""
    if "v_first_left" not in r:
        return "-"
    return f"{r['v_first_left']:.3f}, {r['above_half_first_left']:.0%} > 0.5 ({r['rate_first_left']:.3f})"


def _predictor_row(r: dict) -> str:
    """A table row of a predictor that is not trained in steps: its name and its scores."""
    return f"| {r['condition']} | " + " | ".join(f"{r[k]:.3f}" for k in ("auc_past_ref", "auc_past", "auc", "gap", "ece")) + " |"


def describe(c: Condition) -> str:
    parts = ["dense" if c.dense else "cuts", f"lr {c.lr:g}", "ref" if c.use_reference else "no ref"]
    if c.read_steps:
        parts.append(f"reads {c.read_steps} steps on {c.read_on}")
    if c.read_continues:
        parts.append(f"(the last {c.read_steps - c.read_continues} after the cached {c.read_continues}, a fresh AdamW)")
    if c.read_focus:
        parts.append(f"each read token weighted by its own loss, capped at {c.read_focus:g} nats")
    if c.surprise:
        parts.append("reads its surprise (largest and mean next-token loss so far)")
    if not c.train_backbone:
        parts.append("trains the head alone")
    if c.aux_lm:
        parts.append(f"next-token loss on the answer beside V (weight {c.aux_lm:g})")
    if c.prefit_steps:
        parts.append(f"first fits V {c.prefit_steps} steps on graded slipped solutions (slip {c.prefit_slip:g})")
    if c.answers:
        parts.append(f"fits {c.answers:,} answers")
    if c.reference_match:
        parts.append("reads its run along the reference" + (" and whether it has left it" if c.left_flag else ""))
    if c.backbone == "bootstrap":
        parts.append("the bootstrap's critic (as the config made it)")
    return ", ".join(parts)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "pipelines" / "configs" / "toy.yaml"))
    p.add_argument("--set", nargs=2, action="append", default=[], metavar=("KEY", "VALUE"), help="config override (JSON value)")
    p.add_argument("--out", default=str(ROOT / "bench" / "runs" / "critic_learning"))
    p.add_argument("--conditions", nargs="+", default=list(CONDITIONS), choices=list(CONDITIONS))
    p.add_argument("--steps", nargs="+", type=int, default=[100, 200, 500, 1000])
    p.add_argument("--batch", type=int, default=64, help="answers (dense) or states (cuts) per step")
    p.add_argument("--train-problems", type=int, default=3000)
    p.add_argument("--heldout-problems", type=int, default=300)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the critics train (data is made on the cpu)")
    p.add_argument(
        "--records", help="records file to append to (default: records.jsonl under --out); the report reads every *.jsonl there"
    )
    p.add_argument("--report-only", action="store_true", help="rebuild the report from the records and stop")
    p.add_argument(
        "--results",
        default=str(RESULTS),
        help="the report to write (default: bench/results/critic_learning.md); a task variant's runs (--set) keep their own",
    )
    args = p.parse_args(argv)
    args.set = [(k, _value(v)) for k, v in args.set]

    import torch

    torch.set_num_threads(args.threads)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    cfg = load_cfg(args)
    layout = bootstrap(args, cfg)
    data = sample_answers(args, cfg, layout)

    from ac2_core.models.store import ModelStore
    from ac2_core.stages.common import Problems

    ckpt = ModelStore(cfg).load(layout.bootstrap("actor"), kind="actor")
    tok = ckpt.tokenizer
    probs = Problems.load(layout.bootstrap("problems"))
    train, heldout = answers_of(cfg, tok, probs, data, "train"), answers_of(cfg, tok, probs, data, "heldout")
    print(
        f"answers: {len(train)} train, {len(heldout)} held out; success {statistics.fmean(a.outcome for a in train):.3f};"
        f" with a reference {statistics.fmean(a.ref is not None for a in train):.2f}; decoded {data['decoded_tokens']:,} tokens",
        flush=True,
    )
    records_path = Path(args.records or Path(args.out) / "records.jsonl")
    meta = {
        "train": len(train),
        "heldout": len(heldout),
        "train_problems": args.train_problems,
        "heldout_problems": args.heldout_problems,
        "states": sum(len(a.cuts) for a in heldout),
        "success": statistics.fmean(a.outcome for a in train),
        "with_ref": statistics.fmean(a.ref is not None for a in train),
        "decoded": data["decoded_tokens"],
        "batch": args.batch,
    }
    reproduce = "nice .venv/bin/python bench/critic_learning.py " + reproduce_args(args, p)
    results = Path(args.results)

    def publish_report() -> None:
        records = load_records(records_path.parent)
        text = report(records, meta, reproduce)
        kept = results.read_text().split(MARKER, 1)[1] if results.exists() and MARKER in results.read_text() else "\n"
        publish(text.rstrip("\n") + kept, results)

    if args.report_only:
        publish_report()
        return
    ckpt.model.to(args.device)
    for name, result in ceiling(cfg, tok, train, heldout).items():
        print(f"ceiling {name}: " + "  ".join(f"{k} {v:.3f}" for k, v in result.items() if isinstance(v, float)), flush=True)
        _append(records_path, {"condition": name, "ceiling": True, **result})
    for name, nll in layout_nll(tok, ckpt.model, heldout).items():
        print(f"layout {name}: answer loss {nll:.3f} a token", flush=True)
        _append(records_path, {"condition": name, "layout": True, "nll": nll})
    for name in args.conditions:
        cond = CONDITIONS[name]
        print(f"[{name}] {describe(cond)}", flush=True)
        for row in train_and_score(cfg, tok, ckpt.model, train, heldout, cond, args):
            _append(
                records_path, {"condition": name, "batch": args.batch, "device": args.device, "load": os.getloadavg()[0], **row}
            )
        publish_report()
    if cfg.task.name == "arith" and cfg.warm_start.misconception_rate:
        for row in misconception_rows(cfg, tok, ckpt.model, train, heldout, args):
            print(f"misconception {row['condition']}: " + "  ".join(f"{k} {v}" for k, v in row.items() if k != "condition"))
            _append(records_path, {**row, "load": os.getloadavg()[0]})
        publish_report()


def misconception_rows(cfg, tok, actor, train: list[Answer], heldout: list[Answer], args) -> list[dict]:
    """The variant's diagnostics (arith, DIAGNOSTIC): how often an answer that meets a trigger writes
    the misconception, on problems whose demonstrations held it and on the others (a policy that had
    memorized which problems do would write it on those alone), and the surprise of the trigger's
    tokens under the actor and under each reading condition's backbone in its own layout."""
    from ac2_core.tasks import arith

    rows = []
    for label, wanted in (("demonstrations held it", True), ("demonstrations did not", False)):
        picked = [
            a
            for a in train
            if arith.misconceived(
                arith.terms_of(tok.decode(a.prompt, skip_special_tokens=True)),
                rate=cfg.warm_start.misconception_rate,
                seed=cfg.task.seed,
            )
            == wanted
        ]
        kinds = [k for _, _, k in trigger_tokens(tok, picked) if k != "slip"]
        rows.append(
            {
                "condition": f"share of trigger answers that wrote the misconception, problems whose {label}",
                "misconception": True,
                "tokens": len(kinds),
                "share": kinds.count("misconception") / max(len(kinds), 1),
            }
        )
    models = {"actor": (actor, "actor")}
    for name in args.conditions:
        cond = CONDITIONS[name]
        if cond.read_steps and cond.backbone == "actor":
            reader = read_backbone(cfg, actor, tok, train, cond, args.seed, Path(args.out))
            models[f"reader of {name}"] = (reader, "critic" if cond.use_reference else "critic_noref")
    return rows + misconception_surprise(tok, models, heldout)


def reproduce_args(args, parser) -> str:
    """The options of this invocation that differ from their defaults, as a command line (--report-only aside)."""
    import shlex

    parts = []
    for name in ("config", "out", "results", "train_problems", "heldout_problems", "samples", "batch", "seed"):
        value = getattr(args, name)
        if value != parser.get_default(name):
            parts += [f"--{name.replace('_', '-')}", str(value)]
    for key, value in args.set:
        parts += ["--set", key, json.dumps(value)]
    if args.steps != parser.get_default("steps"):
        parts += ["--steps", *map(str, args.steps)]
    parts += ["--conditions", *args.conditions]
    return shlex.join(parts)


def load_records(folder: Path) -> list[dict]:
    """Every record of every ``*.jsonl`` in ``folder``, oldest file first: the report keeps the
    last row of each (condition, steps), so a newer run's row wins and runs kept apart meet."""
    files = sorted(folder.glob("*.jsonl"), key=lambda f: f.stat().st_mtime)
    return [json.loads(line) for f in files for line in f.read_text().splitlines() if line.strip()]


def _append(path: Path, record: dict) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record) + "\n")


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


if __name__ == "__main__":
    main()
