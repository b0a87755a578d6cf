"""Generation backends. ``hf`` is the CPU default; ``vllm`` is the GPU default."""

from ac2_core.generation.hf import Sample, generate

__all__ = ["Sample", "generate"]
