"""``ac2 submit``: the chained runs on a Kubeflow Pipelines cluster.

One bootstrap run (``ac2-<run_id>-bootstrap``), then one run per iteration
(``ac2-<run_id>-iter-<k>``), each submitted once the one before it has succeeded and
importing its outputs. Caching is off for every run: the stages are stochastic.

This machine must be able to read the pipeline root (s3fs credentials in the usual
environment variables): KFP's REST API names a finished run's tasks and their MLMD
artifact ids but not the artifacts' URIs, so ``cluster_outputs`` finds them under the
run's root. No credential is ever put into a pipeline spec or its arguments.
"""

from __future__ import annotations

import json
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.runner.report import HEADER, format_row
from pipelines import driver
from pipelines.compile import PIPELINES, compile_pipeline
from pipelines.dag import BOOTSTRAP_PIPELINE, ITERATION_PIPELINE

Log = Callable[[str], None]


def run_name(cfg: AC2Config, iteration: int | None) -> str:
    return f"ac2-{cfg.run_id}-bootstrap" if iteration is None else f"ac2-{cfg.run_id}-iter-{iteration}"


def cluster_outputs(run, pipeline_root: str, pipeline_name: str) -> dict[str, str]:
    """Output URIs of a finished cluster run (a ``V2beta1Run`` from the API), by output name.

    The API says whether the run succeeded and which tasks failed; the URIs are found under
    ``<pipeline_root>/<pipeline_name>/<run_id>/``, where KFP's launcher writes every output.
    """
    state = (run.state or "UNKNOWN").upper()
    if state != "SUCCEEDED":
        details = run.run_details.task_details if run.run_details and run.run_details.task_details else []
        failed = sorted({t.display_name for t in details if (t.state or "").upper() == "FAILED"})
        why = f"; failed: {', '.join(failed)}" if failed else ""
        message = f" ({run.error.message})" if run.error and run.error.message else ""
        raise driver.PipelineFailed(f"run {run.display_name} ({run.run_id}) ended {state}{why}{message}")
    return driver.find_outputs(f"{pipeline_root.rstrip('/')}/{pipeline_name}/{run.run_id}")


def _run_and_wait(
    client, package: Path, name: str, arguments: dict, *, experiment: str, pipeline_root: str, timeout_s: float, poll_s: float
):
    result = client.create_run_from_pipeline_package(
        str(package),
        arguments=arguments,
        run_name=name,
        experiment_name=experiment,
        pipeline_root=pipeline_root,
        enable_caching=False,
    )
    return client.wait_for_run_completion(result.run_id, timeout=timeout_s, sleep_duration=poll_s)


def _plan(cfg: AC2Config, experiment: str, pipeline_root: str | None) -> list[dict]:
    """What would be submitted; outputs of earlier runs appear as ``<run name:output>``."""
    shown = dict(experiment=experiment, pipeline_root=pipeline_root, enable_caching=False)
    config = f"<config {cfg.config_hash()[:12]}>"
    runs = [dict(run_name=run_name(cfg, None), pipeline=BOOTSTRAP_PIPELINE, **shown, arguments={"config_json": config})]
    placeholder = lambda k, name: f"<{run_name(cfg, k or None)}:{name}>"  # noqa: E731
    for it in range(1, cfg.run.iterations + 1):
        arguments = {**driver.pipeline_arguments(cfg, it, placeholder), "config_json": config}
        runs.append(dict(run_name=run_name(cfg, it), pipeline=ITERATION_PIPELINE, **shown, arguments=arguments))
    return runs


def submit(
    cfg: AC2Config,
    *,
    host: str,
    experiment: str,
    pipeline_root: str | None,
    dry_run: bool = False,
    timeout_s: float = 24 * 3600,
    poll_s: float = 10,
    log: Log = print,
) -> list[dict]:
    """Submit and chain the runs (or, with ``dry_run``, print them); returns the metrics rows."""
    with tempfile.TemporaryDirectory(prefix="ac2-submit-") as tmp:
        packages = {which: compile_pipeline(cfg, Path(tmp, f"{which}.yaml"), which) for which in PIPELINES}
        if dry_run:
            for planned in _plan(cfg, experiment, pipeline_root):
                print(json.dumps(planned, sort_keys=True), flush=True)
            log(f"dry run: both pipelines compile; {cfg.run.iterations + 1} runs would be submitted to {host}; nothing was sent")
            return []
        if not pipeline_root:
            raise ValueError("--pipeline-root is required to chain runs: each run's outputs are found under it")
        with storage.using(cfg.storage):
            return _submit(
                cfg,
                packages,
                host=host,
                experiment=experiment,
                pipeline_root=pipeline_root,
                timeout_s=timeout_s,
                poll_s=poll_s,
                log=log,
            )


def _submit(
    cfg: AC2Config,
    packages: dict[str, Path],
    *,
    host: str,
    experiment: str,
    pipeline_root: str,
    timeout_s: float,
    poll_s: float,
    log: Log,
) -> list[dict]:
    import kfp

    with warnings.catch_warnings():  # the client warns that it needs KFP >= 2.0.0-beta.2, always
        warnings.simplefilter("ignore", FutureWarning)
        client = kfp.Client(host=host)
    wait = dict(experiment=experiment, pipeline_root=pipeline_root, timeout_s=timeout_s, poll_s=poll_s)
    t0 = time.perf_counter()
    boot = _run_and_wait(client, packages["bootstrap"], run_name(cfg, None), {"config_json": cfg.to_json()}, **wait)
    published = {0: cluster_outputs(boot, pipeline_root, BOOTSTRAP_PIPELINE)}  # iteration -> artifact -> URI
    log(f"bootstrap: {time.perf_counter() - t0:.1f}s ({boot.run_id})")
    log(HEADER)
    for it in range(1, cfg.run.iterations + 1):
        t0 = time.perf_counter()
        arguments = driver.pipeline_arguments(cfg, it, lambda k, name: published[k][name])
        finished = _run_and_wait(client, packages["iteration"], run_name(cfg, it), arguments, **wait)
        published[it] = cluster_outputs(finished, pipeline_root, ITERATION_PIPELINE)
        metrics = storage.read_rows(published[it]["metrics"], kind="metrics")
        log(f"{format_row(metrics[-1])}   {time.perf_counter() - t0:5.1f}s")
    return metrics
