"""The config tree: the shipped config loads; bad input fails naming the field and the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from ac2_core.config import AC2Config, ConfigError, config_from_json, load_config, parse_config

TOY = Path(__file__).resolve().parents[2] / "pipelines" / "configs" / "toy.yaml"


def _toy_dict() -> dict:
    return yaml.safe_load(TOY.read_text())


def test_shipped_toy_config_loads_as_written():
    cfg = load_config(TOY)
    raw = _toy_dict()
    assert isinstance(cfg, AC2Config)
    # Spot checks against the file itself, so an edit to toy.yaml cannot make this fail.
    assert cfg.run_id == raw["run_id"]
    assert cfg.rollout.max_response_tokens == raw["rollout"]["max_response_tokens"]
    assert cfg.critic.warmup_iterations == raw["critic"]["warmup_iterations"]
    assert cfg.model.tiny.head_dim == raw["model"]["tiny"]["head_dim"]
    # A key the file leaves out keeps its default.
    assert "weight_decay" not in raw["actor"]
    assert cfg.actor.weight_decay == AC2Config().actor.weight_decay


def _error(data: dict) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(data, "my.yaml")
    return str(err.value)


@pytest.mark.parametrize(
    "data, field",
    [
        ({"sede": 1}, "sede"),
        ({"rollout": {"group_sise": 4}}, "rollout.group_sise"),
        ({"model": {"tiny": {"head_dims": 64}}}, "model.tiny.head_dims"),
    ],
)
def test_unknown_key_names_the_dotted_field(data, field):
    msg = _error(data)
    assert f"{field}: unknown key" in msg
    assert "my.yaml" in msg


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"rollout": {"group_size": 1}}, ["rollout.group_size:", "greater than or equal to 2", "found 1"]),
        ({"readiness": {"max_error": -1}}, ["readiness.max_error:", "greater than or equal to 0", "found -1"]),
        ({"rollout": {"prefix_max_age": 0}}, ["rollout.prefix_max_age:", "greater than or equal to 1", "found 0"]),
        ({"model": {"tiny": {"head_dim": 16}}}, ["model.tiny.head_dim:", "greater than or equal to 32", "found 16"]),
        # Cross-field checks are reported on the section, naming the field(s) inside it.
        (
            {"rollout": {"chunk_tokens": 100, "max_response_tokens": 80}},
            ["rollout.chunk_tokens:", "chunk_tokens (100) must not exceed max_response_tokens (80)"],
        ),
        (
            {"rollout": {"group_size": 4, "full_group_size": 5}},
            ["rollout.full_group_size:", "full_group_size (5) must not exceed group_size (4)"],
        ),
        ({"rollout": {"full_group_size": 0}}, ["rollout.full_group_size:", "greater than or equal to 1", "found 0"]),
        ({"readiness": {"min_pairs": 40, "window": 32}}, ["readiness.min_pairs:", "min_pairs (40) must not exceed window (32)"]),
        ({"model": {"source": "pretrained"}}, ["model.path:", "required when source is pretrained"]),
        (
            {"model": {"tiny": {"num_heads": 3, "num_kv_heads": 2}}},
            ["model.tiny.num_heads:", "num_heads (3)", "num_kv_heads (2)"],
        ),
        (
            {"critic": {"surprise": True, "scoring_backend": "vllm"}},
            ["critic.surprise: surprise reads the critic's next-token head", "scoring_backend hf"],
        ),
        (
            {"critic": {"reference_match": True, "use_reference": False}},
            ["critic.reference_match: reference_match reads the reference", "needs use_reference true"],
        ),
        (
            {"critic": {"reference_left_flag": True}},
            ["critic.reference_left_flag: reference_left_flag is one of the reference-match features", "reference_match true"],
        ),
        (
            {"critic": {"source_reference": True, "use_reference": False}},
            ["critic.source_reference: source_reference picks a reference", "needs use_reference true"],
        ),
        (
            {"critic": {"reference_min_logprob": -2.0, "use_reference": False}},
            ["critic.reference_min_logprob: reference_min_logprob picks a reference", "needs use_reference true"],
        ),
        (
            {"critic": {"reference_min_logprob": 0.5}},
            ["critic.reference_min_logprob", "less than or equal to 0"],
        ),
        (
            {"critic": {"reference_match": True, "scoring_backend": "vllm"}},
            ["critic.reference_match: reference_match feeds the value head", "scoring_backend hf"],
        ),
        (
            {"advantage": {"std_floor": 0.1}},
            ["std_floor (0.1) bounds the std that scale_std divides by", "set scale_std true"],
        ),
        (
            {"warm_start": {"misconception_rate": 1.5}},
            ["warm_start.misconception_rate:", "less than or equal to 1", "found 1.5"],
        ),
        (
            {"warm_start": {"misconception_rate": 0.5, "misconception_digits": [0, 9]}},
            ["warm_start.misconception_digits: misconception_digits must be distinct ones digits from 1 to 9", "found [0, 9]"],
        ),
        (
            {"warm_start": {"misconception_rate": 0.5, "misconception_digits": [8, 8]}},
            ["warm_start.misconception_digits:", "found [8, 8]"],
        ),
        (
            {"warm_start": {"misconception_digits": [8, 9]}},
            ["warm_start.misconception_digits names the misconception's triggers", "misconception_rate is 0"],
        ),
        (
            {"task": {"name": "math", "data": "p.jsonl", "shape": "final_answer"}, "warm_start": {"misconception_rate": 0.5}},
            ["warm_start.misconception_rate: warm_start.misconception_rate writes a misconception", "task math has none"],
        ),
    ],
)
def test_out_of_range_values_name_the_field(data, expected):
    msg = _error(data)
    for part in expected:
        assert part in msg, (part, msg)


def test_in_range_edge_values_are_accepted():
    # The exact bounds of the checks above: equal is allowed.
    cfg = parse_config(
        {
            "rollout": {"group_size": 2, "chunk_tokens": 80, "max_response_tokens": 80},
            "readiness": {"max_error": 0, "min_pairs": 32, "window": 32},
            "model": {"source": "pretrained", "path": "/models/x"},
        }
    )
    assert cfg.rollout.group_size == 2 and cfg.readiness.min_pairs == 32 and cfg.model.path == "/models/x"


def test_wrong_literal_lists_the_allowed_values():
    msg = _error({"algorithm": "ppo"})
    assert "algorithm:" in msg and "'ppo'" in msg
    assert "'ac2'" in msg and "'grpo'" in msg
    msg = _error({"readiness": {"metric": "mse"}})
    assert "readiness.metric:" in msg
    for allowed in ("binned_calibration", "brier_ratio", "auc"):
        assert allowed in msg


def test_every_error_is_reported_at_once():
    msg = _error({"seed": "x", "rollout": {"group_size": 0, "typo": 1}})
    assert "seed:" in msg and "rollout.group_size:" in msg and "rollout.typo: unknown key" in msg


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
@pytest.mark.parametrize("overrides", [None, {"rollout.group_size": 4}])
def test_non_mapping_yaml_document_names_the_file(tmp_path, text, overrides):
    path = tmp_path / "list.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    assert str(path) in str(err.value)
    assert "expected a mapping" in str(err.value)


def test_invalid_yaml_names_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("rollout: {group_size: 4\nseed: [\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value)
    assert "not valid YAML" in str(err.value)


def test_missing_file_names_the_file(tmp_path):
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match="cannot read config") as err:
        load_config(path)
    assert str(path) in str(err.value)


def test_invalid_value_in_a_file_names_the_file_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rollout:\n  group_size: 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value) and "rollout.group_size" in str(err.value)


def test_config_hash_is_stable_and_follows_every_field():
    a, b = load_config(TOY), parse_config(_toy_dict())
    assert a == b
    assert a.config_hash() == b.config_hash()
    assert len(a.config_hash()) == 64
    # A default written out explicitly is the same config.
    explicit = _toy_dict() | {"actor": _toy_dict()["actor"] | {"weight_decay": AC2Config().actor.weight_decay}}
    assert parse_config(explicit).config_hash() == a.config_hash()
    # One changed field, top level or nested, changes the hash.
    seen = {a.config_hash()}
    for change in ({"seed": a.seed + 1}, {"rollout.group_size": a.rollout.group_size + 1}, {"model.tiny.num_layers": 1}):
        seen.add(load_config(TOY, change).config_hash())
    assert len(seen) == 4


def test_config_survives_its_json_form():
    cfg = load_config(TOY, {"critic.td_weight": 0.5})
    again = config_from_json(cfg.to_json())
    assert again == cfg and again.config_hash() == cfg.config_hash()


def test_dotted_overrides_apply_on_top_of_the_file():
    base = load_config(TOY)
    cfg = load_config(TOY, {"rollout.group_size": 4, "model.tiny.num_layers": 2, "algorithm": "grpo", "eval.every": 3})
    assert cfg.rollout.group_size == 4
    assert cfg.model.tiny.num_layers == 2
    assert cfg.algorithm == "grpo" and not cfg.uses_critic
    assert cfg.eval.every == 3
    # Everything not overridden is as in the file, in the same section too.
    assert cfg.rollout.chunk_tokens == base.rollout.chunk_tokens
    assert cfg.model.tiny.hidden_size == base.model.tiny.hidden_size
    assert cfg.critic == base.critic


def test_overrides_are_validated_like_the_file():
    with pytest.raises(ConfigError, match="rollout.group_sise: unknown key"):
        load_config(TOY, {"rollout.group_sise": 4})
    with pytest.raises(ConfigError, match="rollout.group_size"):
        load_config(TOY, {"rollout.group_size": 1})
    with pytest.raises(ConfigError, match="override seed.x: seed is not a section"):
        load_config(TOY, {"seed.x": 1})


def test_config_is_frozen():
    cfg = load_config(TOY)
    with pytest.raises(ValidationError, match="frozen"):
        cfg.seed = 1
    with pytest.raises(ValidationError, match="frozen"):
        cfg.rollout.group_size = 3
    assert cfg == load_config(TOY)


def test_full_group_size_applies_to_full_groups_of_ac2_once_chunk_mode_is_on():
    cfg = parse_config({"rollout": {"group_size": 4, "full_group_size": 2}, "critic": {"warmup_iterations": 3}})
    assert [cfg.samples_per_group(it, "full") for it in (1, 3, 4, 9)] == [4, 4, 2, 2]
    assert {cfg.samples_per_group(it, "chunk") for it in (1, 4, 9)} == {4}
    grpo = parse_config({"algorithm": "grpo", "rollout": {"group_size": 4, "full_group_size": 2}})
    assert {grpo.samples_per_group(it, "full") for it in (1, 4, 9)} == {4}  # GRPO ignores it
    unset = parse_config({"rollout": {"group_size": 4}, "critic": {"warmup_iterations": 0}})
    assert unset.samples_per_group(5, "full") == 4


def test_success_repeats_and_the_likelihood_floor_are_not_both_set():
    with pytest.raises(ConfigError, match="replay.success_repeats and critic.reference_min_logprob each choose"):
        parse_config({"replay": {"success_repeats": 2}, "critic": {"reference_min_logprob": -2.0}})
    with pytest.raises(ConfigError, match="replay.success_repeats"):
        parse_config({"replay": {"success_repeats": 0}})
    assert parse_config({"replay": {"success_repeats": 2}}).replay.success_repeats == 2
    assert parse_config({}).replay.success_repeats == 1


def test_one_answer_full_groups_need_the_replay_rate_baseline_and_only_problems_with_one_get_them():
    with pytest.raises(ConfigError, match="full_group_size 1 leaves a full-mode answer no group.*replay_rate.*found grpo"):
        parse_config({"rollout": {"group_size": 4, "full_group_size": 1}})
    rollout = {"group_size": 4, "full_group_size": 1}
    cfg = parse_config({"rollout": rollout, "advantage": {"full_groups": "replay_rate"}, "critic": {"warmup_iterations": 3}})
    assert [cfg.replay_rate_on(it) for it in (1, 3, 4, 9)] == [False, False, True, True]
    assert [cfg.samples_per_group(it, "full", baseline_rate=0.25) for it in (1, 3, 4, 9)] == [4, 4, 1, 1]
    assert cfg.samples_per_group(9, "full") == 4  # no graded whole answer to be measured against: a group of G
    assert cfg.samples_per_group(9, "chunk", baseline_rate=0.25) == 4
    # GRPO measured alike decodes alike; without the replay rate it ignores full_group_size, as before
    one = {"rollout": {"group_size": 4, "full_group_size": 1}, "critic": {"warmup_iterations": 3}}
    grpo = parse_config({"algorithm": "grpo", **one, "advantage": {"full_groups": "replay_rate"}})
    assert [grpo.samples_per_group(it, "full", baseline_rate=0.25) for it in (3, 4)] == [4, 1]
    plain = parse_config({"algorithm": "grpo", "rollout": {"group_size": 4, "full_group_size": 2}})
    assert not plain.replay_rate_on(9) and plain.samples_per_group(9, "full", baseline_rate=0.25) == 4


def test_misconception_rate_unset_leaves_every_hash_and_dump_as_before():
    # a config without the misconception dumps as it did before the field existed, so its
    # bootstraps and run folders stay adoptable; set, it is a bootstrap of its own
    cfg = load_config(TOY)
    assert "misconception_rate" not in cfg.to_json() and cfg.warm_start.misconception_rate == 0
    assert load_config(TOY, {"warm_start.misconception_rate": 0.0}).bootstrap_hash() == cfg.bootstrap_hash()
    varied = load_config(TOY, {"warm_start.misconception_rate": 0.5})
    assert varied.bootstrap_hash() != cfg.bootstrap_hash() and varied.config_hash() != cfg.config_hash()
    again = config_from_json(varied.to_json())
    assert again == varied and again.warm_start.misconception_rate == 0.5
    # the default triggers (9 alone) dump as before too; others make a bootstrap of their own
    assert load_config(TOY, {"warm_start.misconception_rate": 0.5, "warm_start.misconception_digits": [9]}) == varied
    assert "misconception_digits" not in varied.to_json()
    more = load_config(TOY, {"warm_start.misconception_rate": 0.5, "warm_start.misconception_digits": [7, 8, 9]})
    assert more.bootstrap_hash() != varied.bootstrap_hash()
    assert config_from_json(more.to_json()).warm_start.misconception_digits == (7, 8, 9)


@pytest.mark.parametrize(
    "field, value",
    [("rollout.full_group_size", 2), ("replay.whole_answers_first", True)],
)
def test_fields_added_later_leave_a_default_config_dumping_and_hashing_as_before(field, value):
    section, name = field.split(".")
    default = load_config(TOY)
    assert name not in default.model_dump(mode="json")[section]  # as configs were before the field existed
    assert config_from_json(default.to_json()) == default
    changed = load_config(TOY, {field: value})
    assert changed.model_dump(mode="json")[section][name] == value
    assert changed.config_hash() != default.config_hash()
    assert config_from_json(changed.to_json()) == changed
