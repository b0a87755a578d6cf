"""Models: HF loading and saving, the tiny-model factory, the critic, checkpoints."""

from transformers.utils import logging as _hf_logging

# Per-file progress bars of tiny checkpoints drown the training log.
_hf_logging.disable_progress_bar()
