"""critic.dense: one pass over a whole answer scores, and fits, every state along it."""

from __future__ import annotations

import dataclasses

import pytest

from ac2_core import storage
from ac2_core.models.store import ModelStore
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from tests.conftest import tiny_config


def _score(cfg, layout, out):
    """score_chunks of iteration 2, written under ``out``; returns (stats, scored rows, pairs)."""
    (call,) = [c for c in inprocess.stage_calls(cfg, layout, 2) if c.stage == "score_chunks"]
    kwargs = call.kwargs | {"out_scored_chunks": str(out / "scored"), "out_critic_pairs": str(out / "pairs")}
    stats = dataclasses.replace(call, kwargs=kwargs).run(cfg, store=ModelStore(cfg))
    return (
        stats,
        storage.read_rows(str(out / "scored"), kind="scored_chunks"),
        storage.read_rows(str(out / "pairs"), kind="critic_pairs"),
    )


def test_one_pass_per_answer_gives_the_values_of_one_pass_per_state(run_dir, tmp_path):
    # the bootstrap critic has a zero head (V = 0.5 everywhere), so train it once (iteration 1)
    # to make the values differ from state to state
    cfg = tiny_config(critic__dense=False, critic__max_input_tokens=128)
    layout = RunLayout(str(run_dir))
    store = ModelStore(cfg)
    inprocess.run_iteration(cfg, layout, 1, store)
    for call in inprocess.stage_calls(cfg, layout, 2):
        if call.stage in ("sample_prefixes", "generate_chunks"):
            call.run(cfg, store=store)
    state_stats, state_rows, state_pairs = _score(cfg, layout, tmp_path / "state")
    dense = tiny_config(critic__dense=True, critic__max_input_tokens=128)
    dense_stats, dense_rows, dense_pairs = _score(dense, layout, tmp_path / "dense")
    assert [p["pair_id"] for p in dense_pairs] == [p["pair_id"] for p in state_pairs] and state_pairs
    predictions = [p["prediction"] for p in state_pairs]
    assert max(predictions) - min(predictions) > 1e-3  # the values really vary
    for a, b in zip(dense_pairs, state_pairs):
        assert a["prediction"] == pytest.approx(b["prediction"], abs=1e-5)
        assert a["critic_tokens"] == b["critic_tokens"]
    for a, b in zip(dense_rows, state_rows):
        for field in ("value_start", "value_end", "target"):
            assert (a[field] is None) == (b[field] is None)
            if a[field] is not None:
                assert a[field] == pytest.approx(b[field], abs=1e-5)
    # one pass per chunk (identical responses once), instead of one per distinct state
    responses = {(r["problem_id"], tuple(r["response_token_ids"])) for r in dense_rows}
    assert sum(r["critic_flops"] > 0 for r in dense_rows) == len(responses)
    assert dense_stats.critic_inputs == state_stats.critic_inputs > 0


def test_dense_examples_fit_every_state_of_an_answer_at_the_weight_of_its_pairs(run_dir):
    from ac2_core.stages.common import Problems
    from ac2_core.stages.critic_io import CriticInputs
    from ac2_core.stages.update_critic import training_examples

    cfg = tiny_config(critic__max_input_tokens=128)
    layout = RunLayout(str(run_dir))
    store = ModelStore(cfg)
    for call in inprocess.stage_calls(cfg, layout, 1):
        if call.stage in ("sample_prefixes", "generate_chunks", "score_chunks"):
            call.run(cfg, store=store)
    read = lambda name: storage.read_rows(layout.output(1, name), kind=name)  # noqa: E731
    scored, pairs = read("scored_chunks"), read("critic_pairs")
    # the untrained tiny policy solves nothing: give every other answer a success, so that a
    # state fitted with the wrong answer's outcome would show
    won = sorted({p["trajectory_id"] for p in pairs})[::2]
    pairs = [{**p, "outcome": float(p["trajectory_id"] in won)} for p in pairs]
    tok = store.tokenizer(layout.bootstrap("actor"), kind="actor")
    builder = CriticInputs(cfg, tok, Problems.load(layout.bootstrap("problems")), read("replay"))
    by_state = training_examples(
        cfg.model_copy(update={"critic": cfg.critic.model_copy(update={"dense": False})}), builder, pairs, scored
    )
    dense = training_examples(cfg, builder, pairs, scored)
    # every pair's state is fitted in the dense examples too, at its last token, with its outcome
    # (the G answers of a group share early states: compare the weighted mean target of each state)
    fitted: dict[tuple, list[float]] = {}
    for x, at in dense:
        for position, target, weight in at:
            acc = fitted.setdefault(tuple(x[: position + 1]), [0.0, 0.0])
            acc[0] += weight * target
            acc[1] += weight
    outcomes = {p["outcome"] for p in pairs}
    for x, at in by_state:
        ((position, target, _),) = at
        assert position == len(x) - 1 and fitted[tuple(x)][0] / fitted[tuple(x)][1] == pytest.approx(target)
    # and each answer weighs about as much as its pairs: 1/L a token, one pair per L tokens (or part of L)
    answers = {p["trajectory_id"] for p in pairs}
    total_dense, total_pairs = (sum(w for _, at in ex for _, _, w in at) for ex in (dense, by_state))
    assert total_pairs - len(answers) <= total_dense <= total_pairs
    assert sum(len(at) for _, at in dense) > sum(len(at) for _, at in by_state)  # more states than chunk boundaries
    assert outcomes == {0.0, 1.0}  # both outcomes, so a wrong pairing of states and targets would show


def test_update_critic_also_fits_the_answers_replay_holds_from_recent_iterations(run_dir, tmp_path):
    cfg = tiny_config(critic__max_input_tokens=128)
    layout = RunLayout(str(run_dir))
    store = ModelStore(cfg)
    inprocess.run_iteration(cfg, layout, 1, store)
    calls = {c.stage: c for c in inprocess.stage_calls(cfg, layout, 2)}
    for stage in ("sample_prefixes", "generate_chunks", "score_chunks"):
        calls[stage].run(cfg, store=store)
    replayed = [
        t
        for t in storage.read_rows(layout.output(2, "replay"), kind="replay")
        if t["iteration"] == 1 and t["finished"] and t["reward"] is not None
    ]
    assert replayed
    fits = {}
    for window in (0, 1):
        c = tiny_config(critic__max_input_tokens=128, critic__replay_iterations=window)
        call = dataclasses.replace(
            calls["update_critic"], kwargs=calls["update_critic"].kwargs | {"out_critic": str(tmp_path / f"w{window}")}
        )
        fits[window] = call.run(c, store=ModelStore(c))
    # iteration 1's answers are new inputs beside iteration 2's own (distinct answers, distinct inputs)
    distinct = len({(t["problem_id"], tuple(t["token_ids"])) for t in replayed})
    assert fits[0].examples < fits[1].examples <= fits[0].examples + distinct
    assert fits[1].critic_tokens > fits[0].critic_tokens
