"""The ``kfp`` runner on this machine: the real pipelines through ``kfp.local``.

    <out>/kfp/                     the kfp.local pipeline root: one folder per pipeline run
    <out>/kfp/runs.json            which run produced what (the bootstrap, then each iteration)
    <out>/kfp/logs/<run>.log       everything kfp.local and the tasks printed
    <out>/kfp/logs/taskhost.log    the warm task host's own lines (``pipelines.taskhost``)

One bootstrap run, then one iteration run per iteration, each importing the previous
run's outputs (``pipelines.driver``). A run folder that already holds finished
iterations is resumed after the last one. kfp.local ignores s3:// roots and
kfp-kubernetes settings, and deletes its workspace folder after each run (ac2 uses none).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import ac2_core
from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.runner.inprocess import HEADER, format_row
from pipelines import driver, taskhost

Log = Callable[[str], None]
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# a stage's own progress lines, as kfp.local streams a task's output (indented by 4)
PROGRESS = re.compile(r"^ {4}(warm start\b.*)$")
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
    progress lines (``PROGRESS``; the warm start runs for minutes) also to ``progress``,
    which prints to the stdout that was current before kfp's output was redirected here."""

    def __init__(self, file, progress: Log | None, console):
        self.file, self.progress, self.console, self.pending = file, progress, console, ""
        self.print = builtins.print  # kfp.local indents task output by patching print while it streams

    def write(self, text: str) -> int:
        self.file.write(text)
        if self.progress is not None:
            *lines, self.pending = (self.pending + text).split("\n")
            for line in lines:
                if m := PROGRESS.match(_ANSI.sub("", line)):
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


def run_pipeline(pipeline, arguments: dict, pipeline_root: Path, label: str, *, progress: Log | None = None) -> dict[str, str]:
    """Run one pipeline through kfp.local (output to ``logs/<label>.log``, the stages'
    progress lines also to ``progress``); returns its outputs."""
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
    run_root = Path(task.output.uri).parents[1]  # <pipeline_root>/<pipeline>-<timestamp>/<task>/<output>
    return driver.find_outputs(str(run_root))


def _prune(cfg: AC2Config, state: driver.RunState, it: int) -> None:
    """Drop checkpoints older than the newest ``run.keep_models`` iterations (tables are kept)."""
    old = state.iterations.get(it - cfg.run.keep_models, {})
    for name in ("actor", "critic"):
        if name in old:
            storage.remove(old[name])


def run(
    cfg: AC2Config, out_dir: str, *, log: Log = print, bootstrap_from: str | None = None, task_host: bool = True
) -> list[dict]:
    """Bootstrap (once, or adopt ``bootstrap_from``'s), then iteration runs up to
    ``cfg.run.iterations``; returns the metrics rows.

    With ``task_host`` (the default) the tasks hand their stage calls to a warm task host
    (``pipelines.taskhost``) instead of importing the stage code themselves; without it
    every task is a cold process, as on a cluster. The artifacts are the same either way.
    """
    root = Path(out_dir).resolve() / "kfp"
    with contextlib.ExitStack() as stack:
        stack.enter_context(storage.using(cfg.storage))
        if task_host:
            stack.enter_context(warm_task_host(root / "logs" / "taskhost.log"))
        return _run(cfg, root, out_dir, log, bootstrap_from)


def _run(cfg: AC2Config, root: Path, out_dir: str, log: Log, bootstrap_from: str | None) -> list[dict]:
    from pipelines.dag import bootstrap_pipeline, iteration_pipeline

    state = driver.RunState.load(root / "runs.json", cfg)
    _init(root)
    t_start = time.perf_counter()
    if state.bootstrap is None and bootstrap_from:
        state.bootstrap = driver.adopted_bootstrap(cfg, bootstrap_from)
        state.save()
        log(f"bootstrap adopted from {bootstrap_from}")
    if state.bootstrap is None:
        t0 = time.perf_counter()
        state.bootstrap = run_pipeline(bootstrap_pipeline, {"config_json": cfg.to_json()}, root, "bootstrap", progress=log)
        state.save()
        log(f"bootstrap: {time.perf_counter() - t0:.1f}s")
    done = state.done
    if done:
        log(f"resuming {out_dir} after iteration {done}")
    log(f"{cfg.algorithm} training (kfp.local): iterations {done + 1}..{cfg.run.iterations}")
    log(HEADER)
    if done == 0:
        log(format_row(storage.read_rows(state.bootstrap["metrics"], kind="metrics")[0]) + "   (initial policy)")
    for it in range(done + 1, cfg.run.iterations + 1):
        t0 = time.perf_counter()
        arguments = driver.iteration_arguments(cfg, state.bootstrap, state.iterations.get(it - 1), it)
        state.iterations[it] = run_pipeline(iteration_pipeline, arguments, root, f"iter-{it:04d}")
        state.save()
        metrics = storage.read_rows(state.iterations[it]["metrics"], kind="metrics")[-1]
        log(f"{format_row(metrics)}   {time.perf_counter() - t0:5.1f}s")
        _prune(cfg, state, it)
    rows = storage.read_rows(state.metrics_uri(), kind="metrics")
    log(f"done in {time.perf_counter() - t_start:.0f}s: {out_dir}")
    return rows
