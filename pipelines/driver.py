"""Chaining iteration runs: what run k gets from the runs before it, and where a finished run's outputs are.

Shared by the kfp runner (``pipelines.local``) and the cluster submitter
(``pipelines.submit``). Every ac2 artifact is a directory with a ``manifest.json``, so a
finished run's outputs are found under its run root by their output names:

    kfp.local:  <pipeline_root>/<pipeline name>-<timestamp>/<task>/<output name>
    cluster:    <pipeline_root>/<pipeline name>/<run id>/<task>/<salt>/<output name>
                (KFP before 2.4 has no <salt> level)

Output names are ``out_<artifact>``; they are found here as the artifact's name.
"""

from __future__ import annotations

from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.stages import recipe


class PipelineFailed(RuntimeError):
    """A pipeline run that did not finish, or whose outputs cannot be found; one line for people."""


def find_outputs(run_root: str) -> dict[str, str]:
    """URI of every published ac2 artifact under a finished run's root, by artifact name."""
    found: dict[str, str] = {}
    for path in storage.find_artifacts(run_root):
        name = path.rstrip("/").rsplit("/", 1)[-1].removeprefix("out_")
        if name.startswith("."):  # a stage's staging or replaced copy, never an output
            continue
        if name in found:
            raise PipelineFailed(f"{run_root}: two outputs named {name} ({found[name]} and {path})")
        found[name] = path
    if not found:
        raise PipelineFailed(f"{run_root}: no published artifacts under this run root")
    return found


def pipeline_arguments(cfg: AC2Config, iteration: int, published: recipe.Published) -> dict:
    """Arguments of the iteration pipeline for ``iteration``: the config, and for each input
    the recipe imports from outside the iteration, its URI as ``<keyword>_uri``.

    ``published(k, artifact)`` is the URI of what iteration ``k`` (0: the bootstrap) wrote.
    """
    uris = {}
    for inp in recipe.imports():
        try:
            uris[f"{inp.keyword}_uri"] = recipe.input_uri(cfg, inp, iteration, published)
        except KeyError as e:
            raise PipelineFailed(f"iteration {iteration}: no {e.args[0]} from the runs before it") from None
    return {"config_json": cfg.to_json(), "iteration": iteration, **uris}
