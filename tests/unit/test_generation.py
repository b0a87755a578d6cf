"""The hf generation backend on a tiny random model."""

from __future__ import annotations

import functools
import math
import random

import pytest
import torch

from ac2_core.config import TinyModelConfig
from ac2_core.generation import generate
from ac2_core.generation.decoders import DynamicCacheDecoder, StaticKVDecoder, decoder_for
from ac2_core.generation.hf import _decode_batch, token_entropies, token_logprobs
from ac2_core.models.tiny import build_tiny_model
from ac2_core.models.tokenizer import build_tokenizer


@pytest.fixture(scope="module")
def lm():
    tok = build_tokenizer(["12+34=46;#46", "7+8=15;#15"])
    cfg = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=128)
    return build_tiny_model(tok, cfg, seed=3), tok


def _ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def _run(lm, contexts, budgets, **kw):
    model, tok = lm
    return generate(model, contexts, budgets, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, **kw)


def test_greedy_matches_transformers_generate(lm):
    # Our loop (left padding, KV cache, explicit positions) must pick the tokens HF's own
    # generate picks for each context decoded alone.
    model, tok = lm
    contexts = [_ids(tok, "12+34="), _ids(tok, "7+8=15;"), _ids(tok, "1")]
    out = _run(lm, contexts, [12, 12, 12], n=1, seed=0, greedy=True)
    for ctx, (sample,) in zip(contexts, out):
        ref = model.generate(
            torch.tensor([ctx]),
            attention_mask=torch.ones(1, len(ctx), dtype=torch.long),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )[0, len(ctx) :].tolist()
        assert sample.token_ids == ref[: len(sample.token_ids)]


def test_seeded_sampling_is_reproducible_and_seed_dependent(lm):
    tok = lm[1]
    contexts = [_ids(tok, "12+"), _ids(tok, "7+8")]
    a = _run(lm, contexts, [10, 10], n=4, seed=11)
    b = _run(lm, contexts, [10, 10], n=4, seed=11)
    c = _run(lm, contexts, [10, 10], n=4, seed=12)
    tokens = lambda out: [[s.token_ids for s in g] for g in out]  # noqa: E731
    assert tokens(a) == tokens(b)
    assert [[s.logprobs for s in g] for g in a] == [[s.logprobs for s in g] for g in b]
    assert tokens(a) != tokens(c)


def test_budgets_finish_reasons_and_logprobs(lm):
    model, tok = lm
    contexts = [_ids(tok, "12+34="), _ids(tok, "7")]
    out = _run(lm, contexts, [3, 9], n=5, seed=1, temperature=1.3, batch_size=4)
    assert [len(g) for g in out] == [5, 5]
    for group, budget in zip(out, [3, 9]):
        for s in group:
            assert 1 <= len(s.token_ids) <= budget and len(s.logprobs) == len(s.token_ids)
            assert all(lp <= 0 for lp in s.logprobs)
            if s.finish_reason == "stop":
                assert s.token_ids[-1] == tok.eos_token_id and tok.eos_token_id not in s.token_ids[:-1]
            else:
                assert s.finish_reason == "length" and len(s.token_ids) == budget
    # The behaviour log-prob of the first token is log softmax(logits / T) at the context's end.
    ctx = contexts[1]
    with torch.no_grad():
        logits = model(torch.tensor([ctx])).logits[0, -1]
    expected = torch.log_softmax(logits / 1.3, -1)
    for s in out[1]:
        assert s.logprobs[0] == pytest.approx(float(expected[s.token_ids[0]]), abs=1e-5)


class _EosOnDecodeSteps(torch.nn.Module):
    """The tiny model, except that every decode step after the prefill strongly prefers eos."""

    def __init__(self, model, eos_id):
        super().__init__()
        self.model, self.eos_id = model, eos_id

    def forward(self, **kw):
        out = self.model(**kw)
        if kw["input_ids"].shape[1] == 1:
            out.logits[..., self.eos_id] += 100.0
        return out


def test_eos_ends_a_row_and_is_kept(lm):
    model, tok = lm
    wrapped = _EosOnDecodeSteps(model, tok.eos_token_id)
    (group,) = generate(wrapped, [_ids(tok, "12+")], [6], n=4, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seed=0)
    for s in group:
        # token 1 comes from the prefill; token 2 is eos: the row stops there, eos included
        assert len(s.token_ids) == 2 and s.token_ids[1] == tok.eos_token_id
        assert s.finish_reason == "stop"
        assert s.logprobs[1] > -1e-3  # eos was near-certain


# The static-cache decoder must sample exactly what the model's own forward samples: it is
# checked against DynamicCacheDecoder (transformers' forward and cache) for the three layouts
# of grouped-query attention: one key/value head (repeat_kv is a stride-0 view), fewer key/value
# heads than query heads (a copy, which repeat_heads keeps in the cache instead), and as many
# (no repeat).
LAYOUTS = [(2, 1, True), (4, 2, True), (4, 2, False), (2, 2, True)]


def _lm(heads, kv_heads):
    tok = build_tokenizer(["12+34=46;#46", "7+8=15;#15"])
    cfg = TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=heads, num_kv_heads=kv_heads, head_dim=32, intermediate_size=128
    )
    return build_tiny_model(tok, cfg, seed=5), tok


def _contexts(n, seed):
    rng = random.Random(seed)
    return [[rng.randrange(4, 260) for _ in range(rng.randint(1, 25))] for _ in range(n)]


