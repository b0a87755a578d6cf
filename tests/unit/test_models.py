"""Tokenizer, tiny model, HF save/load and the critic, on a real (small) Qwen3 model."""

from __future__ import annotations

import json
import math
import string
import subprocess
import sys

import pytest
import torch

from ac2_core.config import TinyModelConfig
from ac2_core.models.critic import (
    MATCH_FEATURES,
    MATCH_GAIN,
    SURPRISE_FEATURES,
    SURPRISE_GAIN,
    Critic,
    build_critic_input,
    reference_match,
)
from ac2_core.models.hf import ModelFormatError, load_model, load_tokenizer, save_model
from ac2_core.models.tiny import build_tiny_model
from ac2_core.models.tokenizer import SPECIAL_TOKENS, build_tokenizer, special_ids

SMALL = TinyModelConfig(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=128)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["49+97=146;146+53=199;#199\n", "hello world"])


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_tiny_model(tokenizer, SMALL, seed=0)


def _ids(generator, *shape):
    return torch.randint(4, 260, shape, generator=generator)


def test_tokenizer_round_trips_one_token_per_character(tokenizer):
    text = string.printable + "49+97=146;146+53=199;#199\n  two  spaces . , trailing "
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text
    assert len(tokenizer) == 256 + len(SPECIAL_TOKENS)
    # No merges whatever the corpus: digits that occur together still stay apart.
    assert len(tokenizer.encode("146146146", add_special_tokens=False)) == 9


def test_special_ids_and_padding_side(tokenizer):
    ids = special_ids(tokenizer)
    assert ids == {"pad": tokenizer.pad_token_id, "eos": tokenizer.eos_token_id, "ref": 2, "state": 3}
    assert len(set(ids.values())) == 4
    assert tokenizer.padding_side == "left"
    assert tokenizer.decode([ids["eos"]]) == "<|endoftext|>"


def test_tiny_model_is_deterministic_per_seed(tokenizer):
    before = torch.get_rng_state()
    a = build_tiny_model(tokenizer, SMALL, seed=3)
    b = build_tiny_model(tokenizer, SMALL, seed=3)
    c = build_tiny_model(tokenizer, SMALL, seed=4)
    assert torch.equal(torch.get_rng_state(), before)  # global RNG untouched
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])
    assert a.config.vocab_size == len(tokenizer) and a.dtype == torch.float32
    assert not a.config.tie_word_embeddings


def test_left_padding_does_not_change_a_rows_logits(model):
    g = torch.Generator().manual_seed(0)
    short, long = _ids(g, 1, 12), _ids(g, 1, 20)
    ids = torch.zeros(2, 20, dtype=torch.long)
    mask = torch.zeros(2, 20, dtype=torch.long)
    ids[0, 8:], mask[0, 8:] = short[0], 1
    ids[1], mask[1] = long[0], 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask, position_ids=positions).logits
        alone = model(short).logits
    # Often bit-identical under eager attention, not always: float32 matmuls of other
    # shapes differ in the last bits (under 1e-6). Attending to the padding does not
    # pass, as the second check shows.
    assert torch.allclose(batched[0, 8:], alone[0], rtol=0, atol=1e-5)
    with torch.no_grad():
        leaked = model(ids).logits
    assert not torch.allclose(leaked[0, 8:], alone[0], rtol=0, atol=1e-5)


def test_save_load_round_trip_gives_identical_logits(model, tokenizer, tmp_path):
    save_model(model, tokenizer, tmp_path / "m")
    assert list((tmp_path / "m").glob("*.safetensors"))
    loaded, loaded_tok = load_model(tmp_path / "m")
    assert not loaded.training
    g = torch.Generator().manual_seed(1)
    ids = _ids(g, 3, 17)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    text = "12+7=19;#19"
    assert loaded_tok.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)
    assert special_ids(load_tokenizer(tmp_path / "m")) == special_ids(tokenizer)


