"""Process counts against the cluster section, the micro-batch deal, and the sizing plan (no processes start here)."""

from __future__ import annotations

import pytest

from ac2_core.config import ConfigError
from ac2_core.config.parallel import layout
from ac2_core.math import decode_flops
from ac2_core.plan import Architecture, Shape, make_plan
from ac2_core.training.data_parallel import Ranks, share
from pipelines.cli import main
from tests.conftest import ROOT, tiny_config

REFERENCE = ROOT / "pipelines" / "configs" / "qwen3_4b_fineproofs.yaml"
QWEN3_4B = ROOT / "pipelines" / "configs" / "qwen3-4b-architecture.json"
GPU_TASKS = {"cluster": {"gpu": {"accelerator_count": 2}}}


def test_the_roles_name_the_recipes_stages_that_hold_models():
    from ac2_core.config.parallel import GENERATION_STAGES, SCORING_STAGES, TRAINING_STAGES, role_of
    from ac2_core.stages.recipe import BY_NAME, ITERATION

    assert set(TRAINING_STAGES + SCORING_STAGES + GENERATION_STAGES) <= set(BY_NAME)
    # every iteration stage that loads a model has a role, and the updates are the ones that train; but
    # sample_prefixes, which reads the actor once in one process (rollout.prefix_cut uncertain), uses what its task is given
    assert {s.name for s in ITERATION if s.models and role_of(s.name) is None} == {"sample_prefixes"}
    assert {s.name for s in ITERATION if s.outputs in (("actor",), ("critic",))} == set(TRAINING_STAGES)
    assert role_of("sample_prefixes") is None and role_of("check_readiness") is None


def test_unset_process_counts_follow_the_gpus_of_the_task():
    cfg = tiny_config(generation__backend="vllm", generation__tensor_parallel_size=2)
    assert layout(cfg, "train").resolve(8) == 8 and layout(cfg, "train").resolve(0) == 1
    assert layout(cfg, "generate").resolve(8) == 4  # engines of 2 GPUs
    assert layout(cfg, "score").resolve(8) == 8  # critic scoring stays on hf: one GPU a process


@pytest.mark.parametrize(
    ("override", "fields"),
    [
        ({"training.num_processes": 4}, ("training.num_processes", "cluster.gpu.accelerator_count")),
        ({"generation.num_processes": 1}, ("generation.num_processes", "cluster.gpu.accelerator_count")),
        (
            {"generation.backend": "vllm", "generation.num_processes": 2, "generation.tensor_parallel_size": 2},
            ("generation.num_processes", "generation.tensor_parallel_size", "cluster.gpu.accelerator_count"),
        ),
    ],
)
def test_validate_refuses_parallelism_that_does_not_fit_the_cluster(tmp_path, capsys, override, fields):
    sets = [f"cluster={GPU_TASKS['cluster']}"] + [f"{k}={v}" for k, v in override.items()]
    code = main(["validate", "--config", str(ROOT / "pipelines/configs/toy.yaml"), *sum((["--set", s] for s in sets), [])])
    err = capsys.readouterr().err
    assert code == 2
    for field in fields:
        assert field in err


def test_parallelism_that_fits_the_cluster_validates():
    ok = tiny_config(cluster=GPU_TASKS["cluster"], training__num_processes=2, generation__num_processes=2)
    assert ok.training.num_processes == 2
    tiny_config(cluster=GPU_TASKS["cluster"])  # unset counts take the task's GPUs
    with pytest.raises(ConfigError, match=r"generation\.tensor_parallel_size \(4\)"):
        tiny_config(cluster=GPU_TASKS["cluster"], generation__backend="vllm", generation__tensor_parallel_size=4)


def test_counts_say_where_not_what_so_hashes_ignore_them():
    base = tiny_config()
    assert tiny_config(training__num_processes=2, generation__num_processes=3, training__launch="always").config_hash() == (
        base.config_hash()
    )


def test_micro_batches_are_dealt_round_robin_and_padded_at_weight_zero():
    mbs = ["a", "b", "c"]
    assert share(mbs, None) == share(mbs, Ranks(0, 1)) == [("a", 1.0), ("b", 1.0), ("c", 1.0)]
    assert share(mbs, Ranks(0, 2)) == [("a", 1.0), ("c", 1.0)]
    assert share(mbs, Ranks(1, 2)) == [("b", 1.0), ("b", 0.0)]  # one short: its own again, counted 0
    assert share(["a"], Ranks(2, 3)) == [("a", 0.0)]  # none of its own: every process still runs one forward
    assert share([], Ranks(1, 2)) == []


