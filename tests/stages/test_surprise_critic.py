"""A critic with surprise through the real stages: bootstrap, scoring, fitting, checkpoints."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from ac2_core import storage
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
