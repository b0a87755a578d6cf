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
