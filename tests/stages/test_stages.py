"""The seven stages on a tiny model: chaining, token-exact continuation, reruns, bad input."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ac2_core import storage
from ac2_core.generation.hf import token_entropies, token_logprobs
from ac2_core.math import attention_width, count_non_embedding_params, prefill_flops
from ac2_core.models.store import ModelStore
from ac2_core.runner import inprocess
from ac2_core.runner.layout import RunLayout
from ac2_core.schemas import TABLES
from ac2_core.stages import sample_prefixes
from ac2_core.stages.common import Problems, prompt_ids
from ac2_core.stages.evaluate import compute_bill
from ac2_core.stages.recipe import ITERATION
from ac2_core.tasks import arith
from tests.conftest import tiny_config


def run_stages(cfg, layout, it, *, store=None, out_root=None):
    """Run one iteration stage by stage; optionally redirect every output under out_root."""
    results = {}
    for call in inprocess.stage_calls(cfg, layout, it):
        if out_root is not None:
            kwargs = {k: (str(out_root / call.stage / k) if k.startswith("out_") else v) for k, v in call.kwargs.items()}
            call = dataclasses.replace(call, kwargs=kwargs)
        results[call.stage] = call.run(cfg, store=store)
    return results


def rows(layout, it, name):
    return storage.read_rows(layout.output(it, name), kind=name)


def test_each_stage_reads_what_the_previous_wrote(run_dir, tiny_cfg):
    layout = RunLayout(str(run_dir))
    for it in (1, 2):
        run_stages(tiny_cfg, layout, it)
        for stage in ITERATION:
            for name in stage.outputs:
                if name in TABLES:  # read back through the declared schema and manifest
                    storage.read_table(layout.output(it, name), kind=name)
                else:
                    assert storage.read_manifest(layout.output(it, name)).stage == stage.name
        prefixes = rows(layout, it, "prefixes")
        chunks = rows(layout, it, "chunks")
        scored = rows(layout, it, "scored_chunks")
        advantages = rows(layout, it, "advantages")
        assert len(chunks) == len(prefixes) * tiny_cfg.rollout.group_size
        assert [c["chunk_id"] for c in chunks] == [s["chunk_id"] for s in scored] == [a["chunk_id"] for a in advantages]
        assert {c["policy_version"] for c in chunks} == {it - 1}
    # iteration 2 revisits problems that became ready in iteration 1, so chunk mode happens
    modes = {p["mode"] for p in rows(layout, 2, "prefixes")}
    assert "chunk" in modes
    assert storage.read_rows(layout.output(2, "metrics"), kind="metrics")[-1]["iteration"] == 2


def test_every_chunk_continues_its_prefix_token_for_token(run_dir, tiny_cfg):
    layout = RunLayout(str(run_dir))
    store = ModelStore(tiny_cfg)
    for it in (1, 2):
        run_stages(tiny_cfg, layout, it, store=store)
    prefixes = {p["prefix_id"]: p for p in rows(layout, 2, "prefixes")}
    replay = {t["trajectory_id"]: t for t in rows(layout, 2, "replay")}
    chunks = rows(layout, 2, "chunks")
    for s, c in zip(rows(layout, 2, "scored_chunks"), chunks):
        p = prefixes[s["prefix_id"]]
        assert s["response_token_ids"] == p["prefix_token_ids"] + c["token_ids"]
        if p["mode"] == "chunk":
            source = replay[p["source_trajectory_id"]]["token_ids"]
            assert p["prefix_token_ids"] == source[: len(p["prefix_token_ids"])]
            assert len(p["prefix_token_ids"]) % tiny_cfg.rollout.chunk_tokens == 0
            assert s["ref_trajectory_id"] != p["source_trajectory_id"]
    # The recorded behaviour log-probs are the policy's log-probs of each chunk token given
    # prompt + prefix: generation really conditioned on the prefix ids.
    actor = store.load(layout.output(1, "actor"), kind="actor")
    probs = Problems.load(layout.bootstrap("problems"))
    contexts = [
        prompt_ids(actor.tokenizer, probs[c["problem_id"]]["prompt"]) + prefixes[c["prefix_id"]]["prefix_token_ids"]
        for c in chunks
    ]
    assert all(len(ctx) == c["context_tokens"] for ctx, c in zip(contexts, chunks))
    with torch.no_grad():
        lp, mask = token_logprobs(
            actor.model, contexts, [c["token_ids"] for c in chunks], pad_id=actor.tokenizer.pad_token_id, temperature=1.0
        )
    for i, c in enumerate(chunks):
        torch.testing.assert_close(lp[i, : len(c["token_ids"])], torch.tensor(c["logprobs"]), atol=1e-4, rtol=0)


def test_rerun_with_same_inputs_gives_identical_outputs(run_dir, tiny_cfg, tmp_path):
    layout = RunLayout(str(run_dir))
    run_stages(tiny_cfg, layout, 1)
    run_stages(tiny_cfg, layout, 2)
    rerun = tmp_path / "rerun"
    run_stages(tiny_cfg, layout, 2, out_root=rerun)
    for call in inprocess.stage_calls(tiny_cfg, layout, 2):
        for key, uri in call.kwargs.items():
            if key.startswith("out_"):
                assert storage.content_hash(str(rerun / call.stage / key)) == storage.content_hash(uri), f"{call.stage}.{key}"


@pytest.mark.parametrize("algorithm", ["ac2", "grpo"])
def test_two_iteration_run(tmp_path, _bootstrap_dir, algorithm):
    import shutil

    cfg = tiny_config(algorithm=algorithm)
    shutil.copytree(_bootstrap_dir, tmp_path / "bootstrap")
    initial, *metrics = inprocess.run(cfg, str(tmp_path), log=lambda _: None)
    assert initial["iteration"] == 0 and initial["cum_decode_flops"] == 0  # the bootstrap's row
    assert [m["iteration"] for m in metrics] == [1, 2]
    assert all(m["val_score"] is not None and 0 <= m["val_score"] <= 1 for m in [initial, *metrics])
    assert metrics[1]["cum_decode_flops"] > metrics[0]["cum_decode_flops"] > 0
    assert metrics[1]["cum_train_flops"] >= metrics[0]["cum_train_flops"]
    if algorithm == "grpo":
        assert all(m["critic_flops"] == 0 and m["chunk_groups"] == 0 for m in metrics)
        assert not (tmp_path / "iter-0001" / "update_critic").exists()
    else:
        assert all(m["critic_flops"] > 0 for m in metrics)
        assert metrics[0]["train_flops"] > 0  # the critic trains even when every reward is 0
        assert metrics[1]["chunk_groups"] > 0


def test_resume_continues_after_the_last_finished_iteration(tmp_path, _bootstrap_dir):
    import shutil

    shutil.copytree(_bootstrap_dir, tmp_path / "bootstrap")
    inprocess.run(tiny_config(run__iterations=1), str(tmp_path), log=lambda _: None)
    first = storage.content_hash(str(tmp_path / "iter-0001" / "evaluate" / "metrics"))
    logs = []
    metrics = inprocess.run(tiny_config(run__iterations=2), str(tmp_path), log=logs.append)
    assert any("resuming" in line and "after iteration 1" in line for line in logs)
    assert [m["iteration"] for m in metrics] == [0, 1, 2]
    assert storage.content_hash(str(tmp_path / "iter-0001" / "evaluate" / "metrics")) == first


# ----------------------------------------------------------------------- bad input


def test_empty_problem_set_is_refused_and_writes_nothing(run_dir, tiny_cfg, tmp_path):
    empty = str(tmp_path / "empty_problems")
    storage.write_table(empty, storage.table_from_rows([], "problems"), kind="problems", stage="test", config_hash="x")
    layout = RunLayout(str(run_dir))
    with pytest.raises(ValueError, match="problem set is empty"):
        sample_prefixes.run(
            tiny_cfg,
            iteration=1,
            problems=empty,
            replay=layout.bootstrap("replay"),
            scored_chunks=layout.bootstrap("scored_chunks"),
            readiness=layout.bootstrap("readiness"),
            actor=layout.bootstrap("actor"),
            out_replay=str(tmp_path / "r"),
            out_prefixes=str(tmp_path / "p"),
        )
    assert not (tmp_path / "r").exists() and not (tmp_path / "p").exists()


def test_nan_reward_from_grader_is_refused_and_writes_nothing(run_dir, tiny_cfg, monkeypatch):
    layout = RunLayout(str(run_dir))
    calls = inprocess.stage_calls(tiny_cfg, layout, 1)
    for call in calls[:2]:
        call.run(tiny_cfg)
    monkeypatch.setattr(arith, "grade", lambda answer, response: math.nan)
    with pytest.raises(ValueError, match=r"grader 'arith' returned nan for chunk .* rewards must be finite"):
        calls[2].run(tiny_cfg)
    assert not storage.exists(calls[2].kwargs["out_scored_chunks"])
    assert not storage.exists(calls[2].kwargs["out_critic_pairs"])


@pytest.mark.parametrize("damage", ["drop_column", "wrong_type"])
def test_stage_refuses_a_malformed_chunks_table(run_dir, tiny_cfg, tmp_path, damage):
    layout = RunLayout(str(run_dir))
    calls = inprocess.stage_calls(tiny_cfg, layout, 1)
    for call in calls[:2]:
        call.run(tiny_cfg)
    chunks_uri = layout.output(1, "chunks")
    table = storage.read_table(chunks_uri, kind="chunks")
    if damage == "drop_column":
        table = table.drop_columns(["logprobs"])
        expected = "missing column.*logprobs"
    else:
        table = table.set_column(
            table.schema.get_field_index("sample_index"), "sample_index", table.column("sample_index").cast(pa.int64())
        )
        expected = "column sample_index of chunks should be int32, found int64"
    # Forge a well-formed manifest around the damaged table, as a foreign writer might.
    data = storage.join(chunks_uri, storage.DATA)
    pq.write_table(table, data)
    manifest = storage.read_manifest(chunks_uri)
    with open(data, "rb") as f:
        import hashlib

        manifest.files[storage.DATA]["sha256"] = hashlib.sha256(f.read()).hexdigest()
    with open(storage.join(chunks_uri, storage.MANIFEST), "w") as f:
        f.write(manifest.to_json())
    with pytest.raises(storage.ArtifactError, match=expected):
        calls[2].run(tiny_cfg)
    assert not storage.exists(calls[2].kwargs["out_scored_chunks"])


# ------------------------------------------------------------ benchmark switches


def test_skip_solved_groups_leaves_out_problems_solved_in_their_last_groups(run_dir, tmp_path):
    from ac2_core.stages.common import write

    cfg = tiny_config(rollout__skip_solved_groups=2, rollout__problems_per_iteration=64)  # every train problem
    layout = RunLayout(str(run_dir))
    train = Problems.load(layout.bootstrap("problems")).ids("train")
    solved, once, failed = train[:3]

    def traj(pid, it, k, reward):
        return {
            "run_id": cfg.run_id, "iteration": it, "policy_version": it - 1, "trajectory_id": f"{pid}-{it}-{k}",
            "problem_id": pid, "source_trajectory_id": None, "token_ids": [5, 6], "finished": True, "reward": reward,
        }  # fmt: skip

    replay = [traj(solved, it, k, 1.0) for it in (1, 2) for k in range(2)]
    replay += [traj(once, 2, k, 1.0) for k in range(2)]  # one solved group: not yet skipped
    replay += [traj(failed, it, k, 1.0 if it == 2 else float(k)) for it in (1, 2) for k in range(2)]
    write(cfg, "test", str(tmp_path / "replay"), replay, "replay")
    kwargs = inprocess.stage_calls(cfg, layout, 3)[0].kwargs | {
        "replay": str(tmp_path / "replay"),
        "scored_chunks": layout.bootstrap("scored_chunks"),
        "readiness": layout.bootstrap("readiness"),
        "actor": layout.bootstrap("actor"),
    }
    result = sample_prefixes.run(cfg, iteration=3, **kwargs)
    chosen = {p["problem_id"] for p in rows(layout, 3, "prefixes")}
    assert result.skipped_solved == 1
    assert chosen == set(train) - {solved}

    # the same replay without the switch draws every problem
    plain = tiny_config(rollout__problems_per_iteration=64)
    sample_prefixes.run(plain, iteration=3, **kwargs)
    assert {p["problem_id"] for p in rows(layout, 3, "prefixes")} == set(train)


def test_readiness_gate_off_trusts_the_critic_on_every_problem_with_a_window(run_dir):
    layout = RunLayout(str(run_dir))
    strict = {"readiness__max_error": 0.0, "readiness__require_mixed_outcomes": True}  # hardly anything is ready
    run_stages(tiny_config(**strict), layout, 1)
    gated = rows(layout, 1, "readiness")
    assert gated and not all(r["ready"] for r in gated)
    run_stages(tiny_config(**strict, readiness__gate=False), layout, 1)
    open_ = rows(layout, 1, "readiness")
    assert [r["problem_id"] for r in open_] == [r["problem_id"] for r in gated]
    assert all(r["ready"] for r in open_)
    # the error is still measured, so the figures report how wrong the trusted critic is
    assert [r["error"] for r in open_] == [r["error"] for r in gated]


def _scored(prefix: str, mode: str, targets: list[float], source: str) -> list[dict]:
    return [
        {
            "run_id": "r",
            "iteration": 1,
            "policy_version": 0,
            "chunk_id": f"{prefix}-{i}",
            "prefix_id": prefix,
            "problem_id": prefix,
            "mode": mode,
            "target": y,
            "target_source": source,
            "value_start": 0.4,
        }
        for i, y in enumerate(targets)
    ]


@pytest.mark.parametrize("full_groups", ["grpo", "chunk"])
def test_full_groups_of_ac2_train_as_under_grpo_by_default(full_groups):
    from ac2_core.math import group_advantages, grpo_advantages
    from ac2_core.stages.check_readiness import advantages

    full, chunk = [1.0, 0.0, 0.0, 0.0], [0.6, 0.0, 0.6, 0.6]
    scored = _scored("full", "full", full, "reward") + _scored("chunk", "chunk", chunk, "critic")
    ac2 = tiny_config(algorithm="ac2", advantage__full_groups=full_groups)
    rows = {r["chunk_id"]: r for r in advantages(ac2, scored, ready={"chunk"})}
    grpo_cfg, full_only = tiny_config(algorithm="grpo"), _scored("full", "full", full, "reward")
    grpo_rows = {r["chunk_id"]: r for r in advantages(grpo_cfg, full_only, set())}
    got_full = [rows[f"full-{i}"]["advantage"] for i in range(4)]
    as_grpo = [grpo_rows[f"full-{i}"]["advantage"] for i in range(4)]
    loo = lambda ys: group_advantages(torch.tensor(ys), torch.zeros(4, dtype=torch.long), baseline="loo")[0].tolist()  # noqa: E731
    if full_groups == "grpo":  # the same four answers teach the same thing under either algorithm
        assert got_full == pytest.approx(as_grpo) and got_full[0] == pytest.approx(math.sqrt(3), rel=1e-5)
        assert got_full == pytest.approx(grpo_advantages(torch.tensor(full), torch.zeros(4, dtype=torch.long))[0].tolist())
    else:
        assert got_full == pytest.approx(loo(full)) and got_full != pytest.approx(as_grpo)
    # chunk groups keep the chunk advantage (leave-one-out, unscaled) either way
    assert [rows[f"chunk-{i}"]["advantage"] for i in range(4)] == pytest.approx(loo(chunk))
    assert [rows[f"chunk-{i}"]["weight"] for i in range(4)] == [1.0] * 4


def test_replay_rate_full_groups_measure_each_answer_against_its_problems_rate():
    from ac2_core.stages.check_readiness import advantages

    one = [{**r, "baseline_rate": 0.25} for r in _scored("one", "full", [1.0], "reward")]
    new = [{**r, "baseline_rate": None} for r in _scored("new", "full", [1.0, 0.0, 0.0, 0.0], "reward")]
    chunk = [{**r, "baseline_rate": None} for r in _scored("chunk", "chunk", [0.6, 0.0], "critic")]
    cfg = tiny_config(algorithm="ac2", advantage__full_groups="replay_rate")
    got = {r["chunk_id"]: r for r in advantages(cfg, one + new + chunk, ready={"chunk"})}
    # one answer has a signal of its own: (1 - 1/4) / sqrt(1/4 * 3/4)
    assert got["one-0"]["advantage"] == pytest.approx(math.sqrt(3), rel=1e-5) and got["one-0"]["baseline"] == 0.25
    # a problem without a rate (a new one) is a group of G under GRPO's advantage; chunks keep theirs
    assert got["new-0"]["advantage"] == pytest.approx(math.sqrt(3), rel=1e-5) and got["new-0"]["baseline"] == 0.25
    assert [got[f"chunk-{i}"]["advantage"] for i in range(2)] == pytest.approx([0.6, -0.6])
    unscaled = tiny_config(algorithm="ac2", advantage__full_groups="replay_rate", advantage__grpo_scale_std=False)
    assert advantages(unscaled, one, ready=set())[0]["advantage"] == pytest.approx(0.75)


def _whole_answers(pid: str, rewards: list[float], *, length: int, refs: list[str | None] | None = None) -> list[dict]:
    """Finished full-mode answers of ``length`` tokens with these rewards, each shown its reference in ``refs``."""
    rows = _scored(pid, "full", rewards, "reward")
    answer = {"baseline_rate": None, "finished": True, "response_token_ids": [7] * length}
    return [{**r, **answer, "reward": r["target"], "ref_trajectory_id": ref} for r, ref in zip(rows, refs or [None] * len(rows))]


def test_critic_credit_gives_a_ready_problems_whole_answers_one_advantage_per_token_from_the_values_along_them():
    from ac2_core.stages.check_readiness import advantages
    from ac2_core.stages.update_actor import trained_rows

    def pair(chunk_id: str, cut: int, v: float) -> dict:
        return {"trajectory_id": chunk_id, "cut": cut, "prediction": v}

    scored = _whole_answers("ready", [0.0, 1.0], length=40) + _whole_answers("new", [1.0, 0.0], length=40)  # cuts 0, 16, 32
    # the first answer slips in its second segment (V 0.5 -> 0), the second stays on to its reward
    pairs = [pair("ready-0", c, v) for c, v in ((32, 0.0), (0, 0.3), (16, 0.5))]  # in any order
    pairs += [pair("ready-1", c, v) for c, v in ((0, 0.3), (16, 0.5), (32, 0.8))]
    cfg = tiny_config(algorithm="ac2", rollout__chunk_tokens=16, advantage__full_credit="critic")
    got = {r["chunk_id"]: r for r in advantages(cfg, scored, ready={"ready"}, pairs=pairs)}
    assert got["ready-0"]["token_advantages"] == pytest.approx([0.2] * 16 + [-0.5] * 16 + [0.0] * 8)
    assert got["ready-1"]["token_advantages"] == pytest.approx([0.2] * 16 + [0.3] * 16 + [0.2] * 8)
    # the segments telescope to R - V(s_0), reported as the row's advantage against the baseline V(s_0)
    assert [got[f"ready-{i}"]["advantage"] for i in range(2)] == pytest.approx([-0.3, 0.7])
    assert got["ready-0"]["baseline"] == pytest.approx(0.3)
    # a problem the critic is not trusted on keeps GRPO's one advantage an answer; so does every answer by default
    assert got["new-0"]["token_advantages"] is None and got["new-0"]["advantage"] == pytest.approx(1.0, rel=1e-5)
    default = advantages(tiny_config(algorithm="ac2"), scored, ready={"ready"}, pairs=pairs)
    assert all(r["token_advantages"] is None for r in default)
    # a row whose tokens all carry 0 trains nothing, whatever it telescopes to
    flat = [{**got["ready-0"], "token_advantages": [0.0] * 40}, got["ready-1"]]
    assert [r["chunk_id"] for r in trained_rows(flat)] == ["ready-1"]
    # advantage.credit_lambda 1: each segment R - V(s_j), the reward against the value where it began
    gae = tiny_config(algorithm="ac2", rollout__chunk_tokens=16, advantage__full_credit="critic", advantage__credit_lambda=1.0)
    lam1 = {r["chunk_id"]: r for r in advantages(gae, scored, ready={"ready"}, pairs=pairs)}
    assert lam1["ready-0"]["token_advantages"] == pytest.approx([-0.3] * 16 + [-0.5] * 16 + [0.0] * 8)
    assert lam1["ready-1"]["token_advantages"] == pytest.approx([0.7] * 16 + [0.5] * 16 + [0.2] * 8)
    with pytest.raises(ValueError, match="ready-0: no critic values along it"):
        advantages(cfg, scored, ready={"ready"}, pairs=pairs[3:])


def test_critic_credit_can_keep_the_outcomes_scale_and_skip_the_answers_shown_no_reference():
    from ac2_core.stages.check_readiness import advantages

    # a GRPO group [0, 1] (mean 0.5, std 0.5: outcome advantages -1, +1) and a group of equal rewards (no spread);
    # 32-token answers: cuts 0, 16
    scored = _whole_answers("mixed", [0.0, 1.0], length=32, refs=["ref-a", None])
    scored += _whole_answers("equal", [0.0, 0.0], length=32, refs=["ref-b", "ref-b"])
    values = {"mixed-0": (0.6, 0.2), "mixed-1": (0.6, 0.8), "equal-0": (0.4, 0.1), "equal-1": (0.4, 0.4)}
    pairs = [{"trajectory_id": c, "cut": cut, "prediction": v} for c, vs in values.items() for cut, v in zip((0, 16), vs)]
    ready = {"mixed", "equal"}

    def credit(**knobs) -> dict[str, dict]:
        cfg = tiny_config(algorithm="ac2", rollout__chunk_tokens=16, advantage__full_credit="critic", **knobs)
        return {r["chunk_id"]: r for r in advantages(cfg, scored, ready=ready, pairs=pairs)}

    plain, scaled = credit(), credit(advantage__credit_scale=True)
    assert plain["mixed-0"]["token_advantages"] == pytest.approx([-0.4] * 16 + [-0.2] * 16)
    # divided by the group's std (0.5) as the outcome advantage was: the slip's tokens weigh what the outcome gave them
    assert scaled["mixed-0"]["token_advantages"] == pytest.approx([-0.8] * 16 + [-0.4] * 16, rel=1e-5)
    assert scaled["mixed-1"]["advantage"] == pytest.approx(2 * (1.0 - 0.6), rel=1e-5)
    assert scaled["mixed-0"]["baseline"] == pytest.approx(0.6)
    # no spread to scale by: the credit stays as it is
    assert scaled["equal-0"]["token_advantages"] == plain["equal-0"]["token_advantages"]
    assert plain["equal-0"]["token_advantages"] == pytest.approx([-0.3] * 16 + [-0.1] * 16)
    # an answer shown no reference keeps its outcome advantage (GRPO's +1); the others are credited
    needs = credit(advantage__credit_needs_reference=True)
    assert needs["mixed-1"]["token_advantages"] is None and needs["mixed-1"]["advantage"] == pytest.approx(1.0, rel=1e-5)
    assert needs["mixed-0"]["token_advantages"] == plain["mixed-0"]["token_advantages"]
    # a knob of the critic's credit without the credit is a mistake, named
    for knob in ("credit_scale", "credit_needs_reference"):
        with pytest.raises(ValueError, match=f"{knob} shapes the critic's credit"):
            tiny_config(algorithm="ac2", **{f"advantage__{knob}": True})


@pytest.mark.parametrize("kind", ["learned", "oracle"])
def test_critic_credit_runs_through_the_stages_and_trains_each_token_on_its_own_advantage(run_dir, kind):
    cfg = tiny_config(algorithm="ac2", critic__kind=kind, readiness__gate=False, advantage__full_credit="critic")
    layout = RunLayout(str(run_dir))
    for it in (1, 2):
        results = run_stages(cfg, layout, it)
        chunks = {c["chunk_id"]: c for c in rows(layout, it, "chunks")}
        modes = {p["prefix_id"]: p["mode"] for p in rows(layout, it, "prefixes")}
        credited = [a for a in rows(layout, it, "advantages") if a["token_advantages"] is not None]
        finished_full = [c for c in chunks.values() if modes[c["prefix_id"]] == "full" and c["finish_reason"] != "length"]
        assert len(credited) == len(finished_full) and (credited or it > 1)  # the gate is off: every finished answer
        for a in credited:
            per_token = a["token_advantages"]
            assert len(per_token) == len(chunks[a["chunk_id"]]["token_ids"])
            # constant within each chunk_tokens segment, and the segments sum to R - V(s_0)
            segments = [per_token[i : i + cfg.rollout.chunk_tokens] for i in range(0, len(per_token), cfg.rollout.chunk_tokens)]
            assert all(len(set(seg)) == 1 for seg in segments)
            assert sum(seg[0] for seg in segments) == pytest.approx(a["advantage"], abs=1e-5)
        if kind == "learned":  # the tiny actor never succeeds, so only a learned critic's values differ from 0
            assert results["update_actor"].trained_chunks >= len(credited)


def test_critic_credit_waits_out_the_critics_warm_up(run_dir):
    # the same run as above with one warm-up iteration: its finished answers keep their one advantage each
    cfg = tiny_config(algorithm="ac2", readiness__gate=False, advantage__full_credit="critic", critic__warmup_iterations=1)
    layout = RunLayout(str(run_dir))
    run_stages(cfg, layout, 1)
    finished = [c for c in rows(layout, 1, "chunks") if c["finish_reason"] != "length"]
    assert finished and all(a["token_advantages"] is None for a in rows(layout, 1, "advantages"))


@pytest.mark.parametrize("algorithm", ["ac2", "grpo"])
def test_one_answer_refreshes_decode_once_for_a_revisited_problem_and_a_group_for_a_new_one(run_dir, algorithm):
    # answers older than one iteration are no source of prefixes: a revisited problem is refreshed every other visit
    one = dict(rollout__full_group_size=1, advantage__full_groups="replay_rate", rollout__prefix_max_age=1)
    cfg = tiny_config(algorithm=algorithm, **one)
    layout = RunLayout(str(run_dir))
    seen: set[str] = set()
    refreshed = 0
    for it in (1, 2, 3):
        run_stages(cfg, layout, it)
        prefixes = {p["prefix_id"]: p for p in rows(layout, it, "prefixes")}
        chunks = rows(layout, it, "chunks")
        per_prefix = {pid: sum(c["prefix_id"] == pid for c in chunks) for pid in prefixes}
        for pid, p in prefixes.items():
            if p["mode"] == "chunk":
                assert p["baseline_rate"] is None and per_prefix[pid] == 4
            elif p["problem_id"] in seen:  # its whole answers are in the replay: one answer against their rate
                assert 0 < p["baseline_rate"] < 1 and per_prefix[pid] == 1
                refreshed += 1
            else:
                assert p["baseline_rate"] is None and per_prefix[pid] == 4
        scored = {c["chunk_id"]: c for c in rows(layout, it, "scored_chunks")}
        for a in rows(layout, it, "advantages"):
            rate = prefixes[a["prefix_id"]]["baseline_rate"]
            assert scored[a["chunk_id"]]["baseline_rate"] == rate
            if rate is not None:
                assert a["baseline"] == pytest.approx(rate)
                assert a["advantage"] == pytest.approx((a["target"] - rate) / math.sqrt(rate * (1 - rate)), rel=1e-5)
        # the bill: a one-answer refresh stands for the G answers full rollouts would decode
        metrics = storage.read_rows(layout.output(it, "metrics"), kind="metrics")[-1]
        ones = [c for c in chunks if prefixes[c["prefix_id"]]["baseline_rate"] is not None]
        if ones and all(c["token_ids"] for c in ones):
            assert metrics["full_rollout_tokens"] > metrics["decode_tokens"]
        seen |= {p["problem_id"] for p in prefixes.values()}
    assert refreshed > 0


def test_row_aggregation_changes_the_actor_update(run_dir, tiny_cfg, tmp_path):
    layout = RunLayout(str(run_dir))
    run_stages(tiny_cfg, layout, 1)
    # the tiny model earns no reward: give the rows advantages of both signs to train on
    adv = [{**a, "advantage": (-1.0) ** i, "weight": 1.0} for i, a in enumerate(rows(layout, 1, "advantages"))]
    signed = str(tmp_path / "advantages")
    table = storage.table_from_rows(adv, "advantages")
    storage.write_table(signed, table, kind="advantages", stage="check_readiness", config_hash="test")
    (call,) = [c for c in inprocess.stage_calls(tiny_cfg, layout, 1) if c.stage == "update_actor"]
    weights = {}
    for how in ("token", "row"):
        cfg = tiny_cfg.model_copy(update={"actor": tiny_cfg.actor.model_copy(update={"loss_aggregation": how})})
        out = str(tmp_path / how)
        stats = dataclasses.replace(call, kwargs={**call.kwargs, "advantages": signed, "out_actor": out}).run(cfg)
        assert stats.trained_chunks == len(adv) > 0
        weights[how] = ModelStore(cfg).load(out, kind="actor").model.state_dict()
    lengths = {len(c["token_ids"]) for c in rows(layout, 1, "chunks")}
    assert len(lengths) > 1  # rows of different lengths, so the two weighings differ
    assert any(not torch.equal(weights["token"][k], weights["row"][k]) for k in weights["token"])


def test_full_group_size_decodes_fewer_whole_answers_and_bills_the_full_rollouts_they_stand_for(run_dir):
    cfg = tiny_config(rollout__full_group_size=2)  # G = 4; chunk mode is on from iteration 1
    layout = RunLayout(str(run_dir))
    modes = set()
    for it in (1, 2):
        run_stages(cfg, layout, it)
        prefixes = {p["prefix_id"]: p for p in rows(layout, it, "prefixes")}
        chunks = rows(layout, it, "chunks")
        per_prefix = {pid: sum(c["prefix_id"] == pid for c in chunks) for pid in prefixes}
        assert per_prefix == {pid: 2 if p["mode"] == "full" else 4 for pid, p in prefixes.items()}
        modes |= {p["mode"] for p in prefixes.values()}
        # a 2-answer full group trains as GRPO's: +-1 on mixed outcomes, 0 when both agree
        for a in rows(layout, it, "advantages"):
            if prefixes[a["prefix_id"]]["mode"] == "full":
                assert a["advantage"] == pytest.approx(0.0, abs=1e-5) or abs(a["advantage"]) == pytest.approx(1.0, abs=1e-4)
        # full rollouts of the same problems would have decoded G answers of each full-mode problem
        metrics = storage.read_rows(layout.output(it, "metrics"), kind="metrics")[-1]
        full = [len(c["token_ids"]) for c in chunks if prefixes[c["prefix_id"]]["mode"] == "full"]
        chunk_problems = {prefixes[c["prefix_id"]]["problem_id"] for c in chunks if prefixes[c["prefix_id"]]["mode"] == "chunk"}
        mean = sum(full) / len(full) if full else 0.0
        assert metrics["full_rollout_tokens"] == pytest.approx(2 * sum(full) + len(chunk_problems) * 4 * mean)
        assert metrics["decode_tokens"] == sum(len(c["token_ids"]) for c in chunks)
    assert modes == {"full", "chunk"}


@pytest.mark.parametrize(
    "prefix_cut, scorer, before",
    [
        ("uncertain", token_logprobs, lambda other, at: other < at),  # the least likely token first
        ("entropy", token_entropies, lambda other, at: other > at),  # the most uncertain position first
    ],
)
def test_uncertain_and_entropy_cuts_end_each_prefix_right_before_the_position_they_rank_first(
    run_dir, prefix_cut, scorer, before
):
    layout = RunLayout(str(run_dir))
    boundary = tiny_config()
    run_stages(boundary, layout, 1)
    call = inprocess.stage_calls(boundary, layout, 2)[0]
    call.run(boundary)
    at_boundaries = rows(layout, 2, "prefixes")
    chunked = [p for p in at_boundaries if p["mode"] == "chunk"]
    assert chunked and all(len(p["prefix_token_ids"]) % boundary.rollout.chunk_tokens == 0 for p in chunked)
    assert all(p["cut_scan_tokens"] is None for p in at_boundaries)

    cfg = tiny_config(rollout__prefix_cut=prefix_cut)
    call.run(cfg)
    cut = rows(layout, 2, "prefixes")
    # the same problems, sources and modes: only where each chunk-mode prefix ends moves
    key = ("prefix_id", "mode", "source_trajectory_id", "ref_trajectory_id")
    assert [[p[k] for k in key] for p in cut] == [[p[k] for k in key] for p in at_boundaries]
    replay = {t["trajectory_id"]: t for t in rows(layout, 2, "replay")}
    probs = Problems.load(layout.bootstrap("problems"))
    actor = ModelStore(cfg).load(layout.output(1, "actor"), kind="actor")
    limit, seen = cfg.rollout.max_response_tokens, {}
    for p in cut:
        if p["mode"] == "full":
            assert p["cut_scan_tokens"] is None and p["prefix_token_ids"] == []
            continue
        source = replay[p["source_trajectory_id"]]["token_ids"][:limit]
        prompt = prompt_ids(actor.tokenizer, probs[p["problem_id"]]["prompt"])
        with torch.no_grad():
            values, _ = scorer(actor.model, [prompt], [source], pad_id=actor.tokenizer.pad_token_id, temperature=1.0)
        values = values[0].tolist()
        at = len(p["prefix_token_ids"])
        assert p["prefix_token_ids"] == source[:at]
        # the first prefix cut from a trajectory ends before the position ranked first, the second before the next
        rank = seen.setdefault(p["source_trajectory_id"], 0)
        assert sum(before(x, values[at]) for x in values) == rank
        seen[p["source_trajectory_id"]] += 1
        assert p["budget"] == min(cfg.rollout.chunk_tokens, limit - at)
        assert p["cut_scan_tokens"] == (len(prompt) + len(source) if rank == 0 else None)  # one scan a trajectory
    assert any(len(p["prefix_token_ids"]) % cfg.rollout.chunk_tokens for p in cut if p["mode"] == "chunk")

    # the actor's scan is billed as prefill, once per chunk-mode prefix
    for call in inprocess.stage_calls(cfg, layout, 2)[1:3]:
        call.run(cfg)
    chunks, scored = rows(layout, 2, "chunks"), rows(layout, 2, "scored_chunks")
    billed = compute_bill(actor.model, chunks, cut, scored, 0, group_size=cfg.rollout.group_size)["prefill_flops"]
    unscanned = [p | {"cut_scan_tokens": None} for p in cut]
    without = compute_bill(actor.model, chunks, unscanned, scored, 0, group_size=cfg.rollout.group_size)["prefill_flops"]
    n_layers, d_attn = attention_width(actor.model.config)
    shape = dict(n_params=count_non_embedding_params(actor.model), n_layers=n_layers, d_attn=d_attn)
    scans = sum(prefill_flops(**shape, n_tokens=p["cut_scan_tokens"]) for p in cut if p["cut_scan_tokens"])
    assert scans > 0 and billed - without == pytest.approx(scans)


def _answer(tid, reward, it=1):
    """A replayed whole answer of problem ``p``."""
    return dict(run_id="r", iteration=it, policy_version=it - 1, trajectory_id=tid, problem_id="p",
                source_trajectory_id=None, token_ids=list(range(40)), finished=True, reward=reward)  # fmt: skip


def _planned(trajectories, likelihood=None, **overrides):
    """(mode, source, reference) of each prefix ``sample_prefixes`` plans for ready problem ``p`` at iteration 2."""
    cfg = tiny_config(**{"rollout__prefix_source": "success", **overrides})
    plans = sample_prefixes._plans(cfg, 2, "p", trajectories, {"p"}, np.random.default_rng(0), likelihood)
    return [(p["mode"], p["source_trajectory_id"], p["ref_trajectory_id"]) for p in plans]


def test_success_only_prefixes_send_a_problem_without_a_success_to_full_mode():
    lost = [_answer("lost", 0.0), _answer("lost-again", 0.0)]
    # success: cut from a failure where there is no success; success_only: a fresh whole answer instead
    assert {mode for mode, _, _ in _planned(lost)} == {"chunk"}
    assert _planned(lost, rollout__prefix_source="success_only") == [("full", None, None)]
    # with a success both cut from it alone
    won = [*lost, _answer("won", 1.0)]
    assert {(m, src) for m, src, _ in _planned(won, rollout__prefix_source="success_only")} == {("chunk", "won")}
    assert _planned(won, rollout__prefix_source="success_only") == _planned(won)


def test_a_lucky_success_is_neither_a_prefix_source_nor_a_reference():
    won = [_answer("lost", 0.0), _answer("won", 1.0), _answer("lucky", 1.0, it=2)]
    likelihood = {"won": -0.5, "lucky": -6.0}
    only = {"rollout__prefix_source": "success_only", "critic__reference_min_logprob": -2.0}
    # unweighed, both successes count: here both prefixes are cut from the lucky one, shown the other
    assert _planned(won, **only) == [("chunk", "lucky", "won")] * 2
    # weighed, the lucky one is passed over: cut from and shown only the other, the source itself where allowed
    weighed = _planned(won, likelihood, **only, critic__source_reference=True)
    assert weighed == [("chunk", "won", "won")] * 2
    # with no success above the floor, success_only gives the problem a fresh whole answer
    assert _planned(won, {"won": -3.0, "lucky": -6.0}, **only) == [("full", None, None)]


def test_success_repeats_trusts_a_success_written_twice_and_shows_the_one_written_most():
    lucky = _answer("lucky", 1.0, it=3) | {"token_ids": list(range(1, 41))}  # the latest success, written once
    twice = [_answer("won", 1.0), _answer("won-again", 1.0, it=2)]
    only = {"rollout__prefix_source": "success_only", "critic__source_reference": True}
    # every success counts by default: the latest, the lucky one, is shown to every prefix not cut from it
    assert {ref for _, source, ref in _planned([*twice, lucky], **only) if source != "lucky"} == {"lucky"}
    # written once, it is neither a source nor a reference; the two written twice are shown to each other
    trusted = _planned([*twice, lucky], **only, replay__success_repeats=2)
    assert trusted and all(m == "chunk" and {src, ref} == {"won", "won-again"} for m, src, ref in trusted)
    # a problem whose every success was written once gets a fresh whole answer under success_only
    assert _planned([_answer("lost", 0.0), lucky], **only, replay__success_repeats=2) == [("full", None, None)]
    # among trusted successes the one most answers wrote is shown, not the latest
    thrice = [*twice, _answer("won-third", 1.0, it=3)]
    later = [_answer(f"new-{k}", 1.0, it=4) | {"token_ids": list(range(2, 42))} for k in range(2)]  # written twice
    shown = _planned([*thrice, *later], **only, replay__success_repeats=2)
    # the latest of the three other than the source itself
    assert shown and all(ref == ("won-again" if src == "won-third" else "won-third") for _, src, ref in shown)


def test_source_reference_shows_a_chunk_prefix_with_no_other_success_the_success_it_was_cut_from():
    one_success = [_answer("won", 1.0), _answer("lost", 0.0)]
    # by default a prefix cut from a problem's only success is shown no reference
    assert {r[:2] for r in _planned(one_success)} == {("chunk", "won")}
    assert {r[2] for r in _planned(one_success)} == {None}
    # with source_reference it is shown that success, the one it was cut from
    assert {r[2] for r in _planned(one_success, critic__source_reference=True)} == {"won"}
    # where another success is there, that one is shown, as before
    two = [*one_success, _answer("won-later", 1.0, it=2)]
    shown = _planned(two, critic__source_reference=True)
    assert shown == _planned(two) and all(ref != source and ref in ("won", "won-later") for _, source, ref in shown)
    # with no success at all a prefix is cut from a failure and no reference is shown
    assert {r[2] for r in _planned([_answer("lost", 0.0)], critic__source_reference=True)} == {None}


def test_source_reference_always_shows_a_chunk_prefix_the_success_it_was_cut_from():
    two = [_answer("won", 1.0), _answer("lost", 0.0), _answer("won-later", 1.0, it=2)]
    always = _planned(two, critic__source_reference="always")
    assert {source for _, source, _ in always} <= {"won", "won-later"}
    assert all(mode == "chunk" and ref == source for mode, source, ref in always)
    assert all(ref != source for _, source, ref in _planned(two, critic__source_reference=True))  # true: another one
    # a prefix cut from a failure is shown another success, as under true; none where there is no success
    failed = _planned([_answer("lost", 0.0), _answer("won", 1.0)], rollout__prefix_source="any")
    cut_from_failure = _planned([_answer("lost", 0.0), _answer("won", 1.0)], rollout__prefix_source="any",
                                critic__source_reference="always")  # fmt: skip
    assert [r for r in cut_from_failure if r[1] == "lost"] == [r for r in failed if r[1] == "lost"]
    assert {r[2] for r in _planned([_answer("lost", 0.0)], critic__source_reference="always")} == {None}


def test_reference_min_logprob_shows_the_most_likely_success_and_bills_the_actors_read(run_dir):
    """Each chosen problem's successes are weighed under the current actor: the most likely is the
    reference, those below the floor are never one, and the tokens read are billed as prefill."""
    cfg = tiny_config()
    layout = RunLayout(str(run_dir))
    call = inprocess.stage_calls(cfg, layout, 1)[0]
    probs = Problems.load(layout.bootstrap("problems"))
    actor = ModelStore(cfg).load(call.kwargs["actor"], kind="actor")
    tok = actor.tokenizer
    successes = []  # three successes of every train problem the draw can take (revisit_fraction 1)
    for pid in probs.ids("train")[:2]:
        solution = tok.encode(probs[pid]["solution"], add_special_tokens=False)
        for k, answer in enumerate([solution, solution[::-1], solution[1:]]):
            row = dict(run_id=cfg.run_id, iteration=0, policy_version=0, trajectory_id=f"{pid}-{k}", problem_id=pid)
            successes.append(row | dict(source_trajectory_id=None, token_ids=answer, finished=True, reward=1.0))
    logprob = {}
    for t in successes:
        prompt = prompt_ids(tok, probs[t["problem_id"]]["prompt"])
        with torch.no_grad():
            values, mask = token_logprobs(actor.model, [prompt], [t["token_ids"]], pad_id=tok.pad_token_id, temperature=1.0)
        logprob[t["trajectory_id"]] = float((values * mask).sum())
    # the least likely success of each problem is its latest, so the latest and the likeliest part
    for rank, t in enumerate(sorted(successes, key=lambda t: -logprob[t["trajectory_id"]])):
        t["iteration"] = t["policy_version"] = rank
    replay = str(run_dir / "seeded-replay")
    storage.write_table(replay, storage.table_from_rows(successes, "replay"), kind="replay", stage="test", config_hash="x")

    def sample(floor):
        c = dataclasses.replace(call, kwargs={**call.kwargs, "replay": replay})
        c.run(tiny_config(critic__reference_min_logprob=floor))
        return [p for p in rows(layout, 1, "prefixes") if p["problem_id"] in {t["problem_id"] for t in successes}]

    def best(pid, floor=-math.inf):
        ok = [t for t in successes if t["problem_id"] == pid and logprob[t["trajectory_id"]] >= floor]
        return max(ok, key=lambda t: logprob[t["trajectory_id"]])["trajectory_id"] if ok else None

    latest = {p["problem_id"]: p["ref_trajectory_id"] for p in sample(None)}
    newest = {t["problem_id"]: t["trajectory_id"] for t in sorted(successes, key=lambda t: t["iteration"])}
    assert latest and latest == {pid: newest[pid] for pid in latest}
    planned = sample(-1e9)
    assert {p["problem_id"]: p["ref_trajectory_id"] for p in planned} == {pid: best(pid) for pid in latest}
    assert all(best(pid) != ref for pid, ref in latest.items())
    # the read is billed once a problem: its prompt and every success's tokens
    for pid in latest:
        mine = [p for p in planned if p["problem_id"] == pid]
        read = sum(len(prompt_ids(tok, probs[pid]["prompt"])) + len(t["token_ids"]) for t in successes if t["problem_id"] == pid)
        assert [p["cut_scan_tokens"] for p in mine] == [read] + [None] * (len(mine) - 1)
    # a floor between the likeliest success and the rest leaves only the likeliest; above all of them, none
    floor = sorted(logprob.values())[-1] - 1e-3
    assert {p["problem_id"]: p["ref_trajectory_id"] for p in sample(floor)} == {pid: best(pid, floor) for pid in latest}
    assert {p["ref_trajectory_id"] for p in sample(0.0)} == {None}
