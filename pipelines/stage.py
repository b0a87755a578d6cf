"""``ac2 stage``: run one stage on the artifacts of any earlier run, as its component would.

Keys are the stage's ``run()`` keyword names: inputs as written (``--in actor=URI``),
outputs with or without the ``out_`` prefix (``--out chunks=URI`` = ``--out out_chunks=URI``).
An input that the stage accepts as None (a grpo run's critic) may be left out.
"""

from __future__ import annotations

import importlib
import inspect

from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.runner.layout import STAGES

_NOT_URIS = {"cfg", "iteration", "store", "progress"}


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
    """Check the keys against the stage's signature; return its URI keyword arguments."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; expected one of {', '.join(STAGES)}")
    params = {
        p.name: p
        for p in inspect.signature(importlib.import_module(f"ac2_core.stages.{name}").run).parameters.values()
        if p.kind is p.KEYWORD_ONLY and p.name not in _NOT_URIS
    }
    ins = _pairs(inputs, "--in")
    outs = {k if k.startswith("out_") else f"out_{k}": v for k, v in _pairs(outputs, "--out").items()}
    kwargs = {**ins, **outs}
    unknown = sorted(k for k in ins if k not in params or k.startswith("out_")) + sorted(k for k in outs if k not in params)
    if unknown:
        accepted = ", ".join(f"--{'out' if p.startswith('out_') else 'in'} {p.removeprefix('out_')}" for p in params)
        raise ValueError(f"stage {name}: unknown key(s) {', '.join(unknown)}; it takes {accepted}")
    optional = {p for p, spec in params.items() if spec.default is None or "None" in str(spec.annotation)}
    missing = [p for p in params if p not in kwargs and p not in optional]
    if missing:
        raise ValueError(
            f"stage {name}: missing {', '.join(('--out ' + p[4:]) if p.startswith('out_') else ('--in ' + p) for p in missing)}"
        )
    return {p: kwargs.get(p) for p in params}


def run_stage(cfg: AC2Config, name: str, iteration: int, kwargs: dict[str, str | None]) -> dict:
    """Call ``ac2_core.stages.<name>.run`` exactly as its component does (a fresh model store)."""
    if iteration < 1:
        raise ValueError(f"--iteration must be >= 1 (iteration 0 is the bootstrap); found {iteration}")
    module = importlib.import_module(f"ac2_core.stages.{name}")
    with storage.using(cfg.storage):
        return module.run(cfg, iteration=iteration, **kwargs)