def test_qwen3_4b_sizes_and_the_training_state_of_zero3():
    arch = Architecture.of(tiny_config(), str(QWEN3_4B))
    # per layer: q,k,v,o = 2560*(4096+2*1024) + 4096*2560 = 26,214,400, q/k norms 256, MLP 3*2560*9728 = 74,711,040,
    # two norms 5,120: 100,930,816; 36 layers and the final norm: 3,633,511,936 (Qwen's card: 3.6B non-embedding)
    assert arch.non_embedding == 36 * 100_930_816 + 2560
    assert arch.actor_params == arch.non_embedding + 151_936 * 2560  # tied embeddings: 4.02B
    cfg = tiny_config(model__dtype="bfloat16", training__backend="deepspeed", training__zero_stage=3)
    plan = make_plan(cfg, gpus=8, arch=arch)
    state = plan.memory["update_actor"]
    # ZeRO-3 over 8: bf16 weights and grads, fp32 master weights and two moments, each an eighth
    assert state["weights"] == pytest.approx(arch.actor_params * 2 / 8 / 2**30)
    assert state["optimizer"] == pytest.approx(arch.actor_params * 12 / 8 / 2**30)
    torch_plan = make_plan(tiny_config(model__dtype="bfloat16"), gpus=8, arch=arch)
    assert torch_plan.memory["update_actor"]["optimizer"] == pytest.approx(arch.actor_params * 4 / 2**30)  # replicated


def test_the_plan_counts_flops_with_the_metrics_accounting():
    cfg = tiny_config()
    arch = Architecture.of(cfg)
    plan = make_plan(cfg, gpus=1, arch=arch, shape=Shape(prompt_tokens=20))
    r = cfg.rollout
    one = decode_flops(n_params=arch.non_embedding, n_layers=arch.layers, d_attn=arch.d_attn, start=20, n_tokens=32)
    assert plan.flops["decode"] == r.problems_per_iteration * r.group_size * one
    assert plan.tokens["decode"] == r.problems_per_iteration * r.group_size * r.max_response_tokens
    half = make_plan(cfg, gpus=1, arch=arch, shape=Shape(prompt_tokens=20, ready_share=0.5))
    assert half.tokens["decode"] < plan.tokens["decode"]  # chunks decode less than whole answers


def test_the_plan_decodes_one_answer_refreshes_for_revisited_problems_only():
    arch, shape = Architecture.of(tiny_config()), Shape(prompt_tokens=20)
    one = dict(rollout__full_group_size=1, advantage__full_groups="replay_rate")
    r = tiny_config().rollout
    # every problem a revisit: each full-mode problem decodes one answer
    revisits = make_plan(tiny_config(**one, rollout__revisit_fraction=1.0), gpus=1, arch=arch, shape=shape)
    assert revisits.tokens["decode"] == r.problems_per_iteration * r.max_response_tokens
    # half of them new: those have no rate yet and decode G
    half = make_plan(tiny_config(**one, rollout__revisit_fraction=0.5), gpus=1, arch=arch, shape=shape)
    new = r.problems_per_iteration // 2
    assert half.tokens["decode"] == (new * r.group_size + new) * r.max_response_tokens


def test_the_plan_counts_a_dense_critic_by_answers_and_an_oracle_as_free():
    arch = Architecture.of(tiny_config())
    r = tiny_config().rollout
    boundaries = make_plan(tiny_config(), gpus=1, arch=arch, shape=Shape(prompt_tokens=20))
    dense_cfg = tiny_config(critic__dense=True)
    dense = make_plan(dense_cfg, gpus=1, arch=arch, shape=Shape(prompt_tokens=20))
    # one example per finished answer, each the whole answer (the longest critic input)
    drawn = min(dense_cfg.critic.batch_size, r.problems_per_iteration * r.group_size)
    assert dense.tokens["critic_train"] == dense_cfg.critic.steps_per_iteration * drawn * dense.tokens["critic_input_max"]
    assert dense.flops["critic"] == boundaries.flops["critic"]  # scoring is unchanged: V at each chunk boundary
    oracle = make_plan(tiny_config(critic__kind="oracle"), gpus=1, arch=arch, shape=Shape(prompt_tokens=20))
    assert boundaries.flops["critic"] > 0 and boundaries.flops["critic_train"] > 0
    assert oracle.flops["critic"] == oracle.flops["critic_train"] == 0
    assert oracle.flops["decode"] == boundaries.flops["decode"]
    assert any("oracle" in note for note in oracle.notes)


def test_ac2_plan_prints_the_reference_configs_memory_and_flops(capsys):
    code = main(["plan", "--config", str(REFERENCE), "--gpus", "8", "--arch", str(QWEN3_4B)])
    out = capsys.readouterr().out
    assert code == 0
    for stage in ("generate_chunks", "score_chunks", "update_actor", "update_critic"):
        assert f"| {stage} | 8 x 1 |" in out
    assert "| decode | 19,922,944 |" in out  # 64 problems x 8 samples x 38,912 tokens
    # ZeRO-3 over 8: the fp32 master weights and moments of 4.02B parameters, an eighth each (12 B / 8 / 2^30)
    assert "| update_actor | 8 x 1 | 0.9 | 0.9 | 5.6 |" in out


def test_ac2_plan_asks_for_the_architecture_of_a_remote_model(capsys):
    assert main(["plan", "--config", str(REFERENCE), "--gpus", "8"]) == 1
    assert "--arch" in capsys.readouterr().err
