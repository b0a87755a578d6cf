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

    run_stage(
        "ac2_core.stages.update_critic:run",
        config,
        outputs=(out_critic,),
        iteration=iteration,
        problems=problems.path,
        replay=replay.path,
        critic=critic.path,
        critic_pairs=critic_pairs.path,
        scored_chunks=scored_chunks.path,
        out_critic=out_critic.path,
    )
