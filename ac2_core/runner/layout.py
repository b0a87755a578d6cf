"""Where a local run keeps its artifacts: one folder per iteration, one per stage.

<root>/bootstrap/{problems,actor,critic}
<root>/iter-0001/sample_prefixes/{replay,prefixes}
<root>/iter-0001/generate_chunks/chunks
<root>/iter-0001/score_chunks/{scored_chunks,critic_pairs}
<root>/iter-0001/check_readiness/{readiness,advantages}
<root>/iter-0001/update_actor/actor
<root>/iter-0001/update_critic/critic
<root>/iter-0001/evaluate/metrics
"""

from __future__ import annotations

from dataclasses import dataclass

from ac2_core.storage import join

OUTPUTS = {
    "sample_prefixes": ("replay", "prefixes"),
    "generate_chunks": ("chunks",),
    "score_chunks": ("scored_chunks", "critic_pairs"),
    "check_readiness": ("readiness", "advantages"),
    "update_actor": ("actor",),
    "update_critic": ("critic",),
    "evaluate": ("metrics",),
}
STAGES = tuple(OUTPUTS)


@dataclass(frozen=True)
class RunLayout:
    root: str

    def bootstrap(self, name: str) -> str:
        return join(self.root, "bootstrap", name)

    def iteration_dir(self, iteration: int) -> str:
        return join(self.root, f"iter-{iteration:04d}")

    def output(self, iteration: int, name: str) -> str:
        """URI of artifact ``name`` written in ``iteration`` (0 is the bootstrap)."""
        if iteration == 0:
            return self.bootstrap(name)
        stage = next(s for s, outs in OUTPUTS.items() if name in outs)
        return join(self.iteration_dir(iteration), stage, name)
