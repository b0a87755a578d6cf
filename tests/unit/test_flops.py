"""Hand-computed checks of ac2_core.math.flops."""

from types import SimpleNamespace

import pytest
import torch

from ac2_core.math.flops import (
    attention_width,
    count_non_embedding_params,
    critic_flops,
    decode_flops,
    prefill_flops,
    train_flops,
)

# N = 10, n_layers = 2, d_attn = 3: a token at position t costs 2*10 + 4*2*3*t = 20 + 24t
SMALL = dict(n_params=10, n_layers=2, d_attn=3)


def test_decode_flops_closed_form_matches_hand_sum():
    # positions 4, 5, 6: (20 + 96) + (20 + 120) + (20 + 144) = 116 + 140 + 164 = 420
    assert decode_flops(**SMALL, start=4, n_tokens=3) == 420
    # one token at position 0 costs 2N = 20; no tokens cost 0
    assert decode_flops(**SMALL, start=0, n_tokens=1) == 20
    assert decode_flops(**SMALL, start=7, n_tokens=0) == 0


def test_prefill_and_critic_flops():
    # positions 0, 1, 2: 20 + 44 + 68 = 132
    assert prefill_flops(**SMALL, n_tokens=3) == 132
    assert critic_flops(**SMALL, n_tokens=3) == 132
    # prefill of 4 (20 + 44 + 68 + 92 = 224) then decode of 3 from 4 (420) = 644
    # = prefill of 7: 7*20 + 24*(0+1+...+6) = 140 + 24*21 = 644
    assert prefill_flops(**SMALL, n_tokens=4) + decode_flops(**SMALL, start=4, n_tokens=3) == 644
    assert prefill_flops(**SMALL, n_tokens=7) == 644
    assert prefill_flops(**SMALL, n_tokens=3, start=4) == 420


def test_flops_are_exact_python_ints():
    # 8e9 params, 36 layers, d_attn 4096, 3 tokens from position 10**6:
    # 2*8e9*3 = 48_000_000_000; 4*36*4096 = 589_824; positions sum 3*10**6 + 3 = 3_000_003
    # 589_824 * 3_000_003 = 1_769_473_769_472 -> total 1_817_473_769_472
    value = decode_flops(n_params=8_000_000_000, n_layers=36, d_attn=4096, start=10**6, n_tokens=3)
    assert type(value) is int
    assert value == 1_817_473_769_472


def test_train_flops():
    # 6 * 10 * 7 = 420
    assert train_flops(n_params=10, n_tokens=7) == 420


def test_flops_reject_negative_and_float_counts():
    with pytest.raises(ValueError, match="n_tokens must be >= 0"):
        decode_flops(**SMALL, start=0, n_tokens=-1)
    with pytest.raises(ValueError, match="start must be an integer"):
        decode_flops(**SMALL, start=1.5, n_tokens=2)


class TinyLM(torch.nn.Module):
    """HF-style names: model.embed_tokens, model.layers.0, model.norm, lm_head."""

    def __init__(self, tie: bool):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(5, 4)  # 20 params
        self.model.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4)])  # 16 + 4 = 20
        self.model.norm = torch.nn.LayerNorm(4, bias=False)  # 4
        self.lm_head = torch.nn.Linear(4, 5, bias=False)  # 20
        if tie:
            self.lm_head.weight = self.model.embed_tokens.weight


@pytest.mark.parametrize("tie", [False, True])
def test_count_non_embedding_params(tie):
    # 20 (layer) + 4 (norm) = 24; embed_tokens and lm_head are left out, tied or not
    assert count_non_embedding_params(TinyLM(tie)) == 24


def test_attention_width():
    # Qwen3-style explicit head_dim that differs from hidden_size // heads: 4 * 32 = 128
    cfg = SimpleNamespace(num_hidden_layers=4, num_attention_heads=4, head_dim=32, hidden_size=64)
    assert attention_width(cfg) == (4, 128)
    # no head_dim (or None): 96 // 4 = 24 per head -> 4 * 24 = 96
    cfg = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, hidden_size=96)
    assert attention_width(cfg) == (2, 96)
    cfg.head_dim = None
    assert attention_width(cfg) == (2, 96)


def test_chunk_saving_bound():
    from ac2_core.math.savings import chunk_saving_bound

    # the toy as it was: half the problems revisited, a quarter of the ready ones probes,
    # 2 prefixes x 16 tokens against a 57-token answer: 0.5 * 0.75 * (1 - 32/57) = 0.375 * 25/57
    assert chunk_saving_bound(
        revisit_fraction=0.5, probe_fraction=0.25, prefixes_per_problem=2, chunk_tokens=16, answer_tokens=57
    ) == pytest.approx(0.375 * 25 / 57)
    # chunks that cost more than an answer save nothing (not a negative saving)
    assert (
        chunk_saving_bound(revisit_fraction=1.0, probe_fraction=0.0, prefixes_per_problem=2, chunk_tokens=32, answer_tokens=57)
        == 0.0
    )
    with pytest.raises(ValueError, match="answer_tokens"):
        chunk_saving_bound(revisit_fraction=1, probe_fraction=0, prefixes_per_problem=1, chunk_tokens=1, answer_tokens=0)
    # full groups of 2 answers where G = 4: the 10% + 90% * 10% of problems left in full mode save half
    toy = dict(revisit_fraction=0.9, probe_fraction=0.1, prefixes_per_problem=1, chunk_tokens=16, answer_tokens=100)
    assert chunk_saving_bound(**toy, full_group_ratio=0.5) == pytest.approx(0.81 * 0.84 + 0.19 * 0.5)
    # under a replay-rate baseline only the revisited probes decode the smaller group; new problems G
    assert chunk_saving_bound(**toy, full_group_ratio=0.25, smaller_for_revisits_only=True) == pytest.approx(
        0.81 * 0.84 + 0.09 * 0.75
    )
    with pytest.raises(ValueError, match="full_group_ratio"):
        chunk_saving_bound(**toy, full_group_ratio=0)


def test_full_rollout_tokens():
    from ac2_core.math.savings import full_rollout_tokens

    # one full group of G = 4 answers (240 tokens, mean 60) plus 3 chunk-mode problems: 240 + 3 * 4 * 60
    assert full_rollout_tokens([[50, 70, 40, 80]], 3, 4) == 960.0
    # a full group of 2 (rollout.full_group_size) counts as the G = 4 answers full rollouts would decode
    assert full_rollout_tokens([[50, 70]], 3, 4) == 960.0
    assert full_rollout_tokens([[50, 70, 40, 80], [20, 40]], 0, 4) == 240.0 + 120.0
    assert full_rollout_tokens([], 3, 4) == 0.0
