"""update_actor: PPO-clip on the chunk tokens the gate lets through."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def update_actor(
    config: Input[Artifact],
    iteration: int,
    problems: Input[Dataset],
    actor: Input[Model],
    prefixes: Input[Dataset],
    chunks: Input[Dataset],
    advantages: Input[Dataset],
    reference: Input[Model],
    out_actor: Output[Model],
):
    """``reference`` (the bootstrap actor) is read only when ``actor.kl_beta > 0``."""
    from components.io import run_stage

    run_stage("update_actor", locals())
