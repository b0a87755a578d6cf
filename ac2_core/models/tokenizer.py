"""A byte-level tokenizer with no merges: one token per byte, so one per ASCII character.

Keeping every digit its own token is what makes the step-by-step arithmetic of the
built-in task learnable for a tiny model; merged digit pairs would hide the carries.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD = "<|pad|>"
EOS = "<|endoftext|>"
REF = "<|ref|>"  # critic input: starts the reference solution
STATE = "<|state|>"  # critic input: starts the partial answer being judged
SPECIAL_TOKENS = [PAD, EOS, REF, STATE]


def build_tokenizer(corpus: Iterable[str]) -> PreTrainedTokenizerFast:
    """Train the tokenizer on ``corpus``; ids 0-3 are the special tokens, 4-259 the bytes.

    The vocabulary is capped at the 256 bytes plus the special tokens, so the trainer
    learns no merges whatever the corpus holds.
    """
    backend = Tokenizer(models.BPE())
    # use_regex=False: no word splitting, so spaces and digits are never grouped.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=256 + len(SPECIAL_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        additional_special_tokens=[REF, STATE],
        padding_side="left",  # generation appends on the right of every row
        clean_up_tokenization_spaces=False,  # keeps decode(encode(s)) == s
    )
    return tokenizer


# the classes AutoTokenizer would resolve to PreTrainedTokenizerFast itself (transformers 5 names it TokenizersBackend)
_PLAIN_FAST = {"PreTrainedTokenizerFast", "TokenizersBackend"}


def load_tokenizer(path: str | Path):
    """The tokenizer saved in the directory ``path``, as ``AutoTokenizer`` would load it.

    A plain fast tokenizer (what ``build_tokenizer`` saves) is loaded as that class directly:
    ``AutoTokenizer`` resolves to the same class but first imports transformers' model
    classes and torch (about 3 s of CPU in every fresh KFP task). Any other class (a real
    model's, e.g. Qwen2Tokenizer) goes through ``AutoTokenizer``.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist or is not a directory")
    config = path / "tokenizer_config.json"
    declared = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    if declared in _PLAIN_FAST and (path / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def special_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    """Ids of ``pad``, ``eos``, ``ref`` and ``state``; ValueError naming any that is missing."""
    ids = {"pad": tokenizer.pad_token_id, "eos": tokenizer.eos_token_id}
    for name, token in (("ref", REF), ("state", STATE)):
        token_id = tokenizer.convert_tokens_to_ids(token)
        ids[name] = None if token_id == tokenizer.unk_token_id else token_id
    missing = [name for name, token_id in ids.items() if token_id is None]
    if missing:
        raise ValueError(
            f"tokenizer lacks the special tokens {missing}; "
            f"ac2 needs pad, eos, {REF!r} and {STATE!r} (see ac2_core.models.tokenizer.build_tokenizer)"
        )
    return ids
