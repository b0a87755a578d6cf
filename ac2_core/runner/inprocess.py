"""The ``inprocess`` runner: the seven stages chained for N iterations in one process.

It calls the same stage functions on the same artifact layout as the KFP pipeline, but
keeps the actor and critic in memory between stages (``ModelStore(keep_in_memory=True)``)
and pays the torch import once. Tests and benchmarks with many iterations use it.
A run folder that already holds finished iterations is resumed after the last one.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable

from ac2_core import storage
from ac2_core.config import AC2Config
from ac2_core.models.store import ModelStore
from ac2_core.runner.layout import RunLayout
from ac2_core.stages import check_readiness, evaluate, generate_chunks, sample_prefixes, score_chunks, update_actor, update_critic
from ac2_core.stages.bootstrap import EMPTY_STATE, bootstrap

Log = Callable[[str], None]


def stage_calls(cfg: AC2Config, layout: RunLayout, it: int) -> list[tuple[str, Callable, dict]]:
    """The iteration as (stage name, function, keyword arguments), in dependency order."""
    prev = lambda name: layout.output(it - 1, name)  # noqa: E731  (iteration 0 is the bootstrap)
    out = lambda name: layout.output(it, name)  # noqa: E731
    actor_in = prev("actor")
    critic_in = prev("critic") if cfg.uses_critic else None
    problems = layout.bootstrap("problems")
    calls = [
        (
            "sample_prefixes",
            sample_prefixes.run,
            dict(
                problems=problems,
                replay=prev("replay"),
                scored_chunks=prev("scored_chunks"),
                readiness=prev("readiness"),
                actor=actor_in,
                out_replay=out("replay"),
                out_prefixes=out("prefixes"),
            ),
        ),
        (
            "generate_chunks",
            generate_chunks.run,
            dict(problems=problems, prefixes=out("prefixes"), actor=actor_in, out_chunks=out("chunks")),
        ),
        (
            "score_chunks",
            score_chunks.run,
            dict(
                problems=problems,
                replay=out("replay"),
                prefixes=out("prefixes"),
                chunks=out("chunks"),
                actor=actor_in,
                critic=critic_in,
                out_scored_chunks=out("scored_chunks"),
                out_critic_pairs=out("critic_pairs"),
            ),
        ),
        (
            "check_readiness",
            check_readiness.run,
            dict(
                readiness=prev("readiness"),
                critic_pairs=out("critic_pairs"),
                scored_chunks=out("scored_chunks"),
                out_readiness=out("readiness"),
                out_advantages=out("advantages"),
            ),
        ),
        (
            "update_actor",
            update_actor.run,
            dict(
                problems=problems,
                actor=actor_in,
                prefixes=out("prefixes"),
                chunks=out("chunks"),
                advantages=out("advantages"),
                out_actor=out("actor"),
                reference=layout.bootstrap("actor") if cfg.actor.kl_beta > 0 else None,
            ),
        ),
    ]
    if cfg.uses_critic:
        calls.append(
            (
                "update_critic",
                update_critic.run,
                dict(
                    problems=problems,
                    replay=out("replay"),
                    critic=critic_in,
                    critic_pairs=out("critic_pairs"),
                    scored_chunks=out("scored_chunks"),
                    out_critic=out("critic"),
                ),
            )
        )
    calls.append(
        (
            "evaluate",
            evaluate.run,
            dict(
                problems=problems,
                actor=out("actor"),
                prefixes=out("prefixes"),
                chunks=out("chunks"),
                scored_chunks=out("scored_chunks"),
                critic_pairs=out("critic_pairs"),
                readiness=out("readiness"),
                critic=out("critic") if cfg.uses_critic else None,
                metrics=prev("metrics"),
                out_metrics=out("metrics"),
            ),
        )
    )
    return calls


def run_bootstrap(cfg: AC2Config, layout: RunLayout, log: Log = print) -> dict:
    return bootstrap(
        cfg,
        problems=layout.bootstrap("problems"),
        actor=layout.bootstrap("actor"),
        critic=layout.bootstrap("critic"),
        state={name: layout.bootstrap(name) for name in EMPTY_STATE},
        log=log,
    )


BOOTSTRAP_ARTIFACTS = ("problems", "actor", "critic", *EMPTY_STATE)


def adopt_bootstrap(cfg: AC2Config, layout: RunLayout, source_root: str) -> None:
    """Start a run from another run's bootstrap (same model, task, warm start and seed).

    Sharing one bootstrap is how AC2 and GRPO runs start from the same warm-started
    weights, and it saves the SFT warm start. A bootstrap made for other settings is refused.
    """
    source = RunLayout(source_root)
    for name in BOOTSTRAP_ARTIFACTS:
        made_for = storage.read_manifest(source.bootstrap(name)).config_hash
        if made_for != cfg.bootstrap_hash():
            raise ValueError(
                f"{source.bootstrap(name)} was bootstrapped with other model/task/warm_start/eval/seed settings;"
                " it cannot start this run"
            )
    for name in BOOTSTRAP_ARTIFACTS:
        _copy_artifact(source.bootstrap(name), layout.bootstrap(name))


def _copy_artifact(src: str, dst: str) -> None:
    """Republish a verified artifact under another URI, manifest fields unchanged."""
    m = storage.read_manifest(src)
    with storage.publish_dir(dst, kind=m.kind, stage=m.stage, config_hash=m.config_hash, rows=m.rows) as folder:
        for name in m.files:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(storage.read_file(src, name))


def call_stage(cfg: AC2Config, fn: Callable, it: int, kwargs: dict, store: ModelStore | None = None) -> dict:
    """Call one stage of ``stage_calls``; stages that load models get ``store``."""
    extra = {"store": store} if store is not None and "store" in inspect.signature(fn).parameters else {}
    return fn(cfg, iteration=it, **kwargs, **extra)


def run_iteration(cfg: AC2Config, layout: RunLayout, it: int, store: ModelStore) -> dict:
    """Every stage of iteration ``it``: their metrics by stage name, and ``seconds`` per stage."""
    results, times = {}, {}
    for name, fn, kwargs in stage_calls(cfg, layout, it):
        t0 = time.perf_counter()
        results[name] = call_stage(cfg, fn, it, kwargs, store)
        times[name] = time.perf_counter() - t0
    results["seconds"] = times
    return results


def completed_iterations(layout: RunLayout) -> int:
    """The last iteration whose metrics were published (0 if none)."""
    it = 0
    while storage.exists(layout.output(it + 1, "metrics")):
        it += 1
    return it


def prune(cfg: AC2Config, layout: RunLayout, it: int) -> None:
    """Drop checkpoints older than the newest ``run.keep_models`` iterations (tables are kept)."""
    old = it - cfg.run.keep_models
    if old >= 1:
        for name in ("actor", "critic"):
            storage.remove(layout.output(old, name))


def format_row(m: dict) -> str:
    val = "   -  " if m["val_score"] is None else f"{m['val_score']:.3f}"
    # failed judgements are masked, not scored; say so where the run is watched
    ungraded = (
        f"   ungraded: {m['ungraded_chunks']} chunks, {m['ungraded_val'] or 0} val"
        if m["ungraded_chunks"] or m["ungraded_val"]
        else ""
    )
    return (
        f"{m['iteration']:>5} {val:>6} {m['readiness_share']:>7.2f} {m['chunk_groups']:>6}/{m['full_groups']:<4}"
        f" {m['decode_tokens']:>9} {m['cum_decode_flops']:>12.3e}{ungraded}"
    )


HEADER = f"{'iter':>5} {'val':>6} {'ready':>7} {'chunk/full':>11} {'dec_tok':>9} {'cum_dec_FLOPs':>12}"


def run(cfg: AC2Config, out_dir: str, *, log: Log = print, bootstrap_from: str | None = None) -> list[dict]:
    """Bootstrap (once, or adopt ``bootstrap_from``'s), then run iterations up to
    ``cfg.run.iterations``; returns the metrics rows."""
    with storage.using(cfg.storage):  # endpoint, retries and artifact root of every stage below
        return _run(cfg, out_dir, log, bootstrap_from)


def _run(cfg: AC2Config, out_dir: str, log: Log, bootstrap_from: str | None) -> list[dict]:
    layout = RunLayout(out_dir)
    store = ModelStore(cfg, keep_in_memory=True)
    log(f"models on {store.device} (model.device {cfg.model.device})")  # and an absent cuda fails here, before any work
    t_start = time.perf_counter()
    if not storage.exists(layout.bootstrap("metrics")):
        if bootstrap_from:
            adopt_bootstrap(cfg, layout, bootstrap_from)
            log(f"bootstrap adopted from {bootstrap_from}")
        else:
            run_bootstrap(cfg, layout, log)
    done = completed_iterations(layout)
    if done:
        log(f"resuming {out_dir} after iteration {done}")
    log(f"{cfg.algorithm} training: iterations {done + 1}..{cfg.run.iterations}")
    log(HEADER)
    if done == 0:
        log(format_row(storage.read_rows(layout.bootstrap("metrics"), kind="metrics")[0]) + "   (initial policy)")
    for it in range(done + 1, cfg.run.iterations + 1):
        t0 = time.perf_counter()
        # update_actor and update_critic take last iteration's models out of the store, so
        # it holds only this iteration's checkpoints (and the reference policy, if any).
        run_iteration(cfg, layout, it, store)
        metrics = storage.read_rows(layout.output(it, "metrics"), kind="metrics")[-1]
        log(f"{format_row(metrics)}   {time.perf_counter() - t0:5.1f}s")
        prune(cfg, layout, it)
    rows = storage.read_rows(layout.output(cfg.run.iterations, "metrics"), kind="metrics")
    log(f"done in {time.perf_counter() - t_start:.0f}s: {out_dir}")
    return rows
