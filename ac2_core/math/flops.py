"""Compute accounting (docs/design.md section 2, step 7).

A token at context position `t` (the number of tokens before it) costs
`2*N + 4*n_layers*d_attn*t` FLOPs in a forward pass: `2*N` for the matmuls over the
`N` non-embedding parameters, and `4*n_layers*d_attn*t` for attention scores and
values over the `t` earlier tokens, with `d_attn = n_heads * head_dim`.

Decode, prefill, critic forward passes and training are counted separately, because
the headline metric is decode FLOPs alone. Everything is exact python ints.
"""

from __future__ import annotations

import operator
from typing import Any

import torch


def decode_flops(*, n_params: int, n_layers: int, d_attn: int, start: int, n_tokens: int) -> int:
    """FLOPs to decode the tokens at positions `start .. start + n_tokens - 1`.

    Args:
        n_params: N, the non-embedding parameter count.
        n_layers: number of transformer layers.
        d_attn: n_heads * head_dim.
        start: position of the first decoded token (prompt + prefix length).
        n_tokens: number of tokens decoded.
    """
    return _span_flops(n_params, n_layers, d_attn, start, n_tokens)


def prefill_flops(*, n_params: int, n_layers: int, d_attn: int, n_tokens: int, start: int = 0) -> int:
    """FLOPs of one forward pass over the tokens at positions `start .. start + n_tokens - 1`.

    Args:
        n_params: N, the non-embedding parameter count.
        n_layers: number of transformer layers.
        d_attn: n_heads * head_dim.
        n_tokens: number of tokens in the pass.
        start: tokens already in the KV cache before the pass (0 for a fresh context).
    """
    return _span_flops(n_params, n_layers, d_attn, start, n_tokens)


def critic_flops(*, n_params: int, n_layers: int, d_attn: int, n_tokens: int, start: int = 0) -> int:
    """FLOPs of one critic forward pass over `n_tokens` tokens (a prefill of the critic).

    Counted apart from the actor's prefill so that the critic's cost shows on its own.
    Arguments are those of `prefill_flops`, with the critic's own `n_params`.
    """
    return _span_flops(n_params, n_layers, d_attn, start, n_tokens)


def train_flops(*, n_params: int, n_tokens: int) -> int:
    """FLOPs to train on `n_tokens` tokens: `6*N` per token (forward plus backward)."""
    n_params, n_tokens = _check_non_negative(n_params=n_params, n_tokens=n_tokens)
    return 6 * n_params * n_tokens


def count_non_embedding_params(model: torch.nn.Module) -> int:
    """N: parameters of `model` outside the token embedding and the `lm_head`.

    Names follow HF Qwen3 (`model.embed_tokens.weight`, `lm_head.weight`); tied
    weights are counted once by `named_parameters`.
    """
    return sum(
        p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name and "lm_head" not in name.split(".")
    )


def attention_width(config: Any) -> tuple[int, int]:
    """`(n_layers, d_attn)` from an HF config, with `d_attn = n_heads * head_dim`.

    `head_dim` falls back to `hidden_size // num_attention_heads` when the config has
    none (Qwen3 sets it explicitly, and it may differ from that quotient).
    """
    n_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    return int(config.num_hidden_layers), int(n_heads * head_dim)


def _span_flops(n_params: int, n_layers: int, d_attn: int, start: int, n_tokens: int) -> int:
    """Sum of `2*N + 4*n_layers*d_attn*t` over `t = start .. start + n_tokens - 1`."""
    n_params, n_layers, d_attn, start, n = _check_non_negative(
        n_params=n_params, n_layers=n_layers, d_attn=d_attn, start=start, n_tokens=n_tokens
    )
    # sum_t t = n*start + n*(n-1)/2; n*(n-1) is even, so // is exact.
    positions = n * start + n * (n - 1) // 2
    return 2 * n_params * n + 4 * n_layers * d_attn * positions


def _check_non_negative(**values: int) -> tuple[int, ...]:
    """Return the values as python ints; reject floats (counts must stay exact) and negatives."""
    out = []
    for name, value in values.items():
        try:
            value = operator.index(value)
        except TypeError:
            raise ValueError(f"{name} must be an integer; got {value!r}") from None
        if value < 0:
            raise ValueError(f"{name} must be >= 0; got {value}")
        out.append(value)
    return tuple(out)
