"""Models: HF loading and saving, the tiny-model factory, the critic, checkpoints."""
