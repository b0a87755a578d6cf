"""What a run folder remembers of the run that made it: its resolved config, checked on resume.

``<run>/config.yaml`` is the config of the run with every default filled in, written when
the run first starts (both runners), before anything else. It is a valid ``--config``, so
``ac2 stage --config <run>/config.yaml`` reproduces the run's config hash, and a later
``ac2 run`` on the folder is compared with it before anything runs:

- another value of any field that changes what is computed stops the run, listing the fields;
- the run length (``run.iterations``) may differ: a longer run continues after the last
  finished iteration (and the record takes the new length), a shorter one changes nothing;
- so may what only says what is kept, where things live and are shown, or on how many
  processes a stage runs (``config.SETTLED``).

``--resume never`` refuses a folder that holds any of a run.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from ac2_core import storage
from ac2_core.config import SETTLED, AC2Config, ConfigError, parse_config
from ac2_core.runner.layout import RunLayout
from ac2_core.stages.recipe import BOOTSTRAP_STAGE

CONFIG_FILE = "config.yaml"
HEADER = "# The resolved config of this run folder, recorded by `ac2 run` at first start; usable as --config.\n"


class RunFolderError(RuntimeError):
    """A run folder that holds another run than the one asked for; the message says how it differs."""


def config_uri(root: str) -> str:
    return storage.join(root, CONFIG_FILE)


def config_yaml(cfg: AC2Config) -> str:
    return HEADER + yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


def recorded_config(root: str) -> AC2Config | None:
    """The config recorded in run folder ``root``, or None where none was recorded."""
    uri = config_uri(root)
    text = storage.read_text(uri)
    if text is None:
        return None
    try:
        return parse_config(yaml.safe_load(text), uri)
    except (ConfigError, yaml.YAMLError) as e:
        raise RunFolderError(f"{uri}: the recorded config cannot be read ({str(e).splitlines()[0]})") from None


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flat(value, name + "."))
        else:
            out[name] = value
    return out


def differences(recorded: AC2Config, cfg: AC2Config) -> list[str]:
    """``field: recorded X, now Y`` for each field outside ``config.SETTLED`` that differs, sorted
    (none exactly when the two ``run_hash`` agree)."""
    a, b = _flat(recorded.model_dump(mode="json", exclude=SETTLED)), _flat(cfg.model_dump(mode="json", exclude=SETTLED))
    return [f"{k}: recorded {a.get(k)!r}, now {b.get(k)!r}" for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


@dataclass(frozen=True)
class Resume:
    """What a run folder holds for the run asked of it."""

    done: int  # finished iterations
    holds_run: bool  # a recorded config, a bootstrap or an iteration

    def fewer(self, cfg: AC2Config) -> bool:
        """The run asks for fewer iterations than are finished: nothing to do, and nothing is changed."""
        return cfg.run.iterations < self.done


def check(cfg: AC2Config, layout: RunLayout, *, resume: str = "auto") -> Resume:
    """Check that ``layout``'s folder may run ``cfg`` (``resume``: auto or never); writes nothing.

    RunFolderError (naming the folder and what differs) when it may not.
    """
    recorded = recorded_config(layout.root)
    done = layout.completed_iterations()
    has_bootstrap = any(storage.exists(layout.bootstrap(name)) for name in BOOTSTRAP_STAGE.outputs)
    holds_run = recorded is not None or has_bootstrap or done > 0
    if holds_run and resume == "never":
        raise RunFolderError(
            f"{layout.root} already holds a run ({done} finished iteration(s)) and --resume is never;"
            " choose another --out, or --resume auto to continue it"
        )
    if recorded is not None:
        diffs = differences(recorded, cfg)
        if diffs:
            raise RunFolderError(
                f"{layout.root} holds a run of another config ({config_uri(layout.root)}); differing: {'; '.join(diffs)}."
                f" Resume it with --config {config_uri(layout.root)}, or choose another --out"
            )
    elif done:  # made before run folders recorded their config: the last iteration's hash must match
        made = storage.read_manifest(layout.output(done, "metrics")).config_hash
        if made != cfg.config_hash():
            raise RunFolderError(
                f"{layout.root} records no config, and its iteration {done} was made with config hash {made[:12]},"
                f" not this config's {cfg.config_hash()[:12]}: rerun with the original config and flags, or choose another --out"
            )
    elif has_bootstrap and storage.read_manifest(layout.bootstrap("metrics")).config_hash != cfg.bootstrap_hash():
        raise RunFolderError(f"{layout.root} holds a bootstrap made for other model/task/warm_start/eval/seed settings")
    return Resume(done=done, holds_run=holds_run)


def record(cfg: AC2Config, layout: RunLayout) -> None:
    """Record ``cfg`` as the run folder's config (at first start; again when a run is extended)."""
    storage.write_text(config_uri(layout.root), config_yaml(cfg))
