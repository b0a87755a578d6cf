"""update_critic: fit the value head to this iteration's outcomes (ac2 only)."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def update_critic(
    config: Input[Artifact],
    iteration: int,
    problems: Input[Dataset],
    replay: Input[Dataset],
    critic: Input[Model],
    critic_pairs: Input[Dataset],
    scored_chunks: Input[Dataset],
    out_critic: Output[Model],
):
    from components.io import run_stage

    run_stage("update_critic", locals())
