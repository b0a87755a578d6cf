"""Running AC2 on this machine: the run folder's layout, the iteration loop, the in-process runner,
and what a run shows."""
