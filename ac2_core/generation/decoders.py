"""The forward passes of the ``hf`` sampling loop: a prefill of the contexts, then one token a step.

Two decoders give the rows still decoding the same logits (bit for bit until a row of the
batch stops; after that, on CPUs whose batched matmul rounds by the batch's size, to the
last bit), so which one runs does not change the samples:

- ``DynamicCacheDecoder`` calls the model's own forward with a ``DynamicCache``, for any
  causal LM. transformers grows that cache and the attention mask by concatenation on
  every step, rebuilds the 4D mask, and, for grouped-query attention, copies every
  layer's whole cache to repeat its key/value heads. On the tiny model those copies were
  60% of a decode step.
- ``StaticKVDecoder``, for Qwen3-architecture models under eager attention, decodes
  over buffers allocated once per batch (keys, values, and the additive mask that eager
  attention adds) and runs the layers' own modules. A step writes one column of each.
  On CPU the keys and values are held repeated to the query heads, so no step copies the
  cache. The attention is eager attention's, op for op and on the same shapes (a step
  reads the buffers' first ``T`` columns as views), so the logits are the same bits. A
  row that has stopped leaves the attention, so the batched matmuls there run on fewer
  rows; the linear layers still see the whole batch. Some BLAS builds (AMD EPYC with AVX2)
  round a batch entry's sums by how many entries the call has, so from then on a row's
  logits can differ from the forward's in the last bit.

Both prefill through the model's forward, so the first token of a row is sampled from
the same logits either way.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache
from transformers.models.qwen3.modeling_qwen3 import Qwen3ForCausalLM, apply_rotary_pos_emb, repeat_kv


def _prefill(model, input_ids, mask, positions, cache):
    return model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1, :]


class DynamicCacheDecoder:
    """The model's own forward over a ``DynamicCache``: any causal LM.

    input_ids, mask, positions: (B, W) left-padded contexts, their 0/1 mask and position ids.
    """

    def __init__(self, model, input_ids, mask, positions, *, steps: int):
        self.model, self.input_ids, self.mask, self.positions = model, input_ids, mask, positions
        self.cache = DynamicCache()

    def prefill(self) -> torch.Tensor:
        """The logits after each context: (B, V)."""
        return _prefill(self.model, self.input_ids, self.mask, self.positions, self.cache)

    def step(self, ids: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
        """Feed one token a row (ids: (B,) long; rows with alive (B,) False are masked): (B, V) logits."""
        self.mask = torch.cat([self.mask, alive.long()[:, None]], dim=1)
        self.positions = self.positions[:, -1:] + 1
        return self.model(
            input_ids=ids[:, None],
            attention_mask=self.mask,
            position_ids=self.positions,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1, :]


def static_kv_supported(model) -> bool:
    """Whether ``StaticKVDecoder`` computes exactly what ``model``'s forward computes."""
    if not isinstance(model, Qwen3ForCausalLM):
        return False
    config = model.config
    return (
        config._attn_implementation == "eager"
        and all(kind == "full_attention" for kind in config.layer_types)
        and (not model.training or config.attention_dropout == 0.0)  # the one op that differs in training mode
    )


