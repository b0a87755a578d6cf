"""An AC2 iteration with the diagnostic oracle critic on the tiny model."""

from __future__ import annotations

import shutil

import pytest

from ac2_core import storage
from ac2_core.models.store import ModelStore
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from ac2_core.stages.common import Problems
from ac2_core.stages.oracle_critic import chunk_group_class, whole_answer_rates
from ac2_core.tasks.arith import agrees
from tests.conftest import tiny_config


def _two_iterations(kind: str, run_dir) -> tuple[RunLayout, ModelStore]:
    cfg = tiny_config(critic__kind=kind)
    layout = RunLayout(str(run_dir))
    store = ModelStore(cfg)
    for it in (1, 2):
        inprocess.run_iteration(cfg, layout, it, store)
    return layout, store


def _assert_critic_untrained(layout: RunLayout, store: ModelStore) -> None:
    """A diagnostic critic is never trained: its checkpoint only passes through."""
    before = store.load(layout.bootstrap("critic"), kind="critic").model.state_dict()
    after = store.load(layout.output(2, "critic"), kind="critic").model.state_dict()
    assert all(bool((before[k] == after[k]).all()) for k in before)


def test_oracle_values_follow_the_worked_solution_and_the_critic_is_not_trained(run_dir):
    layout, store = _two_iterations("oracle", run_dir)
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
    _assert_critic_untrained(layout, store)


def test_blind_critic_gives_every_state_the_oracles_rate_from_the_start_and_is_not_trained(run_dir):
    layout, store = _two_iterations("blind", run_dir)
    probs = Problems.load(layout.bootstrap("problems"))
    tok = store.tokenizer(layout.bootstrap("actor"), kind="actor")
    read = lambda it, name: storage.read_rows(layout.output(it, name), kind=name)  # noqa: E731
    # iteration 1 decodes whole answers: the blind value is the oracle's rate at depth 0, where
    # every whole answer is still on track
    first = read(1, "scored_chunks")
    depths, rates = whole_answer_rates(
        first, lambda pid: probs[pid]["solution"], lambda ids: tok.decode(ids, skip_special_tokens=True)
    )
    assert any(s["mode"] == "full" and s["finished"] for s in first) and depths[0] == 0
    (value,) = {p["prediction"] for p in read(1, "critic_pairs")}  # one value for every state
    assert value == pytest.approx(rates[0], rel=1e-6)  # stored as float32
    # iteration 2 is all chunks: without a whole answer the value is an honest "don't know"
    scored, pairs = read(2, "scored_chunks"), read(2, "critic_pairs")
    assert pairs and not any(s["mode"] == "full" for s in scored)
    assert {p["prediction"] for p in pairs} == {0.5}
    unfinished = [s for s in scored if not s["finished"]]
    assert unfinished and all(s["target"] == 0.5 for s in unfinished)
    assert all(s["critic_flops"] == 0.0 for s in first + scored)
    _assert_critic_untrained(layout, store)


def test_an_oracle_hybrid_replaces_the_learned_values_of_the_groups_it_names_and_no_others(tmp_path, _bootstrap_dir):
    runs = {}
    for name, overrides in {"learned": {}, "hybrid": {"critic__oracle_groups": ["mixed", "agreeing"]}}.items():
        shutil.copytree(_bootstrap_dir, tmp_path / name / "bootstrap")
        cfg = tiny_config(**overrides)
        layout, store = RunLayout(str(tmp_path / name)), ModelStore(cfg)
        for it in (1, 2):
            inprocess.run_iteration(cfg, layout, it, store)
        runs[name] = (layout, store)
    layout, store = runs["hybrid"]
    probs = Problems.load(layout.bootstrap("problems"))
    tok = store.tokenizer(layout.bootstrap("actor"), kind="actor")
    text = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    read = lambda name, file: storage.read_rows(runs[name][0].output(2, file), kind=file)  # noqa: E731
    learned, hybrid = read("learned", "scored_chunks"), read("hybrid", "scored_chunks")
    prefixes = {p["prefix_id"]: text(p["prefix_token_ids"]) for p in read("hybrid", "prefixes")}
    assert [s["chunk_id"] for s in learned] == [s["chunk_id"] for s in hybrid]  # the same decoding: only values differ
    groups: dict[str, list[tuple[dict, dict]]] = {}
    for a, b in zip(learned, hybrid):
        groups.setdefault(b["prefix_id"], []).append((a, b))
    seen = set()
    for prefix_id, rows in groups.items():
        solution = probs[rows[0][1]["problem_id"]]["solution"]
        continuations = [(text(b["response_token_ids"]), b["finished"], b["reward"]) for _, b in rows]
        kind = chunk_group_class(solution, prefixes[prefix_id], continuations, tiny_config().replay.success_threshold)
        seen.add(kind)
        for a, b in rows:
            if b["finished"]:
                assert b["target"] == a["target"] == a["reward"]
            elif kind == "off_prefix":  # not named: the learned critic's value
                assert b["target"] == a["target"]
            else:  # the oracle's: 0 off the solution, a depth rate in (0, 1) on it
                on = agrees(solution, text(b["response_token_ids"]))
                assert (b["target"] > 0.0) == on and b["target"] < 1.0
                assert on or b["target"] != a["target"]  # the learned critic never says exactly 0
    assert {"off_prefix", "agreeing"} <= seen  # (the tiny model's second iteration writes no mixed group)
    # the critic's predictions on whole answers are the learned critic's, hybrid or not
    assert [p["prediction"] for p in read("learned", "critic_pairs")] == [p["prediction"] for p in read("hybrid", "critic_pairs")]
