"""Where a run keeps its artifacts: one folder per iteration, one per stage, whichever runner wrote them.

    <root>/bootstrap/{problems,actor,critic,replay,scored_chunks,readiness,metrics}
    <root>/iter-0001/sample_prefixes/{replay,prefixes}
    <root>/iter-0001/generate_chunks/chunks
    <root>/iter-0001/score_chunks/{scored_chunks,critic_pairs}
    <root>/iter-0001/check_readiness/{readiness,advantages}
    <root>/iter-0001/update_actor/actor
    <root>/iter-0001/update_critic/critic          (ac2 only)
    <root>/iter-0001/evaluate/metrics

    <root>/config.yaml                            the resolved config, recorded at first start (``record``)

An iteration is finished once its ``metrics`` is published: both runners publish it last.
Manifests name their inputs by these paths relative to the root (``relative``), so a run
folder can be moved, or copied to object storage, whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ac2_core import storage
from ac2_core.stages.recipe import BOOTSTRAP_STAGE, PRODUCER

# an artifact's path in a run folder: bootstrap/<name> or iter-NNNN/<stage>/<name>
_IN_RUN = re.compile(r"^(?P<root>.*?)/?(?P<path>bootstrap/[^/]+|iter-(?P<it>\d{4,})/[^/]+/[^/]+)/?$")


@dataclass(frozen=True)
class RunLayout:
    root: str

    @staticmethod
    def relative(iteration: int, name: str) -> str:
        """Path of artifact ``name`` of ``iteration`` (0: the bootstrap) relative to the run folder."""
        if iteration == 0:
            return f"bootstrap/{name}"
        return f"iter-{iteration:04d}/{PRODUCER[name].name}/{name}"

    @staticmethod
    def split(uri: str) -> tuple[str, str] | None:
        """(run folder, relative path) of an artifact URI laid out as in a run folder; None otherwise."""
        m = _IN_RUN.match(uri.rstrip("/"))
        return (m.group("root"), m.group("path")) if m else None

    def bootstrap(self, name: str) -> str:
        return storage.join(self.root, "bootstrap", name)

    def iteration_dir(self, iteration: int) -> str:
        return storage.join(self.root, f"iter-{iteration:04d}")

    def output(self, iteration: int, name: str) -> str:
        """URI of artifact ``name`` written in ``iteration`` (0 is the bootstrap)."""
        return storage.join(self.root, self.relative(iteration, name))

    def has_bootstrap(self) -> bool:
        return all(storage.exists(self.bootstrap(name)) for name in BOOTSTRAP_STAGE.outputs)

    def completed_iterations(self) -> int:
        """The last iteration whose metrics were published (0 if none)."""
        it = 0
        while storage.exists(self.output(it + 1, "metrics")):
            it += 1
        return it
