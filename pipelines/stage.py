"""``ac2 stage``: run one stage on the artifacts of any earlier run, as its component would.

Keys are the recipe's names for the stage's inputs and outputs (``ac2_core.stages.recipe``),
which are its ``run()`` keywords: inputs as written (``--in actor=URI``), outputs with or
without the ``out_`` prefix (``--out chunks=URI`` = ``--out out_chunks=URI``). An input
that the stage may take as None (a grpo run's critic) may be left out.
"""

from __future__ import annotations

import os

from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.stages import recipe
from ac2_core.stages.common import StageStats


def _pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, uri = item.partition("=")
        if not sep or not key or not uri:
            raise ValueError(f"{flag} {item!r}: expected KEY=URI")
        if key in out:
            raise ValueError(f"{flag} {key} is given twice")
        out[key] = uri
    return out


def stage_kwargs(name: str, inputs: list[str], outputs: list[str]) -> dict[str, str | None]:
    """Check the keys against the stage's recipe entry; return its URI keyword arguments."""
    stage = recipe.stage(name)
    in_keys = [inp.keyword for inp in stage.inputs]
    ins = _pairs(inputs, "--in")
    outs = {k if k.startswith("out_") else f"out_{k}": v for k, v in _pairs(outputs, "--out").items()}
    unknown = sorted(k for k in ins if k not in in_keys) + sorted(k for k in outs if k not in stage.out_keywords)
    if unknown:
        accepted = ", ".join([*(f"--in {k}" for k in in_keys), *(f"--out {k.removeprefix('out_')}" for k in stage.out_keywords)])
        raise ValueError(f"stage {name}: unknown key(s) {', '.join(unknown)}; it takes {accepted}")
    missing = [f"--in {inp.keyword}" for inp in stage.inputs if inp.keyword not in ins and not recipe.optional(stage, inp)]
    missing += [f"--out {k.removeprefix('out_')}" for k in stage.out_keywords if k not in outs]
    if missing:
        raise ValueError(f"stage {name}: missing {', '.join(missing)}")
    return {k: ins.get(k) for k in in_keys} | {k: outs[k] for k in stage.out_keywords}


def default_iteration(name: str) -> int:
    """The iteration ``ac2 stage`` runs a stage as when none is given: 0 for the bootstrap, else 1."""
    return 0 if name == recipe.BOOTSTRAP_STAGE.name else 1


def run_stage(cfg: AC2Config, name: str, iteration: int, kwargs: dict[str, str | None]) -> StageStats:
    """Call the stage exactly as its component does (through ``recipe.run_stage``, a fresh model store)."""
    bootstrap = name == recipe.BOOTSTRAP_STAGE.name
    if not (iteration == 0 if bootstrap else iteration >= 1):
        expected = "0 (the bootstrap)" if bootstrap else ">= 1 (iteration 0 is the bootstrap)"
        raise ValueError(f"--iteration for stage {name} must be {expected}; found {iteration}")
    # the outputs' manifests name the inputs as given, local paths made absolute (no working directory in them)
    named = {k: v if v is None or "://" in v else os.path.abspath(v) for k, v in kwargs.items()}
    with storage.using(cfg.storage):
        return recipe.run_stage(cfg, name, iteration=iteration, kwargs=kwargs, named=named)
