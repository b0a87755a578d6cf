"""The tiny Qwen3-architecture model that tests and the CPU default build on the spot."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM

from ac2_core.config import TinyModelConfig
from ac2_core.models.hf import ATTN_IMPLEMENTATION


def build_tiny_model(tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig, *, seed: int) -> Qwen3ForCausalLM:
    """A freshly initialised float32 model; the same seed gives the same weights.

    The global torch RNG is left as it was.
    """
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,  # no BOS is prepended; Qwen3 uses eos here too
        tie_word_embeddings=False,
        use_cache=True,
        dtype="float32",
        attn_implementation=ATTN_IMPLEMENTATION,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.to(torch.float32)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()
