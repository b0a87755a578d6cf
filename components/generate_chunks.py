"""generate_chunks: G samples from each prefix, one chunk (or a full response) each."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def generate_chunks(
    config: Input[Artifact],
    iteration: int,
    problems: Input[Dataset],
    prefixes: Input[Dataset],
    actor: Input[Model],
    out_chunks: Output[Dataset],
):
    from ac2_core.stages import generate_chunks
    from components.io import annotate, stage_context

    with stage_context(config) as (cfg, clock):
        stats = generate_chunks.run(
            cfg,
            iteration=iteration,
            problems=problems.path,
            prefixes=prefixes.path,
            actor=actor.path,
            out_chunks=out_chunks.path,
        )
        annotate(stats, clock(), out_chunks)
