"""The stages over two CPU processes (gloo) against one: the same weights, samples and values.

Each test launches real processes (torchrun for the updates, two plain processes for
generation and scoring), so each costs the processes' start (about 10-20 s on 2 busy
cores): the updates of one iteration are run once per setting and shared by the tests.
The model is the suite's tiny one; ``micro_batch_size`` 4 deals several micro-batches
to each process, so both really work.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ac2_core import storage
from ac2_core.generation import generate, generate_for
from ac2_core.generation.scoring import score_inputs
from ac2_core.models.state import read_state
from ac2_core.models.store import ModelStore
from ac2_core.models.tokenizer import special_ids
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from ac2_core.stages import data_parallel
from ac2_core.stages.common import Problems, prompt_ids
from ac2_core.stages.update_critic import CriticStats
from ac2_core.storage import ArtifactError
from tests.conftest import tiny_config
from tests.stages.test_stages import run_stages

# One process and two differ only in the order the two processes' gradient sums are added:
# float rounding, under 1e-7 on the toy's weights (bench/results/data_parallel.md).
PARAM_ATOL = 1e-5
# lr 1e-3: Adam's first steps move weights by about lr, 100 times the tolerance
SMALL_BATCHES = {"actor__micro_batch_size": 4, "critic__micro_batch_size": 4, "actor__lr": 1e-3, "critic__lr": 1e-3}
SETTINGS = {
    "torch": {},
    "zero2": {"training__backend": "deepspeed", "training__zero_stage": 2},
    "zero3": {"training__backend": "deepspeed", "training__zero_stage": 3},
}


@pytest.fixture(scope="module")
def iteration_2(tmp_path_factory, _bootstrap_dir) -> RunLayout:
    """A run whose iteration 2 is done up to check_readiness: what the updates read."""
    root = tmp_path_factory.mktemp("dp") / "run"
    shutil.copytree(_bootstrap_dir, root / "bootstrap")
    layout = RunLayout(str(root))
    cfg = tiny_config()
    run_stages(cfg, layout, 1)
    for call in inprocess.stage_calls(cfg, layout, 2):
        if not call.stage.startswith("update_") and call.stage != "evaluate":
            call.run(cfg)
    return layout


def _updates(cfg, layout: RunLayout, out: Path, *, only: str | None = None, critic: str | None = None, store=None) -> dict:
    """update_actor and update_critic (or ``only`` one) of iteration 2 into ``out``, as the recipe calls them;
    ``critic``: another input critic; ``store``: a runner's model store."""
    results = {}
    named = inprocess.named_inputs(cfg, 2)  # the manifests name the inputs as the runners' do
    for call in inprocess.stage_calls(cfg, layout, 2):
        if call.stage.startswith("update_") and only in (None, call.stage):
            kwargs = {k: (str(out / k) if k.startswith("out_") else v) for k, v in call.kwargs.items()}
            if critic is not None and "critic" in kwargs:
                kwargs["critic"] = critic
            results[call.stage] = dataclasses.replace(call, kwargs=kwargs).run(cfg, store=store, named=named[call.stage])
    return results


def _weights(uri: str, kind: str) -> dict[str, torch.Tensor]:
    model = ModelStore(tiny_config()).load(uri, kind=kind).model
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _assert_close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=PARAM_ATOL, rtol=0, msg=name)


def _steps(folder: Path) -> set[float]:
    """The step counts in a checkpoint's optimizer state."""
    return {float(v) for k, v in load_file(str(folder / "optimizer.safetensors")).items() if k.endswith("::step")}


