"""Where a run keeps its artifacts: one folder per iteration, one per stage, whichever runner wrote them.

    <root>/bootstrap/{problems,actor,critic,replay,scored_chunks,readiness,metrics}
    <root>/iter-0001/sample_prefixes/{replay,prefixes}
    <root>/iter-0001/generate_chunks/chunks
    <root>/iter-0001/score_chunks/{scored_chunks,critic_pairs}
    <root>/iter-0001/check_readiness/{readiness,advantages}
    <root>/iter-0001/update_actor/actor
    <root>/iter-0001/update_critic/critic          (ac2 only)
    <root>/iter-0001/evaluate/metrics

An iteration is finished once its ``metrics`` is published: both runners publish it last.
"""

from __future__ import annotations

from dataclasses import dataclass

from ac2_core import storage
from ac2_core.stages.recipe import BOOTSTRAP_STAGE, PRODUCER


@dataclass(frozen=True)
class RunLayout:
    root: str

    def bootstrap(self, name: str) -> str:
        return storage.join(self.root, "bootstrap", name)

    def iteration_dir(self, iteration: int) -> str:
        return storage.join(self.root, f"iter-{iteration:04d}")

    def output(self, iteration: int, name: str) -> str:
        """URI of artifact ``name`` written in ``iteration`` (0 is the bootstrap)."""
        if iteration == 0:
            return self.bootstrap(name)
        return storage.join(self.iteration_dir(iteration), PRODUCER[name].name, name)

    def has_bootstrap(self) -> bool:
        return all(storage.exists(self.bootstrap(name)) for name in BOOTSTRAP_STAGE.outputs)

    def completed_iterations(self) -> int:
        """The last iteration whose metrics were published (0 if none)."""
        it = 0
        while storage.exists(self.output(it + 1, "metrics")):
            it += 1
        return it
