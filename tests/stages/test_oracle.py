"""An AC2 iteration with the diagnostic oracle critic on the tiny model."""

from __future__ import annotations

from ac2_core import storage
from ac2_core.models.store import ModelStore
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from ac2_core.stages.common import Problems
from ac2_core.tasks.arith import agrees
from tests.conftest import tiny_config


def test_oracle_values_follow_the_worked_solution_and_the_critic_is_not_trained(run_dir):
    cfg = tiny_config(critic__kind="oracle")
    layout = RunLayout(str(run_dir))
    store = ModelStore(cfg)
    for it in (1, 2):
        inprocess.run_iteration(cfg, layout, it, store)
    probs = Problems.load(layout.bootstrap("problems"))
    tok = store.tokenizer(layout.bootstrap("actor"), kind="actor")
    scored = {s["chunk_id"]: s for s in storage.read_rows(layout.output(2, "scored_chunks"), kind="scored_chunks")}
    pairs = storage.read_rows(layout.output(2, "critic_pairs"), kind="critic_pairs")
    assert pairs
    for p in pairs:
        state = tok.decode(scored[p["trajectory_id"]]["response_token_ids"][: p["cut"]], skip_special_tokens=True)
        on_track = agrees(probs[p["problem_id"]]["solution"], state)
        assert (p["prediction"] > 0.0) == on_track, (state, p["prediction"])
        assert p["prediction"] < 1.0
    assert all(s["critic_flops"] == 0.0 for s in scored.values())
    # the oracle is a diagnostic: the critic checkpoint passes through untrained
    before = store.load(layout.bootstrap("critic"), kind="critic").model.state_dict()
    after = store.load(layout.output(2, "critic"), kind="critic").model.state_dict()
    assert all(bool((before[k] == after[k]).all()) for k in before)


def test_blind_critic_gives_every_state_the_iterations_success_rate_and_is_not_trained(run_dir):
    cfg = tiny_config(critic__kind="blind")
    layout = RunLayout(str(run_dir))
    store = ModelStore(cfg)
    for it in (1, 2):
        inprocess.run_iteration(cfg, layout, it, store)
    scored = storage.read_rows(layout.output(2, "scored_chunks"), kind="scored_chunks")
    pairs = storage.read_rows(layout.output(2, "critic_pairs"), kind="critic_pairs")
    assert pairs
    rewards = [s["reward"] for s in scored if s["mode"] == "full" and s["finished"] and s["reward"] is not None]
    rate = (sum(rewards) + 1.0) / (len(rewards) + 2.0)
    assert {p["prediction"] for p in pairs} == {rate}
    unfinished = [s for s in scored if not s["finished"]]
    assert unfinished and all(s["target"] == rate for s in unfinished)
    assert all(s["critic_flops"] == 0.0 for s in scored)
    before = store.load(layout.bootstrap("critic"), kind="critic").model.state_dict()
    after = store.load(layout.output(2, "critic"), kind="critic").model.state_dict()
    assert all(bool((before[k] == after[k]).all()) for k in before)
