"""The critic ``V(x, s; ref)``: the actor's backbone plus a scalar head on the last token.

Its input is problem + reference solution (if any) + partial answer, built by
``build_critic_input`` (docs/design.md section 2, step 6).

A critic *with surprise* (``critic.surprise``) keeps the backbone's next-token head too. In
the same pass it reads how unlikely each written token of the partial answer was, given the
problem and the reference before it, and the value head sees the running largest and mean
of that loss beside the hidden state. A slip is a token the reference-conditioned model did
not expect: the evidence a grader looks at, which a value head fitted from scalar outcomes
would otherwise have to rediscover (docs/algorithm.md, research log section 7).

A critic that *matches the reference* (``critic.reference_match``) also reads, at each token of
the partial answer, how far the answer's latest tokens run on along the reference: the length
of the longest run ending there that the reference also holds, and how many of the written
tokens so far ended a run shorter than ``MATCH_NGRAM`` (they left the reference), and with
``left_flag`` whether any has. It is the copy circuit (an induction head) a pretrained LLM
brings to a reference and a tiny backbone does not learn from scalar outcomes (research log
section 16); the value head decides what leaving the reference is worth, since a correct
answer may take another route than its reference.

On disk a critic is an HF-style directory::

    config.json, model.safetensors   the backbone (``save_pretrained``)
    value_head.safetensors           the scalar head
    lm_head.safetensors              the next-token head (critics with surprise only)
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
LM_HEAD_FILE = "lm_head.safetensors"
META_FILE = "critic.json"
FORMAT = "ac2-critic"
FORMAT_VERSION = 1

SURPRISE_FEATURES = 3  # the running largest and mean next-token loss of the partial answer, and log(1 + its length)
# The features enter the head multiplied by this gain: Adam moves each weight by about lr a
# step, so a handful of weights on O(1) features would take thousands of steps to reach the
# scale of a fitted logistic (~1 a nat); the gain lets them learn at lr * gain.
SURPRISE_GAIN = 32.0


# log(1 + written tokens that left the reference), log(1 + the current run along it), 1: a reference is shown
MATCH_FEATURES = 3
# ... and with the left flag (``critic.reference_left_flag``) a fourth: 1 once any written token has left it. The log
# count is small a few tokens past a slip, so a linear head reading it alone commits slowly (research log section 25)
LEFT_FLAG_FEATURES = 1
MATCH_GAIN = SURPRISE_GAIN  # the same reason as surprise's: features of O(1) beside the hidden state
MATCH_NGRAM = 4  # a written token is on the reference when the run ending at it is at least this long (or the whole answer)


def match_width(*, match: bool, left_flag: bool = False) -> int:
    """How many reference-match features the value head reads."""
    return (MATCH_FEATURES + (LEFT_FLAG_FEATURES if left_flag else 0)) if match else 0


def head_width(hidden_size: int, *, surprise: bool, match: bool = False, left_flag: bool = False) -> int:
    """Inputs of the value head: the hidden state, then the reference-match and the surprise features when
    the critic reads them."""
    return hidden_size + match_width(match=match, left_flag=left_flag) + (SURPRISE_FEATURES if surprise else 0)


def reference_match(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, *, ref_id: int, state_id: int, left_flag: bool = False
) -> torch.Tensor:
    """(B, T, match_width) float32 of critic inputs ``prompt <|ref|> reference <|state|> answer``.

    At each answer position ``t``: log(1 + the answer tokens up to ``t`` that left the reference),
    log(1 + the length of the longest run of answer tokens ending at ``t`` that occurs in the
    reference), and 1; with ``left_flag``, also 1 once any of those tokens left it. A token left
    the reference when that run is shorter than ``MATCH_NGRAM`` (or than the answer so far, at its
    start). Zeros before the answer, and on rows without a reference (no ``ref_id`` before the
    ``state_id``).
    """
    mask = attention_mask.bool()
    B, T = input_ids.shape
    pos = torch.arange(T, device=input_ids.device)[None]  # (1, T)
    is_state = input_ids.eq(state_id) & mask
    if not bool(is_state.any(dim=1).all()):
        raise ValueError(f"a critic that matches the reference needs the state separator (token {state_id}) in every row")
    state = is_state.long().argmax(dim=1, keepdim=True)  # (B, 1)
    is_ref = input_ids.eq(ref_id) & mask & (pos < state)
    has_ref = is_ref.any(dim=1, keepdim=True)  # (B, 1)
    ref = is_ref.long().argmax(dim=1, keepdim=True)  # (B, 1); 0 on rows without one (masked out below)
    lengths = torch.where(has_ref, state - ref - 1, 0)  # (B, 1) reference tokens
    width = max(int(lengths.max()), 1)
    j = torch.arange(width, device=input_ids.device)[None]  # (1, R)
    reference = input_ids.gather(1, (ref + 1 + j).clamp(max=T - 1))
    reference = torch.where(j < lengths, reference, -1)  # (B, R); -1 never matches a token
    written = (pos > state) & mask  # (B, T)
    tokens = torch.where(written, input_ids, -2)
    run = torch.zeros(B, width, dtype=torch.long, device=input_ids.device)  # run ending at each reference token
    longest = torch.zeros(B, T, dtype=torch.long, device=input_ids.device)
    for t in range(int(state.min()) + 1, T):  # runs along the diagonals: extend the run one token back, or end it
        extended = torch.cat([run.new_zeros(B, 1), run[:, :-1]], dim=1) + 1
        run = torch.where(tokens[:, t, None].eq(reference), extended, 0)
        longest[:, t] = run.max(dim=1).values
    count = written.long().cumsum(dim=1)  # answer tokens up to t
    left = (written & (longest < count.clamp(max=MATCH_NGRAM))).long().cumsum(dim=1).float()  # tokens that left, up to t
    columns = [torch.log1p(left), torch.log1p(longest.float()), torch.ones(B, T, device=input_ids.device)]
    if left_flag:
        columns.append(left.gt(0).float())
    return torch.stack(columns, dim=-1) * (written & has_ref)[..., None]


def _zero_head(width: int, *, seed: int = 0) -> nn.Linear:
    """A value head of zeros: V = 0.5 on every input at first, an honest "don't know".

    A random head would give input-dependent values that readiness would take for real
    predictions. The weight still gets gradient (BCE grad times the head's inputs).
    """
    with torch.random.fork_rng(devices=[]):  # leave the global RNG as it was
        torch.manual_seed(seed)
        head = nn.Linear(width, 1)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


class Critic(nn.Module):
    """``forward`` gives logits ``(B,)``; ``values`` gives ``V = sigmoid(logits)`` in (0, 1).

    With ``lm_head`` (and ``state_id``, the token that opens the partial answer) the value head
    reads the surprise features beside the hidden state, and with ``ref_id`` (and ``state_id``)
    the reference-match features (with ``left_flag``, the "has left" indicator among them):
    ``[hidden state, match, surprise]``. See the module docstring.
    """

    def __init__(
        self,
        backbone: PreTrainedModel,
        value_head: nn.Linear,
        *,
        lm_head: nn.Linear | None = None,
        state_id: int | None = None,
        ref_id: int | None = None,
        left_flag: bool = False,
    ):
        super().__init__()
        if state_id is None and (lm_head is not None or ref_id is not None):
            raise ValueError("a critic with surprise or reference match needs state_id, the token that opens the answer")
        if lm_head is None and ref_id is None and state_id is not None:
            raise ValueError("a critic given state_id reads surprise (lm_head) or the reference match (ref_id)")
        if left_flag and ref_id is None:
            raise ValueError("left_flag is one of the reference-match features: it needs ref_id")
        expected = head_width(
            backbone.config.hidden_size, surprise=lm_head is not None, match=ref_id is not None, left_flag=left_flag
        )
        if value_head.in_features != expected:
            raise ValueError(f"value head takes {value_head.in_features} inputs; this critic gives it {expected}")
        self.backbone = backbone
        # Kept in float32 whatever the backbone's dtype: one matmul, and V near 0 or 1
        # needs the precision.
        self.value_head = value_head.to(device=backbone.device, dtype=torch.float32)
        self.lm_head = None if lm_head is None else lm_head.to(device=backbone.device, dtype=backbone.dtype)
        if self.lm_head is not None:
            self.lm_head.requires_grad_(False)  # read, never trained: the value loss does not reach it
        self.state_id = state_id
        self.ref_id = ref_id
        self.left_flag = left_flag

    @property
    def surprise(self) -> bool:
        return self.lm_head is not None

    @property
    def match(self) -> bool:
        return self.ref_id is not None

    @classmethod
    def from_actor(
        cls,
        actor: PreTrainedModel,
        *,
        seed: int,
        state_id: int | None = None,
        ref_id: int | None = None,
        surprise: bool = True,
    ) -> Critic:
        """A critic whose backbone is a copy of ``actor``'s; the actor is left untouched.

        With ``state_id`` it is a critic with surprise (unless ``surprise=False``), and keeps a copy
        of the actor's next-token head; with ``ref_id`` too, it matches the reference.
        """
        backbone = copy.deepcopy(actor.base_model)
        surprise = surprise and state_id is not None
        lm_head = copy.deepcopy(actor.get_output_embeddings()) if surprise else None
        head = _zero_head(head_width(backbone.config.hidden_size, surprise=surprise, match=ref_id is not None), seed=seed)
        return cls(backbone, head, lm_head=lm_head, state_id=state_id, ref_id=ref_id).eval()

    def with_reference_match(self, ref_id: int | None, state_id: int, *, left_flag: bool = False) -> Critic:
        """This critic with (``ref_id``, and the "has left" indicator with ``left_flag``) or without
        (None) the reference match, and a zero value head.

        For a critic whose head was never fitted (the bootstrap's, V = 0.5 everywhere): V stays
        0.5, and the first fit learns the head the run's config names. ValueError on a fitted head.
        """
        if bool(self.value_head.weight.any()) or bool(self.value_head.bias.any()):
            raise ValueError("a fitted value head keeps its inputs: only a zero head can gain or lose the reference match")
        width = head_width(
            self.backbone.config.hidden_size, surprise=self.surprise, match=ref_id is not None, left_flag=left_flag
        )
        head = _zero_head(width).to(device=self.value_head.weight.device, dtype=self.value_head.weight.dtype)
        state_id = state_id if self.surprise or ref_id is not None else None
        critic = Critic(self.backbone, head, lm_head=self.lm_head, state_id=state_id, ref_id=ref_id, left_flag=left_flag)
        return critic.train(self.training)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, every_position: bool = False) -> torch.Tensor:
        """input_ids, attention_mask: (B, T); left or right padded. Returns logits: (B,) float32,
        the last attended token's.

        ``every_position=True`` (right-padded inputs only) returns (B, T): the backbone is
        causal, so position ``t`` holds the logit of the input cut after token ``t``, and one
        pass scores every state along an answer.
        """
        hidden = self._hidden(input_ids, attention_mask)  # (B, T, H)
        features = []  # beside the hidden state, in the order head_width counts them
        if self.match:
            match = reference_match(
                input_ids, attention_mask, ref_id=self.ref_id, state_id=self.state_id, left_flag=self.left_flag
            )
            features.append(match * MATCH_GAIN)
        if self.surprise:
            features.append(self._surprise(hidden, input_ids, attention_mask))
        if features:
            hidden = torch.cat([hidden.float(), *features], dim=-1)
        if every_position:
            if bool(attention_mask[:, 0].eq(0).any()):
                raise ValueError("every_position needs right-padded inputs: a row starts with padding")
            return self._head(hidden)
        T = attention_mask.shape[1]
        last = T - 1 - attention_mask.flip(dims=[1]).long().argmax(dim=1)  # (B,) last attended index
        return self._head(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])

    @torch.no_grad()
    def _surprise(self, hidden: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T, SURPRISE_FEATURES) float32, times ``SURPRISE_GAIN``: at position ``t``, over the
        answer tokens up to ``t`` (those after the row's ``state_id``), the largest and the mean
        next-token loss, and log(1 + their number); zeros up to the ``state_id`` itself.

        Computed without gradient: the value fit reads the next-token head, it does not train it
        to be surprised.
        """
        is_state = input_ids.eq(self.state_id) & attention_mask.bool()
        if not bool(is_state.any(dim=1).all()):
            raise ValueError(f"a critic with surprise needs the state separator (token {self.state_id}) in every input row")
        start = is_state.long().argmax(dim=1, keepdim=True)  # (B, 1): the first separator
        pos = torch.arange(input_ids.shape[1], device=input_ids.device)[None]  # (1, T)
        written = (pos > start) & attention_mask.bool()  # (B, T): the answer's tokens
        # the next-token head runs only where an answer token is predicted, not over the problem and
        # the reference: for a long reference that is most of the input, and logits are (tokens, vocab)
        rows, cols = written.nonzero(as_tuple=True)  # cols >= 1: an answer token follows the separator
        logp = torch.log_softmax(self.lm_head(hidden[rows, cols - 1]).float(), dim=-1)  # (N, V)
        nll = torch.zeros(written.shape, dtype=torch.float32, device=hidden.device)  # (B, T): token t's loss at t
        nll[rows, cols] = -logp.gather(-1, input_ids[rows, cols, None]).squeeze(-1)
        count = written.long().cumsum(dim=1)  # answer tokens up to t
        largest = torch.cummax(nll, dim=1).values  # losses are >= 0, so masked zeros never win
        mean = nll.cumsum(dim=1) / count.clamp(min=1)
        features = torch.stack([largest, mean, torch.log1p(count.float())], dim=-1)
        return features * SURPRISE_GAIN

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
        if self.surprise:
            save_file({"weight": self.lm_head.weight.detach().contiguous().cpu()}, str(path / LM_HEAD_FILE))
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "hidden_size": self.backbone.config.hidden_size,
            "pooling": "last_attended_token",
            "output": "sigmoid(logit) = V in [0, 1]",
        }
        if self.surprise:
            meta["surprise"] = {"state_id": self.state_id, "features": SURPRISE_FEATURES, "gain": SURPRISE_GAIN}
        if self.match:
            meta["reference_match"] = {
                "ref_id": self.ref_id,
                "state_id": self.state_id,
                "features": match_width(match=True, left_flag=self.left_flag),
                "ngram": MATCH_NGRAM,
                "gain": MATCH_GAIN,
            }
            if self.left_flag:  # absent on the critics written before the flag, which read without it
                meta["reference_match"]["left_flag"] = True
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
        path = check_safetensors_dir(path, ignore=(HEAD_FILE, LM_HEAD_FILE))
        meta = read_meta(path)
        surprise, match = meta.get("surprise"), meta.get("reference_match")
        needed = (HEAD_FILE, LM_HEAD_FILE) if surprise else (HEAD_FILE,)
        for name in needed:
            if not (path / name).is_file():
                raise FileNotFoundError(f"critic directory {path} has no {name}")
        backbone = from_local(
            AutoModel, path, dtype=dtype, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation
        )
        state = load_file(str(path / HEAD_FILE))
        hidden = backbone.config.hidden_size
        left_flag = bool(match and match.get("left_flag"))
        width = head_width(hidden, surprise=bool(surprise), match=bool(match), left_flag=left_flag)
        if meta["hidden_size"] != hidden or tuple(state["weight"].shape) != (1, width):
            raise ValueError(
                f"critic directory {path}: value head of shape {tuple(state['weight'].shape)} "
                f"(critic.json hidden_size {meta['hidden_size']}, surprise {bool(surprise)}, reference_match"
                f" {bool(match)}, left_flag {left_flag}) does not fit a backbone of hidden size {hidden}: expected"
                f" (1, {width})"
            )
        computed = (match_width(match=True, left_flag=left_flag), MATCH_NGRAM, MATCH_GAIN)
        if match and (match.get("features"), match.get("ngram"), match.get("gain")) != computed:
            raise ValueError(
                f"{path / META_FILE}: reference match of {match.get('features')} features, n-gram {match.get('ngram')}"
                f" at gain {match.get('gain')}; this ac2 computes {computed[0]}, {MATCH_NGRAM} at gain {MATCH_GAIN}"
            )
        if surprise and (surprise.get("features"), surprise.get("gain")) != (SURPRISE_FEATURES, SURPRISE_GAIN):
            raise ValueError(
                f"{path / META_FILE}: surprise features {surprise.get('features')} at gain {surprise.get('gain')};"
                f" this ac2 computes {SURPRISE_FEATURES} at gain {SURPRISE_GAIN}"
            )
        head = nn.Linear(width, 1)
        head.load_state_dict(state)
        lm_head = None
        if surprise:
            weight = load_file(str(path / LM_HEAD_FILE))["weight"]
            if tuple(weight.shape) != (backbone.config.vocab_size, hidden):
                raise ValueError(
                    f"critic directory {path}: {LM_HEAD_FILE} of shape {tuple(weight.shape)}; expected"
                    f" ({backbone.config.vocab_size}, {hidden})"
                )
            lm_head = nn.Linear(hidden, weight.shape[0], bias=False)
            lm_head.weight.data.copy_(weight)
        state_id = (surprise or match or {}).get("state_id")
        ref_id = match["ref_id"] if match else None
        critic = cls(backbone, head, lm_head=lm_head, state_id=state_id, ref_id=ref_id, left_flag=left_flag)
        return critic.eval(), load_tokenizer(path)


def read_meta(path: Path) -> dict:
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