class StaticKVDecoder:
    """Qwen3 decode steps over a KV cache allocated once for the batch's ``steps`` tokens.

    input_ids, mask, positions: (B, W) left-padded contexts, their 0/1 mask and position ids.
    The cache holds W + steps - 1 columns: the last sampled token is never fed.

    With more than one key/value head but fewer than the query heads, eager attention
    copies every layer's cache to the query heads on every step (``repeat_kv``).
    ``repeat_heads`` holds the cache in that shape instead, so no step copies it, at
    heads / kv_heads times the memory: the default on CPU, where the copies were most of a
    step and memory is rarely short; elsewhere the cache keeps the key/value heads and
    each step repeats them as transformers does.
    """

    def __init__(self, model, input_ids, mask, positions, *, steps: int, repeat_heads: bool | None = None):
        if not static_kv_supported(model):
            raise ValueError(
                "StaticKVDecoder decodes a Qwen3ForCausalLM under eager attention with full attention in every"
                f" layer; found {type(model).__name__} (use DynamicCacheDecoder)"
            )
        self.model, self.input_ids, self.mask, self.positions = model, input_ids, mask, positions
        config = model.config
        self.groups = config.num_attention_heads // config.num_key_value_heads
        if repeat_heads is None:
            repeat_heads = input_ids.device.type == "cpu"
        # repeat_kv is a view for one key/value head or one query head per key head, else a copy
        self.repeated = repeat_heads and self.groups > 1 and config.num_key_value_heads > 1
        self.capacity = input_ids.shape[1] + max(steps - 1, 0)
        self.keys: list[torch.Tensor] = []  # per layer, (B, heads, capacity, D): slot s holds row rows[s]
        self.values: list[torch.Tensor] = []
        self.length = 0  # columns filled
        self.live = input_ids.shape[0]  # slots [0, live) hold the rows still decoding
        self.rows = torch.arange(self.live, device=input_ids.device)

    def prefill(self) -> torch.Tensor:
        """The logits after each context, through the model's forward: (B, V). Fills the buffers."""
        cache = DynamicCache()
        logits = _prefill(self.model, self.input_ids, self.mask, self.positions, cache)
        B, W = self.input_ids.shape
        for layer in cache.layers:
            for buffers, x in ((self.keys, layer.keys), (self.values, layer.values)):
                x = self._stored(x)
                buffers.append(x.new_empty((B, x.shape[1], self.capacity, x.shape[3])))
                buffers[-1][:, :, :W] = x
        dtype = self.keys[0].dtype
        # eager_mask's values: 0 where a key is attended, the dtype's minimum where it is not
        self.attended = torch.tensor(0.0, dtype=dtype, device=self.input_ids.device)
        self.masked = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=self.input_ids.device)
        self.bias = self.attended.new_empty((B, 1, 1, self.capacity))
        self.bias[:, 0, 0, :W] = torch.where(self.mask.bool(), self.attended, self.masked)
        self.length = W
        return logits

    def step(self, ids: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
        """Feed one token a row (ids: (B,) long; alive: (B,) bool): (B, V) logits.

        The logits of the alive rows are the model's forward's (to the last bit once a row
        has stopped; see the module docstring). A row once not alive never is again: it
        leaves the attention, and its logits, finite, mean nothing.
        """
        t = self.length
        if t >= self.capacity:
            raise ValueError(f"StaticKVDecoder: all {self.capacity} cache columns are used; steps= was too small")
        self._drop_finished(alive)
        self.length += 1
        self.bias[: self.live, 0, 0, t] = self.attended
        self.positions = self.positions[:, -1:] + 1
        lm = self.model.model
        hidden = lm.embed_tokens(ids[:, None])
        cos, sin = lm.rotary_emb(hidden, self.positions)
        for i, layer in enumerate(lm.layers):  # Qwen3DecoderLayer.forward
            residual = hidden
            hidden = residual + self._attention(layer.self_attn, layer.input_layernorm(hidden), cos, sin, i)
            residual = hidden
            hidden = residual + layer.mlp(layer.post_attention_layernorm(hidden))
        hidden = lm.norm(hidden)
        return self.model.lm_head(hidden[:, -1:, :])[:, -1, :]

    def _drop_finished(self, alive: torch.Tensor) -> None:
        """Keep the rows still alive in slots [0, live): each row that finished gives its slot to
        the last alive row past the new end, so only as many rows are copied as finished."""
        keep = alive[self.rows[: self.live]]
        live = int(keep.sum())
        if live == self.live:
            return
        holes = (~keep[:live]).nonzero().squeeze(1)
        movers = keep[live:].nonzero().squeeze(1) + live
        t = self.length
        for buffer in (*self.keys, *self.values):
            buffer[holes, :, :t] = buffer[movers, :, :t]
        self.bias[holes, :, :, :t] = self.bias[movers, :, :, :t]
        self.rows[holes] = self.rows[movers]
        self.live = live

    def _attention(self, attn, hidden, cos, sin, i: int) -> torch.Tensor:
        # Qwen3Attention.forward and eager_attention_forward, with the cache written in place, over
        # the alive rows only: each row's matmuls and softmax are its own, whatever the batch holds
        T, n, B = self.length, self.live, hidden.shape[0]
        shape = (*hidden.shape[:-1], -1, attn.head_dim)
        query = attn.q_norm(attn.q_proj(hidden).view(shape)).transpose(1, 2)
        key = attn.k_norm(attn.k_proj(hidden).view(shape)).transpose(1, 2)
        value = attn.v_proj(hidden).view(shape).transpose(1, 2)
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        if n < B:
            rows = self.rows[:n]
            query, key, value = query[rows], key[rows], value[rows]
        self.keys[i][:n, :, T - 1 : T] = self._stored(key)
        self.values[i][:n, :, T - 1 : T] = self._stored(value)
        keys, values = self._used(self.keys[i][:n, :, :T]), self._used(self.values[i][:n, :, :T])
        weights = torch.matmul(query, keys.transpose(2, 3)) * attn.scaling
        weights = weights + self.bias[:n, :, :, :T]
        weights = nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
        out = torch.matmul(weights, values).transpose(1, 2).contiguous()
        if n < B:  # a finished row attends to nothing: zeros keep its logits finite for the sampler
            out = out.new_zeros((B, *out.shape[1:])).index_copy_(0, rows, out)
        return attn.o_proj(out.reshape(*hidden.shape[:-1], -1).contiguous())

    def _stored(self, x: torch.Tensor) -> torch.Tensor:
        """What the buffers hold of keys or values x: (B, kv_heads, T, D)."""
        return repeat_kv(x, self.groups) if self.repeated else x

    def _used(self, x: torch.Tensor) -> torch.Tensor:
        """What eager attention multiplies by, from a buffer's first T columns: the same values in the same
        layout as repeat_kv gives (a stride-0 view where it makes one), so the matmuls make the same calls."""
        return x if self.repeated else repeat_kv(x, self.groups)


def decoder_for(model):
    """The fastest decoder that computes exactly what ``model``'s forward computes."""
    return StaticKVDecoder if static_kv_supported(model) else DynamicCacheDecoder
