"""check_readiness: per-problem readiness windows, and the gated advantages."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def check_readiness(
    config: Input[Artifact],
    iteration: int,
    readiness: Input[Dataset],
    critic_pairs: Input[Dataset],
    scored_chunks: Input[Dataset],
    out_readiness: Output[Dataset],
    out_advantages: Output[Dataset],
):
    from components.io import run_stage

    run_stage("check_readiness", locals())
