"""LoadedModels: checkpoints the kfp.local task host loads before it forks a task's worker, by content hash.
The bytes a warm task writes are compared with cold tasks' and the inprocess runner's in tests/pipeline."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from ac2_core.models.store import LoadedModels, ModelStore
from ac2_core.storage import ArtifactError


def _weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_a_copy_of_a_loaded_artifact_is_served_from_memory_and_still_verified(run_dir, tiny_cfg, tmp_path):
    actor = str(run_dir / "bootstrap" / "actor")
    loaded = LoadedModels(1 << 30)
    assert loaded.preload(tiny_cfg, actor, "actor") and not loaded.preload(tiny_cfg, actor, "actor")  # once
    copy = tmp_path / "copy"
    shutil.copytree(actor, copy)  # another URI, the same content hash: the same model
    ckpt = ModelStore(tiny_cfg, loaded=loaded).load(str(copy), kind="actor")
    fresh = ModelStore(tiny_cfg).load(actor, kind="actor")
    assert ckpt.source == copy and ckpt.version == fresh.version
    assert all(torch.equal(v, fresh.model.state_dict()[k]) for k, v in ckpt.model.state_dict().items())
    # a hit still reads the files it was given: a changed one is refused as without the hit
    weights = next(p for p in copy.iterdir() if p.suffix == ".safetensors")
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with pytest.raises(ArtifactError, match="does not match its manifest"):
        ModelStore(tiny_cfg, loaded=loaded).load(str(copy), kind="actor")


def test_training_a_checkpoint_leaves_the_loaded_one_alone(run_dir, tiny_cfg):
    critic = str(run_dir / "bootstrap" / "critic")
    loaded = LoadedModels(1 << 30)
    loaded.preload(tiny_cfg, critic, "critic")
    before = _weights(loaded.get(tiny_cfg, critic, "critic").model)
    # in the process that loaded it, a store gets its own copy (a forked worker has copy-on-write memory)
    taken = ModelStore(tiny_cfg, loaded=loaded).take(critic, kind="critic")
    with torch.no_grad():
        for p in taken.model.parameters():
            p.add_(1.0)
    after = loaded.get(tiny_cfg, critic, "critic").model.state_dict()
    assert all(torch.equal(v, after[k]) for k, v in before.items())


def test_a_worker_forked_after_the_preload_gets_the_loaded_objects(run_dir, tiny_cfg):
    actor = str(run_dir / "bootstrap" / "actor")
    loaded = LoadedModels(1 << 30)
    loaded.preload(tiny_cfg, actor, "actor")
    mine = id(loaded.get(tiny_cfg, actor, "actor").model)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the task host's worker: the same object, no copy, no load
        os.close(read)
        same = id(loaded.get(tiny_cfg, actor, "actor").model) == id(loaded._models[loaded.key(tiny_cfg, actor, "actor")][0].model)
        os.write(write, b"1" if same else b"0")
        os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    assert answer == b"1" and mine != id(loaded._models[loaded.key(tiny_cfg, actor, "actor")][0].model)


def test_the_newest_models_are_kept_within_the_byte_budget(run_dir, tiny_cfg):
    actor, critic = str(run_dir / "bootstrap" / "actor"), str(run_dir / "bootstrap" / "critic")
    probe = LoadedModels(1 << 30)
    sizes = []
    for uri, kind in ((actor, "actor"), (critic, "critic")):
        probe.preload(tiny_cfg, uri, kind)
        sizes.append(sum(p.numel() * p.element_size() for p in probe.get(tiny_cfg, uri, kind).model.parameters()))
    loaded = LoadedModels(max(sizes))  # room for either, not both
    assert loaded.preload(tiny_cfg, actor, "actor") and len(loaded) == 1
    assert loaded.preload(tiny_cfg, critic, "critic") and len(loaded) == 1  # the actor made room
    assert loaded.get(tiny_cfg, actor, "actor") is None and loaded.get(tiny_cfg, critic, "critic") is not None
    assert not LoadedModels(10).preload(tiny_cfg, actor, "actor")  # too large to keep at all
