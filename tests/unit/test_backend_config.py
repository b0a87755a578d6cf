"""The backend settings of the config: accepted choices, and errors that name the field."""

from __future__ import annotations

import pytest

from ac2_core.config import ConfigError
from ac2_core.generation.vllm import EngineSettings
from tests.conftest import tiny_config


def test_vllm_and_deepspeed_are_backends_with_their_settings():
    cfg = tiny_config(
        generation__backend="vllm",
        generation__kv_cache_gib=0.5,
        generation__enforce_eager=True,
        training__backend="deepspeed",
        training__zero_stage=3,
    )
    settings = EngineSettings.from_config(cfg)
    assert (settings.kv_cache_gib, settings.enforce_eager, settings.dtype) == (0.5, True, cfg.model.dtype)
    assert cfg.training.zero_stage == 3
    # the settings are part of what a run computes with, so they change its config hash
    assert cfg.config_hash() != tiny_config().config_hash()


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"generation__backend": "sglang"}, "generation.backend"),
        ({"training__backend": "fsdp"}, "training.backend"),
        ({"training__zero_stage": 4}, "training.zero_stage"),
        ({"generation__gpu_memory_utilization": 1.5}, "generation.gpu_memory_utilization"),
        ({"generation__tensor_parallel_size": 0}, "generation.tensor_parallel_size"),
        ({"generation__kv_cache_gib": 0}, "generation.kv_cache_gib"),
    ],
)
def test_bad_backend_settings_name_the_field(override, field):
    with pytest.raises(ConfigError, match=rf"\b{field}\b"):
        tiny_config(**override)
