"""The ``kfp`` runner on this machine: the real pipelines through ``kfp.local``.

One bootstrap run, then one iteration run per iteration, driven by the iteration loop
(``ac2_core.runner.loop``), each run importing the artifacts of the runs before it
(``pipelines.driver.pipeline_arguments``). kfp.local writes a run's outputs under its own
folder; once the run has finished, every ac2 artifact is moved to its name in the run
folder (``RunLayout``: the same layout as the inprocess runner's), so the next run, a
resumed run, ``--bootstrap-from``, ``ac2 stage`` and ``ac2 report`` find it there.

    <out>/bootstrap/..., <out>/iter-0001/...   the artifacts (``ac2_core.runner.layout``)
    <out>/kfp/                     the kfp.local pipeline root: one folder per pipeline run, with
                                   the tasks' KFP metadata and evaluate's Markdown report
    <out>/kfp/runs.json            which pipeline run wrote the bootstrap and each iteration
    <out>/kfp/logs/<label>.log     everything kfp.local and the tasks printed
    <out>/kfp/logs/taskhost.log    the warm task host's own lines (``pipelines.taskhost``)

kfp.local ignores s3:// roots and kfp-kubernetes settings, and deletes its workspace
folder after each run (ac2 uses none).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import re
import shutil
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import ac2_core
from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.runner import loop
from ac2_core.runner.layout import RunLayout
from ac2_core.runner.progress import PHASES
from ac2_core.stages import recipe
from ac2_core.threads import choose_threads
from pipelines import driver, taskhost

Log = loop.Log
# terminal control sequences (kfp.local colours its lines): never written to a log file
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# a stage's own progress lines (the bootstrap's phases), as kfp.local streams a task's output (indented by 4)
PROGRESS = re.compile(rf"^ {{4}}((?:{'|'.join(PHASES)})\b.*)$")
_ERROR_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(Error|Exception)):\s*(.+)$")


def _init(pipeline_root: Path) -> None:
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root), raise_on_error=True)


def _last_error(log_file: Path) -> str:
    """The last ``SomeError: message`` line a task printed (its exception), for a one-line report."""
    text = _ANSI.sub("", log_file.read_text(errors="replace"))
    lines = [f"{m.group(1).rsplit('.', 1)[-1]}: {m.group(3)}" for m in map(_ERROR_LINE.match, text.splitlines()) if m]
    return lines[-1] if lines else "see the log"


@contextlib.contextmanager
def _tasks_import_this_code():
    """Make kfp.local's task processes import the ac2 code this process runs.

    Each task is ``python -m kfp.dsl.executor_main`` in this process's working directory,
    which Python puts first on ``sys.path``: run from another checkout (or with ``PYTHONPATH``
    naming a worktree), the tasks would import that directory's ``ac2_core`` while the
    driver runs this one. So the tasks get this code's source root first on ``PYTHONPATH``
    and ``PYTHONSAFEPATH=1`` (no working directory on ``sys.path``). An installed (not
    source) ac2 needs neither, and the environment is left as it is.
    """
    root = Path(ac2_core.__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        yield
        return
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "PYTHONSAFEPATH")}
    rest = [p for p in (saved["PYTHONPATH"] or "").split(os.pathsep) if p and Path(p).resolve() != root]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *rest])
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def warm_task_host(log_file: Path) -> Iterator[str]:
    """A warm task host (``pipelines.taskhost.running``) that imports the code this process
    runs, as the tasks do; yields its address. The import path is set for its start only:
    it keeps it."""
    with contextlib.ExitStack() as stack:
        with _tasks_import_this_code():
            address = stack.enter_context(taskhost.running(log_file))
        yield address


class _LogSink(io.TextIOBase):
    """kfp.local's output during a pipeline run: all of it to the log file, and the stages'
    progress lines (``PROGRESS``; the warm start and the critic reading run for minutes) also
    to ``progress``, which prints to the stdout that was current before kfp's output was
    redirected here."""

    def __init__(self, file, progress: Log | None, console):
        self.file, self.progress, self.console, self.pending = file, progress, console, ""
        self.print = builtins.print  # kfp.local indents task output by patching print while it streams

    def write(self, text: str) -> int:
        plain = _ANSI.sub("", text)
        self.file.write(plain)
        if self.progress is not None:
            *lines, self.pending = (self.pending + plain).split("\n")
            for line in lines:
                if m := PROGRESS.match(line):
                    self.file.flush()
                    patched, builtins.print = builtins.print, self.print  # kfp prints from this same thread
                    try:
                        with contextlib.redirect_stdout(self.console):
                            self.progress(m.group(1))
                    finally:
                        builtins.print = patched
        return len(text)

    def flush(self) -> None:
        self.file.flush()


def run_pipeline(pipeline, arguments: dict, pipeline_root: Path, label: str, *, progress: Log | None = None) -> Path:
    """Run one pipeline through kfp.local (output to ``logs/<label>.log``, the stages'
    progress lines also to ``progress``); returns the pipeline run's folder."""
    log_file = pipeline_root / "logs" / f"{label}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(log_file, "w", buffering=1) as sink,
        contextlib.redirect_stdout(_LogSink(sink, progress, sys.stdout)),
        warnings.catch_warnings(),
        _tasks_import_this_code(),
    ):
        # the image and display names are for clusters; locally every task runs in this environment
        warnings.filterwarnings("ignore", message=".*non-Python base image.*")
        warnings.filterwarnings("ignore", message=".*have no effect in the current local runner.*")
        try:
            task = pipeline(**arguments)
        except RuntimeError as e:
            if "finished with status FAILURE" not in _ANSI.sub("", str(e)):
                raise
            failed = True
        else:
            failed = False
    if failed:
        raise driver.PipelineFailed(f"{label}: {_last_error(log_file)} (full log: {log_file})")
    return Path(task.output.uri).parents[1]  # <pipeline_root>/<pipeline>-<timestamp>/<task>/<output>


