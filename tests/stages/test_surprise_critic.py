"""Critics with features beside the hidden state (surprise, the reference match) through the real stages: bootstrap,
scoring, fitting, checkpoints."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from ac2_core import storage
from ac2_core.models.critic import MATCH_FEATURES, SURPRISE_FEATURES
from ac2_core.models.store import ModelStore
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from tests.conftest import tiny_config
from tests.stages.test_stages import rows, run_stages


def _weights(uri: str, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(storage.local_model_dir(uri, kind="critic") / name))


def test_a_critic_with_surprise_scores_and_fits_its_head_alone_when_the_backbone_is_frozen(tmp_path):
    cfg = tiny_config(critic__surprise=True, critic__train_backbone=False, critic__dense=True)
    layout = RunLayout(str(tmp_path / "run"))
    inprocess.run_bootstrap(cfg, layout, log=lambda _: None)
    for it in (1, 2):
        run_stages(cfg, layout, it)
    first, last = layout.bootstrap("critic"), layout.output(2, "critic")
    before, after = _weights(first, "model.safetensors"), _weights(last, "model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)  # the backbone as made
    assert torch.equal(_weights(first, "lm_head.safetensors")["weight"], _weights(last, "lm_head.safetensors")["weight"])
    head = _weights(last, "value_head.safetensors")["weight"]
    assert head.shape[1] == before["embed_tokens.weight"].shape[1] + 3 and head[0, -3:].abs().sum() > 0
    # scored out of sample every iteration, with values that differ between states
    pairs = rows(layout, 2, "critic_pairs")
    assert pairs and len({round(p["prediction"], 6) for p in pairs}) > 1


def test_a_critic_with_surprise_that_trains_its_backbone_keeps_the_next_token_head(tmp_path):
    cfg = tiny_config(critic__surprise=True)
    layout = RunLayout(str(tmp_path / "run"))
    inprocess.run_bootstrap(cfg, layout, log=lambda _: None)
    run_stages(cfg, layout, 1)
    first, last = layout.bootstrap("critic"), layout.output(1, "critic")
    before, after = _weights(first, "model.safetensors"), _weights(last, "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(_weights(first, "lm_head.safetensors")["weight"], _weights(last, "lm_head.safetensors")["weight"])


def test_the_first_fit_gives_the_bootstraps_critic_the_reference_match_and_a_fitted_head_keeps_its_inputs(tmp_path):
    cfg = tiny_config(critic__reference_match=True, critic__train_backbone=False, critic__dense=True)
    layout = RunLayout(str(tmp_path / "run"))
    inprocess.run_bootstrap(cfg, layout, log=lambda _: None)
    store = ModelStore(cfg)
    assert not store.load(layout.bootstrap("critic"), kind="critic").model.match  # one bootstrap serves both settings
    for it in (1, 2):
        run_stages(cfg, layout, it)
    critic = store.load(layout.output(2, "critic"), kind="critic").model
    assert critic.match and critic.surprise  # the toy's critic reads its surprise too
    hidden = critic.backbone.config.hidden_size
    head = _weights(layout.output(2, "critic"), "value_head.safetensors")["weight"]
    assert head.shape[1] == hidden + MATCH_FEATURES + SURPRISE_FEATURES
    pairs = rows(layout, 1, "critic_pairs") + rows(layout, 2, "critic_pairs")
    assert pairs and len({round(p["prediction"], 6) for p in pairs}) > 1
    # the match features are zero on a state shown no reference: their weights learn only from states shown one (this
    # untrained tiny policy rarely succeeds, so rarely has a reference to show; test_models checks they learn)
    shown = any(p["ref_trajectory_id"] is not None for p in pairs)
    assert bool(head[0, hidden : hidden + MATCH_FEATURES].abs().sum() > 0) == shown
    # a run that turns it off cannot go on from a critic fitted with it
    without = tiny_config(critic__reference_match=False, critic__train_backbone=False, critic__dense=True)
    with pytest.raises(
        ValueError,
        match=r"fitted with the reference match without its left flag and the config asks for"
        r" without the reference match",
    ):
        run_stages(without, layout, 3)