@pytest.fixture(scope="module")
def one_process(iteration_2, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("one")
    return out, _updates(tiny_config(**SMALL_BATCHES), iteration_2, out)


@pytest.fixture(scope="module")
def two_processes(iteration_2, tmp_path_factory):
    """Per setting, run once when a test first asks: (out folder, metrics)."""
    done = {}

    def get(setting: str):
        if setting not in done:
            if setting != "torch":
                pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'ac2[deepspeed]')")
            out = tmp_path_factory.mktemp(f"two-{setting}")
            cfg = tiny_config(**SMALL_BATCHES, **SETTINGS[setting], training__num_processes=2)
            done[setting] = out, _updates(cfg, iteration_2, out)
        return done[setting]

    return get


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_two_processes_train_to_the_weights_of_one(iteration_2, one_process, two_processes, setting):
    (ref_out, ref), (out, ours) = one_process, two_processes(setting)
    assert ref["update_actor"].trained_chunks > 8  # several micro-batches of 4: both processes train on rows
    assert ours["update_actor"].loss == pytest.approx(ref["update_actor"].loss, rel=1e-5)
    assert ours["update_actor"].grad_norm == pytest.approx(ref["update_actor"].grad_norm, rel=1e-5)
    assert ours["update_critic"].loss_last == pytest.approx(ref["update_critic"].loss_last, rel=1e-5)
    for kind in ("actor", "critic"):
        before = _weights(iteration_2.output(1, kind), kind)
        theirs, mine = _weights(str(ref_out / f"out_{kind}"), kind), _weights(str(out / f"out_{kind}"), kind)
        _assert_close(mine, theirs)
        # the step moved the weights by far more than the tolerance, so the comparison means something
        assert max(float((theirs[n] - before[n]).abs().max()) for n in theirs) > 30 * PARAM_ATOL
        # rank 0 wrote the optimizer state in the layout one process writes: the same tensors, the same step
        a, b = (load_file(str(o / f"out_{kind}" / "optimizer.safetensors")) for o in (ref_out, out))
        assert a.keys() == b.keys() and all(a[k].shape == b[k].shape for k in a)
        assert _steps(out / f"out_{kind}") == _steps(ref_out / f"out_{kind}")
        assert storage.read_manifest(str(out / f"out_{kind}")).stage == f"update_{kind}"
        # the launched processes' manifest names the inputs as one process's does: relative to the run folder
        lineage = storage.read_manifest(str(out / f"out_{kind}")).lineage
        assert lineage == storage.read_manifest(str(ref_out / f"out_{kind}")).lineage
        assert lineage["inputs"][kind]["uri"] == f"iter-0001/update_{kind}/{kind}"
        # and rank 0's checkpoint records the update's statistics (the metrics table's columns)
        mine, theirs = (read_state(str(o / f"out_{kind}"), kind=kind)["stats"] for o in (out, ref_out))
        assert mine.keys() == theirs.keys() and all(mine[k] == pytest.approx(theirs[k], rel=1e-4) for k in mine)


def _dense_examples(cfg, layout: RunLayout) -> list:
    """update_critic's training examples of iteration 2 under ``cfg``."""
    from ac2_core.stages.common import read
    from ac2_core.stages.critic_io import CriticInputs
    from ac2_core.stages.update_critic import training_examples

    tok = ModelStore(cfg).tokenizer(layout.output(1, "critic"), kind="critic")
    builder = CriticInputs(cfg, tok, Problems.load(layout.bootstrap("problems")), read(layout.output(2, "replay"), "replay"))
    pairs = read(layout.output(2, "critic_pairs"), "critic_pairs")
    return training_examples(cfg, builder, pairs, read(layout.output(2, "scored_chunks"), "scored_chunks"))


def test_a_dense_critic_trains_on_two_processes_to_the_weights_of_one(iteration_2, tmp_path):
    # critic.dense: an example fits V at every token of an answer; the processes deal those examples out
    dense = {**SMALL_BATCHES, "critic__dense": True}
    examples = _dense_examples(tiny_config(**dense), iteration_2)
    assert sum(len(at) > 1 for _, at in examples) >= 4  # several examples really are dense
    one = _updates(tiny_config(**dense), iteration_2, tmp_path / "one", only="update_critic")["update_critic"]
    # through a runner's store that holds the input critic: the launch drops it and trains it from its files
    store = ModelStore(tiny_config(**dense), keep_in_memory=True)
    critic_uri = iteration_2.output(1, "critic")
    store.load(critic_uri, kind="critic")
    two_cfg = tiny_config(**dense, training__num_processes=2)
    two = _updates(two_cfg, iteration_2, tmp_path / "two", only="update_critic", store=store)["update_critic"]
    assert isinstance(two, CriticStats) and isinstance(one, CriticStats)
    assert (two.examples, two.critic_tokens, two.critic_version) == (one.examples, one.critic_tokens, one.critic_version)
    assert two.loss_first == pytest.approx(one.loss_first, rel=1e-5)
    assert two.loss_last == pytest.approx(one.loss_last, rel=1e-5)
    assert critic_uri not in store._memory
    before = _weights(critic_uri, "critic")
    theirs, mine = (_weights(str(tmp_path / n / "out_critic"), "critic") for n in ("one", "two"))
    _assert_close(mine, theirs)
    assert max(float((theirs[n] - before[n]).abs().max()) for n in theirs) > 30 * PARAM_ATOL


def test_a_rerun_on_two_processes_is_bit_identical(iteration_2, two_processes, tmp_path):
    out, first = two_processes("torch")
    again = _updates(tiny_config(**SMALL_BATCHES, training__num_processes=2), iteration_2, tmp_path, only="update_critic")
    assert again["update_critic"].critic_hash == first["update_critic"].critic_hash