def keep_outputs(cfg: AC2Config, layout: RunLayout, iteration: int, run_root: Path) -> None:
    """Move the ac2 artifacts of a finished pipeline run to their names in the run folder.

    In the recipe's order, so the metrics table comes last: an iteration is finished once
    its metrics is there (``RunLayout.completed_iterations``), and an interrupted move is
    redone whole by the rerun of the iteration.
    """
    found = driver.find_outputs(str(run_root))
    expected = [name for call in recipe.calls(cfg, iteration, layout.output) for name in call.outputs]
    missing = [name for name in expected if name not in found]
    if missing:
        raise driver.PipelineFailed(f"{run_root}: the run published no {', '.join(missing)}")
    for name in expected:
        storage.move(found[name], layout.output(iteration, name))


@dataclass
class KfpRuns:
    """``kfp/runs.json``: the run folder's algorithm, and the kfp.local pipeline run (a folder
    of ``kfp/``) that wrote the bootstrap and each iteration, by label (``bootstrap``,
    ``iter-0001``, ...; the log of each is ``kfp/logs/<label>.log``)."""

    path: Path
    algorithm: str
    runs: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, cfg: AC2Config, layout: RunLayout) -> KfpRuns:
        """The saved record, or a fresh one; refuses a run folder of the other algorithm."""
        if not path.exists():
            return cls(path, cfg.algorithm)
        body = json.loads(path.read_text())
        if body["algorithm"] != cfg.algorithm:
            raise ValueError(f"{path}: this run folder holds a {body['algorithm']} run; the config says {cfg.algorithm}")
        if "iterations" in body:  # written before both runners shared the run folder's layout
            record = cls(path, body["algorithm"], _moved_to_layout(body, path.parent, layout))
            record.save()
            return record
        return cls(path, body["algorithm"], body["runs"])

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"algorithm": self.algorithm, "runs": self.runs}, indent=1, sort_keys=True) + "\n")
        tmp.replace(self.path)


def _moved_to_layout(body: dict, root: Path, layout: RunLayout) -> dict[str, str]:
    """The artifacts an older ``runs.json`` names (by URI, under kfp.local's folders) at their
    names in the run folder: moved from this run's ``kfp/``, copied from elsewhere (an adopted
    bootstrap stays with the run that made it); pruned checkpoints are skipped."""
    runs = {}
    parts = [("bootstrap", 0, body.get("bootstrap") or {})]
    parts += [(f"iter-{int(k):04d}", int(k), v) for k, v in sorted(body["iterations"].items(), key=lambda kv: int(kv[0]))]
    for label, iteration, outputs in parts:
        for name, uri in sorted(outputs.items(), key=lambda kv: kv[0] == "metrics"):  # metrics last
            if storage.exists(uri):
                mine = Path(uri).resolve().is_relative_to(root.resolve())
                (storage.move if mine else storage.copy)(uri, layout.output(iteration, name))
                if mine:
                    runs[label] = Path(uri).resolve().relative_to(root.resolve()).parts[0]
    return runs


