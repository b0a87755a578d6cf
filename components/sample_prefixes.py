"""sample_prefixes: choose this iteration's problems and where each group starts."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def sample_prefixes(
    config: Input[Artifact],
    iteration: int,
    problems: Input[Dataset],
    replay: Input[Dataset],
    scored_chunks: Input[Dataset],
    readiness: Input[Dataset],
    actor: Input[Model],
    out_replay: Output[Dataset],
    out_prefixes: Output[Dataset],
):
    from components.io import run_stage

    run_stage("sample_prefixes", locals())