def test_one_launched_process_is_the_stage_in_its_own_process(iteration_2, one_process, tmp_path):
    # training.launch always: torchrun with one process, the GPU check's path; nothing is split or summed
    cfg = tiny_config(**SMALL_BATCHES, training__launch="always")
    assert data_parallel.launched(cfg, None) and data_parallel.processes(cfg) == 1
    ours = _updates(cfg, iteration_2, tmp_path, only="update_critic")
    assert ours["update_critic"].critic_hash == one_process[1]["update_critic"].critic_hash


def test_a_resume_across_process_counts_continues_the_run(iteration_2, tmp_path):
    # critic steps 2 -> 1 -> 2 processes, each resuming the last one's checkpoint, against 1 -> 1 -> 1
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install 'ac2[deepspeed]')")
    zero3 = {**SMALL_BATCHES, **SETTINGS["zero3"]}
    chains = {"2-1-2": [2, 1, 2], "1-1-1": [1, 1, 1]}
    finals = {}
    for label, counts in chains.items():
        critic = iteration_2.output(1, "critic")
        for k, n in enumerate(counts):
            over = zero3 | {"training__num_processes": n} if label == "2-1-2" else SMALL_BATCHES
            out = tmp_path / label / str(k)
            _updates(tiny_config(**over), iteration_2, out, only="update_critic", critic=critic)
            critic = str(out / "out_critic")
        finals[label] = critic
    steps = tiny_config().critic.steps_per_iteration
    start = _steps(Path(iteration_2.output(1, "critic")))
    assert _steps(Path(finals["2-1-2"])) == _steps(Path(finals["1-1-1"])) == {s + 3 * steps for s in start}
    _assert_close(_weights(finals["2-1-2"], "critic"), _weights(finals["1-1-1"], "critic"))


def test_a_failing_process_fails_the_stage_with_its_message(iteration_2, tmp_path):
    cfg = tiny_config(training__num_processes=2)
    # a critic whose manifest reads but whose weights changed: the processes fail loading it
    damaged = tmp_path / "damaged-critic"
    shutil.copytree(iteration_2.output(1, "critic"), damaged)
    (damaged / "value_head.safetensors").write_bytes(b"not the weights")
    with pytest.raises(ArtifactError, match=r"update_critic over 2 processes, rank \d: .*damaged-critic"):
        _updates(cfg, iteration_2, tmp_path / "out", only="update_critic", critic=str(damaged))
    assert not (tmp_path / "out" / "out_critic").exists()  # nothing was published
    # a missing input fails before any process starts: the manifests' lineage reads every input first
    with pytest.raises(ArtifactError, match=r"no-critic: no artifact at this URI"):
        _updates(cfg, iteration_2, tmp_path / "out", only="update_critic", critic=str(tmp_path / "no-critic"))


def _generation_inputs(layout: RunLayout):
    cfg = tiny_config()
    store = ModelStore(cfg)
    tok = store.tokenizer(layout.output(1, "actor"), kind="actor")
    probs = Problems.load(layout.bootstrap("problems"))
    contexts = [prompt_ids(tok, probs[pid]["prompt"]) for pid in probs.ids("train")[:12]]
    budgets = [8 if i % 3 else 32 for i in range(len(contexts))]  # two budgets: rows of one budget decode together
    return tok, contexts, budgets


def test_sharded_generation_and_scoring_equal_one_process(iteration_2):
    # batches of 8 rows: 48 rows make 6 batches, dealt out to two processes
    cfg = tiny_config(generation__num_processes=2, generation__batch_size=8, critic__score_batch_size=4)
    actor = iteration_2.output(1, "actor")
    tok, contexts, budgets = _generation_inputs(iteration_2)
    kw = dict(n=4, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seed=7, temperature=1.0)
    model = ModelStore(cfg).load(actor, kind="actor").model
    alone = generate(model, contexts, budgets, batch_size=8, **kw)
    shared = generate_for(cfg, model, actor, contexts, budgets, **kw)
    assert [[(s.token_ids, s.logprobs, s.finish_reason) for s in g] for g in shared] == [
        [(s.token_ids, s.logprobs, s.finish_reason) for s in g] for g in alone
    ]
    assert len({s.finish_reason for g in alone for s in g}) == 2  # both kinds of ending are compared

    critic_uri = iteration_2.output(1, "critic")
    critic = ModelStore(cfg).load(critic_uri, kind="critic").model
    state = special_ids(tok)["state"]  # critic inputs: the answer follows the state separator
    inputs = [c + [state] + s.token_ids for c, g in zip(contexts, alone) for s in g][:30]
    inputs += inputs[:5]  # repeated inputs are scored once, and get their value back
    from ac2_core.generation import sharded

    assert sharded.score(cfg, critic_uri, inputs, pad_id=tok.pad_token_id) == score_inputs(
        critic, inputs, pad_id=tok.pad_token_id, batch_size=4
    )