class KfpLocal:
    """``loop.Runner`` through kfp.local: a pipeline run for the bootstrap and for each iteration."""

    label = "kfp.local"

    def __init__(self, cfg: AC2Config, root: Path, layout: RunLayout, log: Log = print):
        self.root, self.log = root, log
        self.record = KfpRuns.load(root / "runs.json", cfg, layout)
        self._remove_unfinished()
        _init(root)

    def _remove_unfinished(self) -> None:
        """Remove the pipeline runs that ``runs.json`` does not name: runs killed (or failed) before
        they finished, whose outputs (checkpoints among them) were never moved to the run folder."""
        if not self.root.is_dir():
            return
        named = set(self.record.runs.values())
        for entry in sorted(self.root.iterdir()):
            if entry.is_dir() and entry.name != "logs" and entry.name not in named:
                shutil.rmtree(entry, ignore_errors=True)
                self.log(f"removed {entry}: a pipeline run that did not finish")

    def bootstrap(self, cfg: AC2Config, layout: RunLayout, log: Log) -> None:
        from pipelines.dag import bootstrap_pipeline

        self._run(cfg, layout, 0, bootstrap_pipeline, {"config_json": cfg.to_json()}, "bootstrap", progress=log)

    def iteration(self, cfg: AC2Config, layout: RunLayout, it: int) -> dict[str, float]:
        from pipelines.dag import iteration_pipeline

        arguments = driver.pipeline_arguments(cfg, it, layout.output)
        run_root = self._run(cfg, layout, it, iteration_pipeline, arguments, f"iter-{it:04d}")
        return stage_seconds(run_root)

    def _run(self, cfg, layout, iteration, pipeline, arguments, label: str, progress: Log | None = None) -> Path:
        run_root = run_pipeline(pipeline, arguments, self.root, label, progress=progress)
        earlier = self.record.runs.get(label)
        # named before its outputs move, so that a run killed while they move leaves no unnamed folder
        self.record.runs[label] = run_root.name
        self.record.save()
        keep_outputs(cfg, layout, iteration, run_root)
        if earlier not in (None, run_root.name):  # an attempt at this label that did not finish
            shutil.rmtree(self.root / earlier, ignore_errors=True)
        return run_root


def stage_seconds(run_root: Path) -> dict[str, float]:
    """Each stage's wall seconds in a finished kfp.local pipeline run, as its component recorded
    them in its outputs' KFP metadata (``stage_seconds``, in each task's ``executor_output.json``)."""
    seconds = {}
    for path in sorted(run_root.glob("*/executor_output.json")):
        for output in json.loads(path.read_text()).get("artifacts", {}).values():
            for artifact in output.get("artifacts", []):
                meta = artifact.get("metadata", {})
                if "stage" in meta and "stage_seconds" in meta:
                    seconds[meta["stage"]] = float(meta["stage_seconds"])
    return seconds


def run(
    cfg: AC2Config,
    out_dir: str,
    *,
    log: Log = print,
    bootstrap_from: str | None = None,
    task_host: bool = True,
    resume: str = "auto",
    tty: bool | None = None,
) -> list[dict]:
    """``ac2 run --runner kfp``: ``loop.run`` with each bootstrap and iteration a kfp.local
    pipeline run; returns the metrics rows.

    With ``task_host`` (the default) the tasks hand their stage calls to a warm task host
    (``pipelines.taskhost``) instead of importing the stage code themselves; without it
    every task is a cold process, as on a cluster. The artifacts are the same either way.
    """
    root = Path(out_dir).resolve() / "kfp"
    log(f"tasks run on this machine with {choose_threads(cfg.model.threads)}")

    @contextlib.contextmanager
    def open_runner() -> Iterator[KfpLocal]:
        # entered by the loop once the config and inputs are checked and the folder is locked:
        # a run folder that refuses this run gets no task host and no kfp.local files
        with contextlib.ExitStack() as stack:
            if task_host:
                stack.enter_context(warm_task_host(root / "logs" / "taskhost.log"))
            yield KfpLocal(cfg, root, RunLayout(out_dir), log)

    with storage.using(cfg.storage):
        return loop.run(cfg, out_dir, open_runner, log=log, bootstrap_from=bootstrap_from, resume=resume, tty=tty)
