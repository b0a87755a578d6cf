"""Training backends. ``torch`` is the default."""
