"""The AC2 iteration as data: every stage, the artifact behind each of its inputs, and what it writes.

Everything that runs stages takes its wiring from this table: the KFP pipelines
(``pipelines.dag``), the in-process runner (``ac2_core.runner.inprocess``), ``ac2 stage``
and ``ac2 submit``. Adding a stage, or an input to one, is an edit here (plus the stage's
own signature and its component's, which a test holds to this table).

An input's artifact comes from one of three places:

    BOOTSTRAP  what the bootstrap wrote (the problem set; the initial actor as reference)
    PREVIOUS   the artifact as iteration t-1 left it: its own output, or, where no stage
               of the algorithm writes it (the critic under grpo), the bootstrap's; for
               iteration 1, the bootstrap's
    CURRENT    written by an earlier stage of this iteration; None where that stage does
               not run under the algorithm (evaluate's critic under grpo)

A stage's keyword for an input is ``Input.keyword``; for an output artifact ``name`` it is
``out_<name>``. Only the standard library is imported here: the config tree and the
KFP task processes import this module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from ac2_core.config import AC2Config
    from ac2_core.models.store import ModelStore
    from ac2_core.stages.common import StageStats

Source = Literal["bootstrap", "previous", "current"]
BOOTSTRAP: Source = "bootstrap"
PREVIOUS: Source = "previous"
CURRENT: Source = "current"

MODELS = ("actor", "critic")  # artifacts that are model directories (KFP Model); the rest are tables (Dataset)


@dataclass(frozen=True)
class Input:
    keyword: str  # the stage's keyword argument and its component's input
    artifact: str  # the artifact's name in the run folder
    source: Source
    read_when: str | None = None  # the condition under which the stage reads it; None: always

    @property
    def imported(self) -> bool:
        """True when the artifact comes from outside the iteration (a pipeline parameter in KFP)."""
        return self.source != CURRENT


@dataclass(frozen=True)
class Stage:
    name: str  # module ac2_core.stages.<name>, component components.<name>, display name, artifact folder
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]  # artifact names
    only_for: str | None = None  # the one algorithm the stage runs under; None: both
    models: bool = False  # loads models: takes ``store=`` from a runner that keeps them in memory
    logs: bool = False  # prints progress: takes ``log=``

    def runs_for(self, cfg: AC2Config) -> bool:
        return self.only_for in (None, cfg.algorithm)

    @property
    def out_keywords(self) -> tuple[str, ...]:
        return tuple(f"out_{name}" for name in self.outputs)

    def function(self) -> Callable[..., StageStats]:
        return importlib.import_module(f"ac2_core.stages.{self.name}").run


def _boot(name: str, keyword: str | None = None, read_when: str | None = None) -> Input:
    return Input(keyword or name, name, BOOTSTRAP, read_when)


def _prev(name: str, read_when: str | None = None) -> Input:
    return Input(name, name, PREVIOUS, read_when)


def _this(name: str) -> Input:
    return Input(name, name, CURRENT)


BOOTSTRAP_STAGE = Stage(
    "bootstrap",
    inputs=(),
    outputs=("problems", "actor", "critic", "replay", "scored_chunks", "readiness", "metrics"),
    logs=True,
)

ITERATION = (
    Stage(
        "sample_prefixes",
        inputs=(_boot("problems"), _prev("replay"), _prev("scored_chunks"), _prev("readiness"), _prev("actor")),
        outputs=("replay", "prefixes"),
        models=True,  # rollout.prefix_cut uncertain or entropy reads the actor
    ),
    Stage(
        "generate_chunks",
        inputs=(_boot("problems"), _this("prefixes"), _prev("actor")),
        outputs=("chunks",),
        models=True,
    ),
    Stage(
        "score_chunks",
        inputs=(
            _boot("problems"),
            _this("replay"),
            _this("prefixes"),
            _this("chunks"),
            _prev("actor"),
            _prev("critic", read_when="algorithm ac2"),
        ),
        outputs=("scored_chunks", "critic_pairs"),
        models=True,
    ),
    Stage(
        "check_readiness",
        inputs=(_prev("readiness"), _this("critic_pairs"), _this("scored_chunks")),
        outputs=("readiness", "advantages"),
    ),
    Stage(
        "update_actor",
        inputs=(
            _boot("problems"),
            _prev("actor"),
            _this("prefixes"),
            _this("chunks"),
            _this("advantages"),
            _boot("actor", keyword="reference", read_when="actor.kl_beta > 0"),
        ),
        outputs=("actor",),
        models=True,
    ),
    Stage(
        "update_critic",
        inputs=(_boot("problems"), _this("replay"), _prev("critic"), _this("critic_pairs"), _this("scored_chunks")),
        outputs=("critic",),
        only_for="ac2",
        models=True,
    ),
    Stage(
        "evaluate",
        inputs=(
            _boot("problems"),
            _this("actor"),
            _this("prefixes"),
            _this("chunks"),
            _this("scored_chunks"),
            _this("critic_pairs"),
            _this("readiness"),
            _this("critic"),
            _prev("metrics"),
        ),
        outputs=("samples", "metrics"),  # metrics last: it marks the iteration finished
        models=True,
    ),
)

STAGES = (BOOTSTRAP_STAGE.name, *(s.name for s in ITERATION))  # every stage name, in the order they run
ITERATION_STAGES = STAGES[1:]
BY_NAME = {s.name: s for s in (BOOTSTRAP_STAGE, *ITERATION)}
PRODUCER = {name: s for s in ITERATION for name in s.outputs}  # artifact -> the iteration stage that writes it


def stage(name: str) -> Stage:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown stage {name!r}; expected one of {', '.join(STAGES)}") from None


def optional(stage_: Stage, inp: Input) -> bool:
    """An input the stage may be given as None: read only under a condition, or written by a stage that may not run."""
    return inp.read_when is not None or (inp.source == CURRENT and PRODUCER[inp.artifact].only_for is not None)


def imports() -> tuple[Input, ...]:
    """The inputs from outside the iteration, one per keyword (the iteration pipeline's ``<keyword>_uri`` parameters)."""
    found: dict[str, Input] = {}
    for s in ITERATION:
        for inp in s.inputs:
            if inp.imported:
                other = found.setdefault(inp.keyword, inp)
                if (other.artifact, other.source) != (inp.artifact, inp.source):
                    raise ValueError(f"recipe: input {inp.keyword} names two artifacts ({other} and {inp})")
    return tuple(found.values())


Published = Callable[[int, str], str]  # (iteration, artifact) -> its URI; iteration 0 is the bootstrap


def input_uri(cfg: AC2Config, inp: Input, iteration: int, published: Published) -> str | None:
    """The URI behind ``inp`` in ``iteration`` (None: an input of this iteration that no stage writes)."""
    writer = PRODUCER.get(inp.artifact)
    match inp.source:
        case "bootstrap":
            return published(0, inp.artifact)
        case "previous":
            written = iteration > 1 and writer is not None and writer.runs_for(cfg)
            return published(iteration - 1 if written else 0, inp.artifact)
        case "current":
            return published(iteration, inp.artifact) if writer.runs_for(cfg) else None


@dataclass(frozen=True)
class StageCall:
    """One stage of one iteration with its keyword arguments: input and output URIs."""

    stage: str
    iteration: int
    kwargs: dict[str, str | None]

    @property
    def outputs(self) -> dict[str, str]:
        """Output artifact name -> URI."""
        return {k.removeprefix("out_"): v for k, v in self.kwargs.items() if k.startswith("out_")}

    def run(
        self,
        cfg: AC2Config,
        *,
        store: ModelStore | None = None,
        log: Callable[[str], None] | None = None,
        named: dict[str, str | None] | None = None,
    ):
        return run_stage(cfg, self.stage, iteration=self.iteration, kwargs=self.kwargs, store=store, log=log, named=named)


def calls(cfg: AC2Config, iteration: int, published: Published) -> list[StageCall]:
    """The stages that run in ``iteration`` (0: the bootstrap) under ``cfg``'s algorithm, in order,
    with the URIs ``published`` gives their inputs and outputs."""
    if iteration == 0:
        return [StageCall(BOOTSTRAP_STAGE.name, 0, _outputs(BOOTSTRAP_STAGE, 0, published))]
    return [
        StageCall(
            s.name,
            iteration,
            {inp.keyword: input_uri(cfg, inp, iteration, published) for inp in s.inputs} | _outputs(s, iteration, published),
        )
        for s in ITERATION
        if s.runs_for(cfg)
    ]


def _outputs(s: Stage, iteration: int, published: Published) -> dict[str, str]:
    return {keyword: published(iteration, name) for keyword, name in zip(s.out_keywords, s.outputs)}


def run_stage(
    cfg: AC2Config,
    name: str,
    *,
    iteration: int,
    kwargs: dict[str, str | None],
    store: ModelStore | None = None,
    log: Callable[[str], None] | None = None,
    named: dict[str, str | None] | None = None,
) -> StageStats:
    """Call stage ``name`` with its URIs: the one place a stage is called by name.

    ``store`` reaches the stages that load models, ``log`` the ones that print progress;
    without them a stage makes its own, as it does in a KFP task. Every artifact the stage
    publishes names its inputs (``storage.lineage``): by ``named``'s URI for each input
    keyword (the runners pass paths relative to the run folder), else by the URI read.
    """
    from ac2_core.storage.lineage import recording

    s = stage(name)
    extra: dict = {}
    if store is not None and s.models:
        extra["store"] = store
    if log is not None and s.logs:
        extra["log"] = log
    inputs = {
        inp.keyword: ((named or {}).get(inp.keyword) or kwargs[inp.keyword], kwargs[inp.keyword])
        for inp in s.inputs
        if kwargs.get(inp.keyword) is not None
    }
    with recording(iteration, inputs):
        return s.function()(cfg, iteration=iteration, **kwargs, **extra)