def test_saved_tokenizer_loads_as_autotokenizer_would_without_torch(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    tokenizer.save_pretrained(tmp_path / "tok")
    fast, auto = load_tokenizer(tmp_path / "tok"), AutoTokenizer.from_pretrained(tmp_path / "tok", local_files_only=True)
    assert type(fast) is type(auto)
    assert (fast.padding_side, fast.clean_up_tokenization_spaces) == (auto.padding_side, auto.clean_up_tokenization_spaces)
    assert special_ids(fast) == special_ids(auto)
    ids = fast.encode("49+97=146;#146<|endoftext|>", add_special_tokens=False)
    assert ids == auto.encode("49+97=146;#146<|endoftext|>", add_special_tokens=False)
    assert fast.decode(ids, skip_special_tokens=True) == auto.decode(ids, skip_special_tokens=True) == "49+97=146;#146"
    # the point of the direct path: a fresh process loads it without importing torch
    code = f"import sys; from ac2_core.models.tokenizer import load_tokenizer; load_tokenizer({str(tmp_path / 'tok')!r});"
    code += " print(sorted(m for m in ('torch', 'pandas') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_pickle_only_directory_is_refused_naming_the_file(model, tokenizer, tmp_path):
    directory = tmp_path / "pickled"
    directory.mkdir()
    model.config.save_pretrained(directory)
    (directory / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ModelFormatError, match=r"pickled.*pytorch_model\.bin"):
        load_model(directory)
    with pytest.raises(ModelFormatError, match="pytorch_model.bin"):
        Critic.load(directory)


def test_critic_starts_at_one_half_and_leaves_actor_alone(model):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    critic = Critic.from_actor(model, seed=0)
    g = torch.Generator().manual_seed(2)
    ids = _ids(g, 4, 9)
    with torch.no_grad():
        values = critic.values(ids, torch.ones_like(ids))
    assert values.shape == (4,)
    assert torch.equal(values, torch.full((4,), 0.5))
    # A deep copy: changing the critic's backbone leaves the actor as it was.
    with torch.no_grad():
        critic.backbone.embed_tokens.weight.add_(1.0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def _trained_looking_critic(model):
    critic = Critic.from_actor(model, seed=0)
    with torch.no_grad():  # a non-zero head, so values depend on the input
        critic.value_head.weight.copy_(torch.linspace(-1, 1, critic.value_head.in_features)[None])
        critic.value_head.bias.fill_(0.1)
    return critic


def test_critic_save_load_gives_identical_values(model, tokenizer, tmp_path):
    critic = _trained_looking_critic(model)
    critic.save(tmp_path / "critic", tokenizer)
    names = {p.name for p in (tmp_path / "critic").iterdir()}
    assert {"config.json", "model.safetensors", "value_head.safetensors", "critic.json", "tokenizer.json"} <= names
    loaded, loaded_tok = Critic.load(tmp_path / "critic")
    assert not loaded.training and len(loaded_tok) == len(tokenizer)
    g = torch.Generator().manual_seed(3)
    ids = _ids(g, 3, 11)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        original, reloaded = critic.values(ids, mask), loaded.values(ids, mask)
    assert torch.equal(original, reloaded)
    assert original.std() > 0  # the check above compares input-dependent values


def test_critic_pools_the_last_attended_token_under_any_padding(model):
    critic = _trained_looking_critic(model)
    g = torch.Generator().manual_seed(4)
    row, other = _ids(g, 1, 10), _ids(g, 1, 16)
    with torch.no_grad():
        alone = critic(row, torch.ones_like(row))
        for side in ("left", "right"):
            ids = torch.zeros(2, 16, dtype=torch.long)
            mask = torch.zeros(2, 16, dtype=torch.long)
            span = slice(6, 16) if side == "left" else slice(0, 10)
            ids[0, span], mask[0, span] = row[0], 1
            ids[1], mask[1] = other[0], 1
            batched = critic(ids, mask)
            # float32 matmuls of other shapes may differ in the last bits; a wrong
            # pooled position or wrong positions would differ by far more than 1e-5.
            assert torch.allclose(batched[0], alone[0], rtol=0, atol=1e-5), side
    assert abs(alone.item() - critic(other, torch.ones_like(other)).item()) > 1e-3


def test_critic_input_layout_and_truncation():
    prompt, ref, state = [10, 11], [20, 21, 22], [30, 31, 32, 33, 34]
    full = build_critic_input(prompt, ref, state, ref_id=2, state_id=3, max_tokens=100)
    assert full == [10, 11, 2, 20, 21, 22, 3, 30, 31, 32, 33, 34]
    no_ref = build_critic_input(prompt, None, state, ref_id=2, state_id=3, max_tokens=100)
    assert no_ref == [10, 11, 3, 30, 31, 32, 33, 34]
    # 9 tokens: prompt (2) + ref sep + ref (3) + state sep = 7, so the 2 newest state tokens.
    cut = build_critic_input(prompt, ref, state, ref_id=2, state_id=3, max_tokens=9)
    assert cut == [10, 11, 2, 20, 21, 22, 3, 33, 34]
    exact = build_critic_input(prompt, ref, state, ref_id=2, state_id=3, max_tokens=7)
    assert exact == [10, 11, 2, 20, 21, 22, 3]
    # room for 7 state tokens, more than the state's 5 but less than twice as many: nothing is cut
    # (a negative slice start once kept only the state's last 2 tokens here)
    roomy = build_critic_input(prompt, ref, state, ref_id=2, state_id=3, max_tokens=14)
    assert roomy == full


def test_critic_input_too_long_raises_with_lengths():
    with pytest.raises(ValueError, match=r"max_tokens=6.*prompt \(2 tokens\).*reference \(3 tokens\).*take 7"):
        build_critic_input([10, 11], [20, 21, 22], [30], ref_id=2, state_id=3, max_tokens=6)


def _spread_head(critic: Critic, *, bias: float = 0.0) -> Critic:
    """``critic`` with a non-zero value head: weights spread over [-1/8, 1/8] on every input it reads."""
    with torch.no_grad():
        critic.value_head.weight.copy_(torch.linspace(-1, 1, critic.value_head.in_features)[None] / 8)
        critic.value_head.bias.fill_(bias)
    return critic


def _surprise_critic(model, tokenizer):
    # a non-zero head on the hidden state and on the surprise features
    return _spread_head(Critic.from_actor(model, seed=0, state_id=special_ids(tokenizer)["state"]), bias=0.1)


def _surprise_input(tokenizer, answer: str) -> list[int]:
    ids = special_ids(tokenizer)
    return build_critic_input(
        tokenizer.encode("1+2=", add_special_tokens=False),
        tokenizer.encode("1+2=3;#3", add_special_tokens=False),
        tokenizer.encode(answer, add_special_tokens=False),
        ref_id=ids["ref"],
        state_id=ids["state"],
        max_tokens=64,
    )


def test_surprise_features_are_the_running_next_token_loss_of_the_answer(model, tokenizer):
    critic = _surprise_critic(model, tokenizer)
    x = torch.tensor([_surprise_input(tokenizer, "1+2=4;#4")])
    start = x[0].tolist().index(special_ids(tokenizer)["state"])
    with torch.no_grad():
        features = critic._surprise(critic._hidden(x, torch.ones_like(x)), x, torch.ones_like(x))[0] / SURPRISE_GAIN
        # the reference: the actor itself (the critic copied it), as a causal LM over the same tokens
        logp = torch.log_softmax(model(input_ids=x).logits[0].float(), dim=-1)
    losses = [-logp[t - 1, x[0, t]].item() for t in range(start + 1, x.shape[1])]
    assert torch.equal(features[: start + 1], torch.zeros(start + 1, SURPRISE_FEATURES))  # nothing of the answer written yet
    for n in range(1, len(losses) + 1):  # position start + n ends the answer's first n tokens
        written = losses[:n]
        expected = [max(written), sum(written) / n, math.log1p(n)]
        assert features[start + n].tolist() == pytest.approx(expected, abs=1e-5)
    assert len(set(losses)) > 1  # the running max and mean differ along the answer


def test_surprise_critic_is_causal_and_survives_save_load(model, tokenizer, tmp_path):
    critic = _surprise_critic(model, tokenizer)
    x = _surprise_input(tokenizer, "1+2=3;#3")
    start = x.index(special_ids(tokenizer)["state"])
    ids = torch.tensor([x])
    with torch.no_grad():
        every = critic(ids, torch.ones_like(ids), every_position=True)[0]
        cut = torch.stack([critic(ids[:, : t + 1], torch.ones_like(ids[:, : t + 1]))[0] for t in range(start, len(x))])
    # position t of one pass is the critic of the input cut after t (the dense fit relies on it)
    assert torch.allclose(every[start:], cut, rtol=0, atol=1e-5)
    critic.save(tmp_path / "critic", tokenizer)
    assert (tmp_path / "critic" / "lm_head.safetensors").is_file()
    loaded, _ = Critic.load(tmp_path / "critic")
    assert loaded.surprise and loaded.state_id == critic.state_id
    with torch.no_grad():
        assert torch.equal(loaded(ids, torch.ones_like(ids), every_position=True)[0], every)
    assert every.std() > 0


def test_surprise_critic_trains_its_value_head_and_backbone_not_its_next_token_head(model, tokenizer):
    critic = _surprise_critic(model, tokenizer).train()
    ids = torch.tensor([_surprise_input(tokenizer, "1+2=4;#4")])
    critic(ids, torch.ones_like(ids)).sum().backward()
    assert critic.lm_head.weight.grad is None and not critic.lm_head.weight.requires_grad
    assert critic.value_head.weight.grad[0, -SURPRISE_FEATURES:].abs().sum() > 0  # the surprise weights learn
    assert critic.backbone.embed_tokens.weight.grad is not None


def test_surprise_critic_needs_the_state_separator(model, tokenizer):
    critic = _surprise_critic(model, tokenizer)
    ids = torch.tensor([tokenizer.encode("1+2=3", add_special_tokens=False)])
    with pytest.raises(ValueError, match="state separator"):
        critic(ids, torch.ones_like(ids))


def test_surprise_critic_directory_without_its_next_token_head_is_refused(model, tokenizer, tmp_path):
    _surprise_critic(model, tokenizer).save(tmp_path / "critic", tokenizer)
    (tmp_path / "critic" / "lm_head.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="lm_head.safetensors"):
        Critic.load(tmp_path / "critic")


def _runs(features: torch.Tensor) -> tuple[list[int], list[int]]:
    """(tokens that left the reference so far, the current run along it) of ``reference_match`` rows."""
    left, run = torch.expm1(features[..., :2]).round().long().unbind(-1)
    return left.tolist(), run.tolist()


def test_reference_match_counts_the_answers_run_along_the_reference_and_the_tokens_that_left_it():
    ref, state = 2, 3
    reference = [10, 11, 12, 13, 14, 15, 16, 17, 18]
    answer = [10, 11, 12, 13, 99, 15, 16, 17, 18, 19]  # leaves at 99; back on the reference 4 tokens later; 19 is not in it
    x = torch.tensor([build_critic_input([5, 6], reference, answer, ref_id=ref, state_id=state, max_tokens=64)])
    features = reference_match(x, torch.ones_like(x), ref_id=ref, state_id=state)[0]
    head = len(x[0]) - len(answer)
    left, run = _runs(features[head:])
    assert run == [1, 2, 3, 4, 0, 1, 2, 3, 4, 0]
    # a token whose run is shorter than MATCH_NGRAM (or the answer so far) left the reference: the slip and the three
    # tokens after it, until a run of 4 holds again, then 19
    assert left == [0, 0, 0, 0, 1, 2, 3, 4, 4, 5]
    assert features[head:, 2].tolist() == [1.0] * len(answer)  # a reference is shown
    assert torch.equal(features[:head], torch.zeros(head, MATCH_FEATURES))  # nothing of the answer written yet
    # the left flag adds one column: 1 from the first token that left on, even once the answer is back on the reference
    flagged = reference_match(x, torch.ones_like(x), ref_id=ref, state_id=state, left_flag=True)[0]
    assert torch.equal(flagged[:, :MATCH_FEATURES], features)
    assert flagged[head:, MATCH_FEATURES].tolist() == [0.0] * 4 + [1.0] * 6
    assert flagged[:head].abs().sum() == 0


def test_reference_match_is_zero_without_a_reference_and_ignores_padding():
    ref, state = 2, 3
    with_ref = build_critic_input([5], [10, 11, 12], [10, 11, 12], ref_id=ref, state_id=state, max_tokens=32)
    without = build_critic_input([5], None, [10, 11, 12], ref_id=ref, state_id=state, max_tokens=32)
    ids = torch.zeros(2, len(with_ref), dtype=torch.long)
    mask = torch.zeros_like(ids)
    ids[0], mask[0] = torch.tensor(with_ref), 1
    ids[1, : len(without)], mask[1, : len(without)] = torch.tensor(without), 1
    features = reference_match(ids, mask, ref_id=ref, state_id=state)
    assert features[1].abs().sum() == 0
    left, run = _runs(features[0, -3:])
    assert (left, run) == ([0, 0, 0], [1, 2, 3])  # a whole answer shorter than MATCH_NGRAM on the reference never left it


def _match_critic(model, tokenizer, *, surprise: bool):
    ids = special_ids(tokenizer)
    return _spread_head(Critic.from_actor(model, seed=0, state_id=ids["state"], ref_id=ids["ref"], surprise=surprise))


@pytest.mark.parametrize("surprise", [False, True])
def test_match_critic_reads_its_features_survives_save_load_and_learns_their_weights(model, tokenizer, tmp_path, surprise):
    critic = _match_critic(model, tokenizer, surprise=surprise)
    hidden = model.config.hidden_size
    assert critic.value_head.in_features == hidden + MATCH_FEATURES + (SURPRISE_FEATURES if surprise else 0)
    assert critic.match and critic.surprise == surprise
    on, off = (torch.tensor([_surprise_input(tokenizer, answer)]) for answer in ("1+2=3;#3", "1+2=4;#4"))
    with torch.no_grad():
        values = [critic(x, torch.ones_like(x), every_position=True)[0] for x in (on, off)]
        features = reference_match(off, torch.ones_like(off), ref_id=critic.ref_id, state_id=critic.state_id)[0]
        hidden_states = critic._hidden(off, torch.ones_like(off))[0]
    # the head's logit is its weights over [hidden, match features x gain, surprise]: with the match part alone
    # taken out, what is left is the same on both answers' shared prefix, and differs where the answers part
    match_part = (features * MATCH_GAIN) @ critic.value_head.weight[0, hidden : hidden + MATCH_FEATURES]
    hidden_part = hidden_states @ critic.value_head.weight[0, :hidden] + critic.value_head.bias
    if not surprise:
        assert torch.allclose(values[1], hidden_part + match_part, atol=1e-4)
    assert not torch.allclose(values[0][-3:], values[1][-3:])
    critic.save(tmp_path / "critic", tokenizer)
    loaded, _ = Critic.load(tmp_path / "critic")
    assert (loaded.match, loaded.surprise, loaded.ref_id, loaded.state_id) == (True, surprise, critic.ref_id, critic.state_id)
    with torch.no_grad():
        assert torch.equal(loaded(off, torch.ones_like(off), every_position=True)[0], values[1])
    critic.train()
    critic(off, torch.ones_like(off)).sum().backward()
    assert critic.value_head.weight.grad[0, hidden : hidden + MATCH_FEATURES].abs().sum() > 0


def test_a_match_critic_with_the_left_flag_keeps_it_through_save_and_load(model, tokenizer, tmp_path):
    ids = special_ids(tokenizer)
    unfitted = Critic.from_actor(model, seed=0, state_id=ids["state"])  # as the bootstrap makes it
    critic = _spread_head(unfitted.with_reference_match(ids["ref"], ids["state"], left_flag=True))
    x = torch.tensor([_surprise_input(tokenizer, "1+2=4;#4")])
    critic.save(tmp_path / "critic", tokenizer)
    loaded, _ = Critic.load(tmp_path / "critic")
    assert (loaded.match, loaded.left_flag, loaded.surprise) == (True, True, True)
    with torch.no_grad():
        assert torch.equal(loaded(x, torch.ones_like(x), every_position=True), critic(x, torch.ones_like(x), every_position=True))
    # a critic.json whose flag disagrees with its head's width is refused, naming the flag
    meta = json.loads((tmp_path / "critic" / "critic.json").read_text())
    del meta["reference_match"]["left_flag"]
    (tmp_path / "critic" / "critic.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"left_flag False\) does not fit"):
        Critic.load(tmp_path / "critic")


def test_match_critic_needs_the_state_separator_to_find_its_answer(model, tokenizer):
    with pytest.raises(ValueError, match="needs state_id"):
        Critic.from_actor(model, seed=0, ref_id=special_ids(tokenizer)["ref"])


def test_an_unfitted_critic_gains_or_loses_the_reference_match_and_a_fitted_one_refuses(model, tokenizer):
    ids = special_ids(tokenizer)
    critic = Critic.from_actor(model, seed=0, state_id=ids["state"])  # surprise, no match: as the bootstrap makes it
    matching = critic.with_reference_match(ids["ref"], ids["state"])
    assert (matching.match, matching.surprise) == (True, True)
    assert matching.value_head.in_features == critic.value_head.in_features + MATCH_FEATURES
    x = torch.tensor([_surprise_input(tokenizer, "1+2=4;#4")])
    with torch.no_grad():
        assert torch.equal(matching.values(x, torch.ones_like(x)), torch.tensor([0.5]))  # a zero head: V as it was
    back = matching.with_reference_match(None, ids["state"])
    assert not back.match and back.value_head.in_features == critic.value_head.in_features
    flagged = critic.with_reference_match(ids["ref"], ids["state"], left_flag=True)
    assert flagged.left_flag and flagged.value_head.in_features == matching.value_head.in_features + 1
    with pytest.raises(ValueError, match="left_flag is one of the reference-match features"):
        Critic(critic.backbone, critic.value_head, lm_head=critic.lm_head, state_id=ids["state"], left_flag=True)
    with pytest.raises(ValueError, match="a fitted value head keeps its inputs"):
        _surprise_critic(model, tokenizer).with_reference_match(ids["ref"], ids["state"])
