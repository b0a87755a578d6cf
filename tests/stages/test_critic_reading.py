"""The critic's reading warm-up in the bootstrap: its data and its effect."""

from __future__ import annotations

import numpy as np
import torch

from ac2_core.models.store import ModelStore
from ac2_core.models.tokenizer import build_tokenizer, special_ids
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from ac2_core.stages.bootstrap import demonstrations, reading_examples
from ac2_core.tasks import arith, problems_for
from tests.conftest import tiny_config


def test_reading_examples_put_one_demonstration_under_another():
    cfg = tiny_config(warm_start__slip_rate=0.5, task__n_terms=6, critic__max_input_tokens=256)
    rows = [r for r in problems_for(cfg.task).to_pylist() if r["split"] == "train"][:50]
    tok = build_tokenizer(r["prompt"] + r["solution"] for r in rows)
    ids = special_ids(tok)
    refs, answers = demonstrations(cfg, rows, stream=1), demonstrations(cfg, rows, stream=2)
    parted = 0
    for r, ref, answer, (x, n) in zip(rows, refs, answers, reading_examples(cfg, tok, rows)):
        # layout: prompt <|ref|> reference <|state|> answer eos, loss on answer + eos
        assert tok.decode(x[:n], skip_special_tokens=False) == f"{r['prompt']}<|ref|>{ref}<|state|>"
        assert x[n - 1] == ids["state"] and x[n:] == tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
        parted += ref != answer
    # at a slip rate of 0.5 per step (5 steps), nearly every pair parts somewhere, and not
    # identically (the two are drawn apart); without slips, the answer is the reference
    assert parted > 40
    exact = tiny_config(task__n_terms=6, critic__max_input_tokens=256)
    assert demonstrations(exact, rows, stream=1) == [r["solution"] for r in rows]
    # a critic without the reference reads in its own layout: the answer under the prompt alone
    blind = tiny_config(warm_start__slip_rate=0.5, task__n_terms=6, critic__max_input_tokens=256, critic__use_reference=False)
    for r, answer, (x, n) in zip(rows, answers, reading_examples(blind, tok, rows)):
        assert ids["ref"] not in x and tok.decode(x[:n], skip_special_tokens=False) == f"{r['prompt']}<|state|>"
        assert x[n:] == tok.encode(answer, add_special_tokens=False) + [tok.eos_token_id]
    # an input too long keeps the newest tokens of the answer, and the loss falls on those alone
    short = tiny_config(warm_start__slip_rate=0.5, task__n_terms=6, critic__max_input_tokens=90)
    for x, n in reading_examples(short, tok, rows):
        assert len(x) == 90 and x[n - 1] == ids["state"] and x[-1] == tok.eos_token_id


def test_misconceived_problems_are_worked_out_under_the_misconception_in_every_demonstration():
    cfg = tiny_config(warm_start__misconception_rate=0.5, task__n_terms=10, task__train_size=400)
    rows = [r for r in problems_for(cfg.task).to_pylist() if r["split"] == "train"][:200]
    streams = [demonstrations(cfg, rows, stream=s) for s in (0, 1, 2)]
    # no slips (the tiny config's slip_rate is 0): a demonstration is the worked solution or the misconceived one
    for i, r in enumerate(rows):
        terms = arith.terms_of(r["prompt"])
        wrong = arith.misconceived(terms, rate=0.5, seed=cfg.task.seed)
        expected = arith.slipped_solution(terms, slip_rate=0.0, rng=np.random.default_rng(0), misconceived=wrong)
        assert streams[0][i] == streams[1][i] == streams[2][i] == expected  # the warm start's and both reading demos agree
    # half the problems are misconceived and 1 - 0.91^9 = 57% of those meet a trigger (a term ending in 9
    # with a carry, 0.09 a step): about 57 of 200 differ from the worked solution (sd ~7)
    changed = sum(d != r["solution"] for d, r in zip(streams[0], rows))
    assert 30 < changed < 85
    assert streams[0] == demonstrations(cfg, rows, stream=0)  # deterministic
    # more trigger digits: a demonstration is the worked solution (which takes no fork at a 7, 8 or 9) or
    # leaves it at its first such trigger; every problem misconceived at a 9 still is, and more change
    more = tiny_config(warm_start__misconception_rate=0.5, warm_start__misconception_digits=(7, 8, 9), task__n_terms=10)
    wider = demonstrations(more, rows, stream=0)
    for d, narrow, r in zip(wider, streams[0], rows):
        choices = arith.trigger_choices(arith.terms_of(r["prompt"]), d, (7, 8, 9))
        assert (d == r["solution"] and True not in choices) or choices == [True]
        assert narrow == r["solution"] or d != r["solution"]
    assert sum(d != r["solution"] for d, r in zip(wider, rows)) > changed


def test_reading_changes_the_critic_backbone_and_leaves_the_actor(tmp_path):
    base = tiny_config(warm_start__max_steps=4)
    reads = tiny_config(warm_start__max_steps=4, critic__read_steps=3)
    assert base.bootstrap_hash() != reads.bootstrap_hash()
    weights = {}
    for name, cfg in (("base", base), ("reads", reads)):
        layout = RunLayout(str(tmp_path / name))
        inprocess.run_bootstrap(cfg, layout, log=lambda _: None)
        store = ModelStore(cfg)
        weights[name] = (
            store.load(layout.bootstrap("actor"), kind="actor").model.state_dict(),
            store.load(layout.bootstrap("critic"), kind="critic").model.backbone.state_dict(),
        )
    (actor_a, critic_a), (actor_b, critic_b) = weights["base"], weights["reads"]
    assert all(torch.equal(actor_a[k], actor_b[k]) for k in actor_a)  # the actor does not read
    assert any(not torch.equal(critic_a[k], critic_b[k]) for k in critic_a)  # the critic's backbone did
    # without reading, the critic's backbone is the actor's own
    assert all(torch.equal(critic_a[k], actor_a[f"model.{k}"]) for k in critic_a)
