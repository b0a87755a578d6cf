"""One AC2 iteration on CUDA through the real stages, with each training backend (skipped without CUDA).

``pytest -q -s tests/gpu/test_gpu_iteration.py`` prints the report of ``tests/gpu/iteration.py``
(tokens/s, step times) and writes it to ``$OUT/gpu_iteration.md`` when OUT is set.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.gpu.iteration import GPU_RUN, backends, measure, report, write_report

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_one_ac2_iteration_on_cuda_with_each_training_backend(tmp_path):
    rows = measure(GPU_RUN, tmp_path, backends())
    write_report(report(rows, title="One AC2 iteration on CUDA (hidden 1024, 8 layers, bf16, hf generation)"))
    for r in rows:
        assert set(r["devices"].values()) == {"cuda:0"}, r["backend"]
        assert r["dtypes"]["actor"] == "torch.bfloat16"  # model.dtype, as loaded by the stages
        assert r["decode_tokens"] > 0 and r["tokens_per_second"] > 0
        assert r["metrics"]["update_actor"]["trained_chunks"] > 0  # the critic baseline gives every chunk A = -0.5
        assert r["metrics"]["update_critic"]["examples"] > 0
        assert math.isfinite(r["metrics"]["update_actor"]["loss"]) and math.isfinite(r["metrics"]["update_critic"]["loss_last"])
    # one bootstrap, seeded sampling on the device generator: both backends decode the same chunks
    assert len({r["metrics"]["generate_chunks"]["chunks_hash"] for r in rows}) == 1
