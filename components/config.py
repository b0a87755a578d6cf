"""config: validate the run's config once and hand it to every stage as one artifact."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import Artifact, Output

from components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def config(config_json: str, config: Output[Artifact]) -> NamedTuple("Outputs", algorithm=str):
    """Validate ``config_json`` (the AC2Config tree) and publish it; returns its algorithm."""
    from pathlib import Path

    from ac2_core.config import config_from_json
    from components.io import CONFIG_FILE

    cfg = config_from_json(config_json)
    Path(config.path).mkdir(parents=True, exist_ok=True)
    Path(config.path, CONFIG_FILE).write_text(cfg.to_json())
    config.metadata.update({"run_id": cfg.run_id, "algorithm": cfg.algorithm, "config_hash": cfg.config_hash()})
    return (cfg.algorithm,)
