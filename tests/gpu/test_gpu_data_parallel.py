"""The launched paths on CUDA: the update stages under torchrun and generation in a spawned process (skipped without CUDA).

With one GPU the launcher still starts a process (``launch: always``, one process), so the
path a multi-GPU task takes runs here: torchrun, the nccl group, rank 0's checkpoint.
With two GPUs or more, the updates also run over all of them. Each result is compared
with the stage in its own process; the CPU tests (tests/stages/test_data_parallel.py)
check two gloo processes against one.

    PYTHONUNBUFFERED=1 python -m pytest -q -s tests/gpu
"""

from __future__ import annotations

import dataclasses
import importlib.util
import shutil
import time

import pytest
import torch

from ac2_core.generation import generate, generate_for
from ac2_core.models.store import ModelStore
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from tests.conftest import tiny_config
from tests.stages.test_stages import run_stages

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# float32 (torch leaves TF32 off for matmuls): a step at lr 1e-3 moves weights by about 1e-3, 100 times the
# tolerance; the launched step and the in-process one differ only in the order sums are added
CUDA = {"model__device": "cuda", "model__dtype": "float32", "actor__lr": 1e-3, "critic__lr": 1e-3}
ATOL = 1e-5


@pytest.fixture(scope="module")
def iteration_2(tmp_path_factory) -> RunLayout:
    root = tmp_path_factory.mktemp("gpu-dp") / "run"
    cfg = tiny_config(**CUDA)
    layout = RunLayout(str(root))
    inprocess.run_bootstrap(cfg, layout, log=lambda _: None)
    run_stages(cfg, layout, 1)
    for call in inprocess.stage_calls(cfg, layout, 2):
        if not call.stage.startswith("update_") and call.stage != "evaluate":
            call.run(cfg)
    return layout


def _updates(cfg, layout: RunLayout, out) -> tuple[dict, float]:
    results = {}
    t0 = time.perf_counter()
    for call in inprocess.stage_calls(cfg, layout, 2):
        if call.stage.startswith("update_"):
            kwargs = {k: (str(out / k) if k.startswith("out_") else v) for k, v in call.kwargs.items()}
            results[call.stage] = dataclasses.replace(call, kwargs=kwargs).run(cfg)
    return results, time.perf_counter() - t0


def _gap(a_uri: str, b_uri: str, kind: str) -> float:
    a, b = (ModelStore(tiny_config(**CUDA)).load(uri, kind=kind).model for uri in (a_uri, b_uri))
    return max((p.float() - q.float()).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def _settings() -> list[tuple[str, dict]]:
    out = [("torch, 1 launched process", {"training__launch": "always"})]
    if importlib.util.find_spec("deepspeed"):
        zero3 = {"training__backend": "deepspeed", "training__zero_stage": 3}
        out.append(("deepspeed ZeRO-3, 1 launched process", zero3 | {"training__launch": "always"}))
    n = torch.cuda.device_count()
    if n >= 2:
        out.append((f"torch, {n} processes", {"training__num_processes": n}))
    return out


@pytest.mark.parametrize(("label", "over"), _settings(), ids=[s[0] for s in _settings()])
def test_launched_updates_on_cuda_match_the_stage_in_its_own_process(iteration_2, tmp_path, label, over):
    ref, ref_s = _updates(tiny_config(**CUDA), iteration_2, tmp_path / "own")
    ours, our_s = _updates(tiny_config(**CUDA, **over), iteration_2, tmp_path / "launched")
    gaps = {k: _gap(str(tmp_path / "own" / f"out_{k}"), str(tmp_path / "launched" / f"out_{k}"), k) for k in ("actor", "critic")}
    moved = {k: _gap(iteration_2.output(1, k), str(tmp_path / "own" / f"out_{k}"), k) for k in ("actor", "critic")}
    print(
        f"\n{label}: updates {our_s:.1f} s (in its own process {ref_s:.1f} s); max weight gap {gaps} after steps of {moved};"
        f" actor loss {ours['update_actor'].loss:.6f} vs {ref['update_actor'].loss:.6f}"
    )
    assert ours["update_actor"].trained_chunks == ref["update_actor"].trained_chunks
    assert ours["update_actor"].loss == pytest.approx(ref["update_actor"].loss, rel=1e-2, abs=1e-4)
    assert ours["update_critic"].loss_first == pytest.approx(ref["update_critic"].loss_first, rel=1e-2)
    for kind in ("actor", "critic"):
        assert gaps[kind] < ATOL and moved[kind] > 30 * ATOL, kind
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_generation_in_a_launched_process_on_cuda_is_token_for_token_the_same(iteration_2):
    n = torch.cuda.device_count()
    cfg = tiny_config(**CUDA, generation__launch="always", generation__num_processes=n, generation__batch_size=8)
    actor = iteration_2.output(1, "actor")
    ckpt = ModelStore(cfg).load(actor, kind="actor")
    tok = ckpt.tokenizer
    contexts = [tok(f"{i}+{i + 7}=", add_special_tokens=False)["input_ids"] for i in range(16)]
    kw = dict(n=4, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seed=3, temperature=1.0)
    t0 = time.perf_counter()
    shared = generate_for(cfg, ckpt.model, actor, contexts, [24] * len(contexts), **kw)
    seconds = time.perf_counter() - t0
    alone = generate(ckpt.model, contexts, [24] * len(contexts), batch_size=8, **kw)
    same = sum(a.token_ids == b.token_ids for ga, gb in zip(alone, shared) for a, b in zip(ga, gb))
    print(f"\ngeneration in {n} launched process(es): {seconds:.1f} s; {same} of {len(contexts) * 4} samples identical")
    assert [[s.token_ids for s in g] for g in shared] == [[s.token_ids for s in g] for g in alone]
