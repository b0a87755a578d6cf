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
    from components.io import run_stage

    run_stage("generate_chunks", locals())
