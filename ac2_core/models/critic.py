"""The critic ``V(x, s; ref)``: the actor's backbone plus a scalar head on the last token.

Its input is problem + reference solution (if any) + partial answer, built by
``build_critic_input`` (docs/design.md section 2, step 6).

On disk a critic is an HF-style directory::

    config.json, model.safetensors   the backbone (``save_pretrained``)
    value_head.safetensors           the scalar head
    critic.json                      small metadata
    tokenizer.json, ...              the tokenizer
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, PreTrainedModel, PreTrainedTokenizerBase

from ac2_core.models.hf import ATTN_IMPLEMENTATION, check_safetensors_dir, from_local, load_tokenizer

HEAD_FILE = "value_head.safetensors"
META_FILE = "critic.json"
FORMAT = "ac2-critic"
FORMAT_VERSION = 1


class Critic(nn.Module):
    """``forward`` gives logits ``(B,)``; ``values`` gives ``V = sigmoid(logits)`` in (0, 1)."""

    def __init__(self, backbone: PreTrainedModel, value_head: nn.Linear):
        super().__init__()
        self.backbone = backbone
        # Kept in float32 whatever the backbone's dtype: one matmul, and V near 0 or 1
        # needs the precision.
        self.value_head = value_head.to(device=backbone.device, dtype=torch.float32)

    @classmethod
    def from_actor(cls, actor: PreTrainedModel, *, seed: int) -> Critic:
        """A critic whose backbone is a copy of ``actor``'s; the actor is left untouched."""
        backbone = copy.deepcopy(actor.base_model)
        with torch.random.fork_rng(devices=[]):  # leave the global RNG as it was
            torch.manual_seed(seed)
            head = nn.Linear(backbone.config.hidden_size, 1)
        # Zero head: V = 0.5 on every input at first, an honest "don't know". A random
        # head would give input-dependent values that readiness would take for real
        # predictions. The weight still gets gradient (BCE grad times hidden state).
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
        return cls(backbone, head).eval()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, every_position: bool = False) -> torch.Tensor:
        """input_ids, attention_mask: (B, T); left or right padded. Returns logits: (B,) float32,
        the last attended token's.

        ``every_position=True`` (right-padded inputs only) returns (B, T): the backbone is
        causal, so position ``t`` holds the logit of the input cut after token ``t``, and one
        pass scores every state along an answer.
        """
        hidden = self._hidden(input_ids, attention_mask)  # (B, T, H)
        if every_position:
            if bool(attention_mask[:, 0].eq(0).any()):
                raise ValueError("every_position needs right-padded inputs: a row starts with padding")
            return self._head(hidden)
        T = attention_mask.shape[1]
        last = T - 1 - attention_mask.flip(dims=[1]).long().argmax(dim=1)  # (B,) last attended index
        return self._head(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])

    def _hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        if attention_mask.ndim != 2 or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and attention_mask must both be (B, T); found {tuple(input_ids.shape)} "
                f"and {tuple(attention_mask.shape)}"
            )
        lengths = attention_mask.sum(dim=1)
        if bool((lengths == 0).any()):
            raise ValueError("attention_mask has a row with no attended token")
        # Positions count attended tokens only, so a padded row sees the positions it
        # would see alone.
        position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
        return self.backbone(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # (B, T, H)

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (...,) float32 logits."""
        # the head's own dtype: float32, except under DeepSpeed bf16, which casts every parameter it trains
        head = self.value_head
        return head(hidden.to(head.weight.dtype)).squeeze(-1).float()

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """V(x, s; ref): (B,) in (0, 1)."""
        return torch.sigmoid(self.forward(input_ids, attention_mask))

    def save(self, path: str | Path, tokenizer: PreTrainedTokenizerBase) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(path)
        state = {name: t.detach().contiguous().cpu() for name, t in self.value_head.state_dict().items()}
        save_file(state, str(path / HEAD_FILE))
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "hidden_size": self.value_head.in_features,
            "pooling": "last_attended_token",
            "output": "sigmoid(logit) = V in [0, 1]",
        }
        (path / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        tokenizer.save_pretrained(path)
        return path

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        dtype: str = "float32",
        trust_remote_code: bool = False,
        attn_implementation: str = ATTN_IMPLEMENTATION,
    ) -> tuple[Critic, PreTrainedTokenizerBase]:
        """Load a directory written by ``save``; the critic comes back in eval mode."""
        path = check_safetensors_dir(path, ignore=(HEAD_FILE,))
        meta = _read_meta(path)
        if not (path / HEAD_FILE).is_file():
            raise FileNotFoundError(f"critic directory {path} has no {HEAD_FILE}")
        backbone = from_local(
            AutoModel, path, dtype=dtype, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation
        )
        state = load_file(str(path / HEAD_FILE))
        hidden = backbone.config.hidden_size
        if meta["hidden_size"] != hidden or tuple(state["weight"].shape) != (1, hidden):
            raise ValueError(
                f"critic directory {path}: value head of shape {tuple(state['weight'].shape)} "
                f"(critic.json hidden_size {meta['hidden_size']}) does not fit a backbone of hidden size {hidden}"
            )
        head = nn.Linear(hidden, 1)
        head.load_state_dict(state)
        return cls(backbone, head).eval(), load_tokenizer(path)


def _read_meta(path: Path) -> dict:
    try:
        meta = json.loads((path / META_FILE).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"critic directory {path} has no {META_FILE}; is it a critic saved by ac2?") from None
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path / META_FILE}: expected format {FORMAT!r} version {FORMAT_VERSION}, "
            f"found {meta.get('format')!r} version {meta.get('format_version')!r}"
        )
    return meta


def build_critic_input(
    prompt_ids: list[int],
    ref_ids: list[int] | None,
    state_ids: list[int],
    *,
    ref_id: int,
    state_id: int,
    max_tokens: int,
) -> list[int]:
    """``prompt <|ref|> reference <|state|> partial answer``, at most ``max_tokens`` long.

    ``ref_ids=None`` drops the reference and its separator. When too long, tokens are
    cut from the start of the partial answer: its newest tokens say most about where
    it stands. ValueError if prompt, reference and separators alone do not fit.
    """
    head = list(prompt_ids)
    if ref_ids is not None:
        head += [ref_id, *ref_ids]
    head.append(state_id)
    room = max_tokens - len(head)
    if room < 0:
        ref_len = 0 if ref_ids is None else len(ref_ids)
        raise ValueError(
            f"critic input cannot fit in max_tokens={max_tokens}: prompt ({len(prompt_ids)} tokens), "
            f"reference ({ref_len} tokens) and separators alone take {len(head)}; raise critic.max_input_tokens"
        )
    kept = state_ids[max(len(state_ids) - room, 0) :] if room > 0 else []
    return head + list(kept)
