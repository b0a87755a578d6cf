"""Experiment tracking through the libraries users already use: TensorBoard and MLflow.

The iteration loop hands every finished iteration's metrics row (and its seconds per
stage) to ``Trackers``, which logs each scalar at step = iteration:

- TensorBoard (``tracking.tensorboard``, on by default): event files in ``<run>/tensorboard``,
  through ``torch.utils.tensorboard``. ``tensorboard --logdir runs`` shows every run beside
  the others. A run folder on object storage gets its event files uploaded after each
  iteration (they are written locally first, in a temporary folder).
- MLflow (``tracking.mlflow_uri``): one MLflow run per run folder, in the experiment
  ``tracking.mlflow_experiment``, with the resolved config as its parameters; a resumed run
  goes on logging into the same MLflow run (its id is kept in ``<run>/tracking.json``).
  ``sqlite:///mlflow.db`` is a local store that needs no server (MLflow's own default);
  ``file:./mlruns``, MLflow's older file store, works too.

KFP's own UI shows the same scalars: ``evaluate``'s component logs them to a
``system.Metrics`` artifact (``components.io.log_figures``). Wall-clock seconds are logged
here and never in an artifact, which stays byte-identical on a rerun.

A Ctrl-C that lands while a tracker writes is raised once the write is done
(``_interrupts_deferred``): TensorBoard's writer hands records to its own thread through a
queue, and an interrupt between the queue's two bookkeeping steps kills that thread with a
traceback. A second Ctrl-C is raised at once, so a hung tracker (an unreachable MLflow
server) never holds the run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from ac2_core import storage
from ac2_core.config import AC2Config, ConfigError
from ac2_core.runner.report import SCALARS, tokens_saved
from ac2_core.storage.uris import target

TENSORBOARD = "tensorboard"
RECORD = "tracking.json"


def scalars(row: dict, seconds: dict[str, float] | None = None) -> dict[str, float]:
    """The row's numbers under their tracking names (``SCALARS``), plus ``time/<stage>`` seconds."""
    out = {}
    row = {**row, "tokens_saved": tokens_saved(row)}
    for column, tag in SCALARS.items():
        value = row.get(column)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[tag] = float(value)
    for stage, s in (seconds or {}).items():
        out[f"time/{stage}_s"] = float(s)
    return out


class TensorBoard:
    def __init__(self, root: str):
        from torch.utils.tensorboard import SummaryWriter

        self.remote = storage.join(root, TENSORBOARD)
        self.tmp = None if target(root).local else tempfile.mkdtemp(prefix="ac2-tensorboard-")
        self.dir = Path(self.tmp or self.remote)
        self.writer = SummaryWriter(log_dir=str(self.dir))

    def log(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()
        if self.tmp is not None:
            for f in sorted(self.dir.iterdir()):
                storage.put_file(f, storage.join(self.remote, f.name))

    def close(self) -> None:
        self.writer.close()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)


class MLflow:
    def __init__(self, cfg: AC2Config, root: str):
        t = cfg.tracking
        if t.mlflow_uri.startswith("file:") or "://" not in t.mlflow_uri:
            # MLflow 3 refuses its file store unless asked; the config asked for it by naming it
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=t.mlflow_uri)
        self.record_uri = storage.join(root, RECORD)
        known = json.loads(storage.read_text(self.record_uri) or "{}")
        run_id = known.get("mlflow_run_id")
        if run_id is None or known.get("mlflow_uri") != t.mlflow_uri:
            experiment = self.client.get_experiment_by_name(t.mlflow_experiment)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(t.mlflow_experiment)
            tags = {"algorithm": cfg.algorithm, "config_hash": cfg.config_hash(), "run_folder": root}
            run_id = self.client.create_run(experiment_id, run_name=cfg.run_id, tags=tags).info.run_id
            self._params(run_id, cfg)
            storage.write_text(self.record_uri, json.dumps({"mlflow_uri": t.mlflow_uri, "mlflow_run_id": run_id}) + "\n")
        self.run_id = run_id

    def _params(self, run_id: str, cfg: AC2Config) -> None:
        from mlflow.entities import Param

        flat: dict[str, str] = {}

        def walk(node, prefix=""):
            for k, v in node.items():
                if isinstance(v, dict):
                    walk(v, f"{prefix}{k}.")
                else:
                    flat[f"{prefix}{k}"] = json.dumps(v)[:500]

        walk(cfg.model_dump(mode="json", exclude={"cluster", "storage", "tracking"}))
        params = [Param(k, v) for k, v in sorted(flat.items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters a batch
            self.client.log_batch(run_id, params=params[i : i + 100])

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(tag, value, now, step) for tag, value in sorted(values.items())]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class Trackers:
    """Every tracker the config asks for, opened on a run folder."""

    def __init__(self, cfg: AC2Config, root: str):
        self.sinks: list = []
        # both imports first: a missing package stops the run before anything is written
        if cfg.tracking.tensorboard:
            _need("torch.utils.tensorboard", "tracking.tensorboard needs the tensorboard package, or set it to false")
        if cfg.tracking.mlflow_uri:
            _need("mlflow", "tracking.mlflow_uri needs MLflow's client: pip install 'ac2[mlflow]'")
        if cfg.tracking.tensorboard:
            self.sinks.append(TensorBoard(root))
        if cfg.tracking.mlflow_uri:
            self.sinks.append(MLflow(cfg, root))

    def log(self, row: dict, seconds: dict[str, float] | None = None) -> None:
        values = scalars(row, seconds)
        with _interrupts_deferred():
            for sink in self.sinks:
                sink.log(int(row["iteration"]), values)

    def close(self) -> None:
        with _interrupts_deferred():
            for sink in self.sinks:
                sink.close()


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """A Ctrl-C inside the block is raised as KeyboardInterrupt when the block ends; a second one at once.

    Only where Python's own SIGINT handler is installed, in the main thread (the only one that
    may change it); elsewhere the block runs as it is.
    """
    python_handles_it = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if threading.current_thread() is not threading.main_thread() or not python_handles_it:
        yield
        return
    caught: list[int] = []

    def hold(signum, frame):
        if caught:
            raise KeyboardInterrupt
        caught.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if caught:
        raise KeyboardInterrupt


def _need(module: str, message: str) -> None:
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(message) from None
