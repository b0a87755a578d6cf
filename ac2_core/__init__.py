"""ac2: Actor-Critic with Action Chunking. See README.md and docs/design.md."""

from ac2_core.threads import wait_passively

# before anything here imports torch, whose OpenMP reads the wait policy once, when it loads
wait_passively()