def _left_padded(contexts, pad_id):
    width = max(map(len, contexts))
    ids = torch.full((len(contexts), width), pad_id)
    mask = torch.zeros_like(ids)
    for i, c in enumerate(contexts):
        ids[i, width - len(c) :], mask[i, width - len(c) :] = torch.tensor(c), 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def test_qwen3_under_eager_attention_decodes_over_the_static_cache(lm):
    model, tok = lm
    assert decoder_for(model) is StaticKVDecoder
    assert decoder_for(_EosOnDecodeSteps(model, tok.eos_token_id)) is DynamicCacheDecoder
    with pytest.raises(ValueError, match="StaticKVDecoder decodes a Qwen3ForCausalLM.*found _EosOnDecodeSteps"):
        StaticKVDecoder(_EosOnDecodeSteps(model, tok.eos_token_id), *_left_padded([[5]], 0), steps=2)


@pytest.mark.parametrize("heads,kv_heads,repeat_heads", LAYOUTS)
def test_static_cache_samples_equal_the_reference_decode(heads, kv_heads, repeat_heads):
    model, tok = _lm(heads, kv_heads)
    contexts = _contexts(24, seed=heads * 10 + kv_heads)
    kw = dict(eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=2.5, greedy=False)
    out = []
    for decoder in (DynamicCacheDecoder, functools.partial(StaticKVDecoder, repeat_heads=repeat_heads)):
        generator = torch.Generator().manual_seed(7)
        out.append(_decode_batch(model, contexts, 40, generator=generator, decoder=decoder, **kw))
    reference, static = out
    reasons = [s.finish_reason for s in reference]
    assert "stop" in reasons and "length" in reasons  # rows that stop early, and rows decoded to the budget
    assert [s.token_ids for s in static] == [s.token_ids for s in reference]
    # until a row stops, the two run the same ops on the same shapes: the same bits
    whole = min(len(s.logprobs) for s in reference if s.finish_reason == "stop")
    assert [s.logprobs[:whole] for s in static] == [s.logprobs[:whole] for s in reference]
    # then a stopped row leaves the static decoder's attention, and its batched matmuls run on fewer
    # rows; some BLAS builds (AMD EPYC, AVX2) then round a row's sums differently in the last bit
    for got, want in zip(static, reference):
        torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), rtol=0, atol=1e-5)
    assert [s.finish_reason for s in static] == reasons


@pytest.mark.parametrize("heads,kv_heads,repeat_heads", LAYOUTS)
def test_static_cache_logits_of_alive_rows_equal_the_models_forward(heads, kv_heads, repeat_heads):
    model, tok = _lm(heads, kv_heads)
    batch = _left_padded(_contexts(7, seed=1), tok.pad_token_id)
    reference = DynamicCacheDecoder(model, *batch, steps=6)
    static = StaticKVDecoder(model, *batch, steps=6, repeat_heads=repeat_heads)
    alive = torch.ones(7, dtype=torch.bool)
    with torch.no_grad():
        a, b = reference.prefill(), static.prefill()
        assert torch.equal(a, b)
        # rows finish out of order, two at once, and the first and last slots go: the static
        # cache moves alive rows into the freed slots, and must keep every alive row's logits
        for t, finished in enumerate([[2], [0, 6], [], [4], [5]]):
            alive[finished] = False  # a row that stopped is fed pad and masked from then on
            ids = torch.where(alive, a.argmax(-1), torch.full_like(alive, tok.pad_token_id, dtype=torch.long))
            a, b = reference.step(ids, alive), static.step(ids, alive)
            # to the last bit: with rows gone, some BLAS builds round the attention's batched matmuls
            # differently (see test_static_cache_samples_equal_the_reference_decode); a row read from the
            # wrong slot would be off by far more
            torch.testing.assert_close(b[alive], a[alive], rtol=0, atol=1e-5, msg=lambda m, t=t: f"step {t}: {m}")
            assert torch.isfinite(b).all()  # a finished row's logits mean nothing, but the sampler reads them
        assert static.live == 2 and sorted(static.rows[:2].tolist()) == [1, 3]
        with pytest.raises(ValueError, match="all .* cache columns are used"):
            static.step(ids, alive)


def test_token_entropies_are_the_expected_surprise_of_every_token_the_model_could_write(lm):
    # At each response position the entropy is E_t[-log p(t)] over the whole vocabulary, which the
    # log-probs of every one-token continuation give; it does not depend on the token written there.
    model, tok = lm
    context, written = _ids(tok, "12+34="), _ids(tok, "46;#46")
    vocab = range(len(tok))
    with torch.no_grad():
        ent, mask = token_entropies(
            model, [context, context[:3]], [written, written[:2]], pad_id=tok.pad_token_id, temperature=0.7
        )
        assert mask.tolist() == [[1.0] * len(written), [1.0] * 2 + [0.0] * (len(written) - 2)]
        assert ent[1, 2:].abs().sum().item() == 0.0  # nothing past a row's response
        for at in (0, 3):
            ctx = context + written[:at]
            lp, _ = token_logprobs(model, [ctx] * len(vocab), [[t] for t in vocab], pad_id=tok.pad_token_id, temperature=0.7)
            expected = -(lp[:, 0].exp() * lp[:, 0]).sum().item()
            assert ent[0, at].item() == pytest.approx(expected, rel=1e-5)
            other, _ = token_entropies(model, [ctx], [[(written[at] + 1) % len(tok)]], pad_id=tok.pad_token_id, temperature=0.7)
            assert other[0, 0].item() == pytest.approx(ent[0, at].item(), rel=1e-6)
    assert 0 < ent[0].min().item() and ent[0].max().item() < math.log(len(tok))
