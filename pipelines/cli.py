"""The ``ac2`` command line.

    ac2 run      --config C [--iterations N] [--out DIR] [--runner kfp|inprocess] [--bootstrap-from RUN_DIR]
                 [--cold-tasks]
    ac2 validate --config C
    ac2 plan     --config C --gpus N [--arch CONFIG_JSON] [--prompt-tokens T] [--response-tokens T] [--ready-share S]
    ac2 compile  --config C --out FILE [--pipeline iteration|bootstrap]
    ac2 submit   --host URL --config C [--iterations N] [--experiment NAME] [--pipeline-root URI] [--dry-run]
    ac2 stage    NAME --config C --in KEY=URI ... --out KEY=URI ... [--iteration K]
    ac2 report   RUN_DIR

Every command that takes ``--config`` (and ``--set key=value`` overrides) validates it
before it starts anything. Errors print one line, ``ac2: <what is wrong>``, and exit
with one of these codes, every time (``EXIT_CODES``):

    0    done
    1    failed: a damaged or missing artifact, a bad data file, a stage or pipeline that failed
         (an unexpected error also exits 1, with its traceback)
    2    a bad command line or config
    3    the run folder is locked by another run (the message names it)
    130  interrupted (Ctrl-C)

The process ends with ``os._exit`` once the command's exit handlers have run: what
native libraries' threads would do while the interpreter tears down (torch's and Arrow's
thread pools; one of them aborted with ``terminate called without an active exception``
in some runs) can no longer change the exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import yaml

from ac2_core.config import AC2Config, ConfigError, load_config
from ac2_core.launch import LaunchError, exit_now
from ac2_core.runner.lock import RunFolderLocked
from ac2_core.runner.report import metrics_markdown
from ac2_core.stages.recipe import STAGES
from ac2_core.storage import ArtifactError
from pipelines.driver import PipelineFailed

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_LOCKED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_CODES = {
    EXIT_OK: "done",
    EXIT_FAILED: "failed: an artifact, a data file, a stage or a pipeline (the message names it)",
    EXIT_USAGE: "a bad command line or config",
    EXIT_LOCKED: "the run folder is locked by another run",
    EXIT_INTERRUPTED: "interrupted",
}


def _overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"--set {pair!r}: expected key=value")
        out[key] = yaml.safe_load(value)
    return out


def _config(args) -> AC2Config:
    overrides = _overrides(args.set or [])
    if getattr(args, "iterations", None) is not None:
        overrides["run.iterations"] = args.iterations
    return load_config(args.config, overrides)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def summary_table(rows: list[dict]) -> str:
    return metrics_markdown(rows)


def cmd_run(args) -> int:
    cfg = _config(args)
    out = args.out or f"runs/{cfg.run_id}"
    remote = "://" in out and not out.startswith("file://")
    if remote and args.runner == "kfp":
        raise ValueError(
            f"--out {out}: kfp.local keeps its pipeline root on local disk; use --runner inprocess for object storage"
        )
    _log(f"config {args.config} ok (hash {cfg.config_hash()[:12]}), algorithm {cfg.algorithm}, runner {args.runner}, out {out}")
    match args.runner:
        case "inprocess":
            from ac2_core.runner import inprocess

            rows = inprocess.run(cfg, out, log=_log, bootstrap_from=args.bootstrap_from)
        case "kfp":
            from pipelines import local

            rows = local.run(cfg, out, log=_log, bootstrap_from=args.bootstrap_from, task_host=not args.cold_tasks)
    table = summary_table(rows)
    print("\n" + table, flush=True)
    if not remote:
        Path(out, "summary.md").write_text(table + "\n")
    return 0


def cmd_validate(args) -> int:
    cfg = _config(args)
    report = {"ok": True, "algorithm": cfg.algorithm, "config_hash": cfg.config_hash()}
    if cfg.uses_critic:
        report.update(_saving_bound(cfg))
    print(json.dumps(report))
    return 0


def _saving_bound(cfg: AC2Config) -> dict:
    """The most decoding chunk mode can save per iteration, against full rollouts of the same problems."""
    from ac2_core.math.savings import chunk_saving_bound
    from ac2_core.tasks import built_in_answer_tokens

    answer = built_in_answer_tokens(cfg.task)  # the worked solutions' mean length; unknown for loaded data
    r = cfg.rollout
    bound = chunk_saving_bound(
        revisit_fraction=r.revisit_fraction,
        probe_fraction=r.probe_fraction,
        prefixes_per_problem=r.prefixes_per_problem,
        chunk_tokens=r.chunk_tokens,
        answer_tokens=answer or r.max_response_tokens,
    )
    # with max_response_tokens for the answer length the figure is an upper bound of the bound
    return {"chunk_saving_bound": round(bound, 4), "answer_tokens": answer or f"<= {r.max_response_tokens}"}


def cmd_plan(args) -> int:
    from ac2_core.plan import Architecture, Shape, make_plan, render

    cfg = _config(args)
    shape = Shape(prompt_tokens=args.prompt_tokens, response_tokens=args.response_tokens, ready_share=args.ready_share)
    plan = make_plan(cfg, gpus=args.gpus, arch=Architecture.of(cfg, args.arch), shape=shape)
    print(render(plan, cfg, shape), end="")
    return 0


def cmd_compile(args) -> int:
    from pipelines.compile import compile_pipeline

    cfg = _config(args)
    out = compile_pipeline(cfg, args.out, args.pipeline)
    _log(f"compiled the {args.pipeline} pipeline for {cfg.run_id} ({cfg.algorithm}, config {cfg.config_hash()[:12]}) to {out}")
    return 0


def cmd_submit(args) -> int:
    from pipelines.submit import submit

    cfg = _config(args)
    _log(f"config {args.config} ok (hash {cfg.config_hash()[:12]}), algorithm {cfg.algorithm}, host {args.host}")
    rows = submit(
        cfg,
        host=args.host,
        experiment=args.experiment,
        pipeline_root=args.pipeline_root,
        dry_run=args.dry_run,
        timeout_s=args.timeout,
        log=_log,
    )
    if rows:
        print("\n" + summary_table(rows), flush=True)
    return 0


def cmd_stage(args) -> int:
    from pipelines.stage import default_iteration, run_stage, stage_kwargs

    cfg = _config(args)
    kwargs = stage_kwargs(args.name, args.inputs or [], args.outputs or [])
    iteration = default_iteration(args.name) if args.iteration is None else args.iteration
    _log(f"stage {args.name}, iteration {iteration}, config {cfg.config_hash()[:12]}")
    stats = run_stage(cfg, args.name, iteration, kwargs)
    print(json.dumps(stats.as_dict(), default=str), flush=True)
    return 0


def cmd_report(args) -> int:
    from ac2_core.runner.report import write_report

    png, md = write_report(args.run_dir)
    _log(f"wrote {png} and {md}")
    return 0


STAGE_HELP = """Re-run one stage on the artifacts of any earlier run (either runner's run folder:
RUN/iter-0002/score_chunks/critic_pairs), exactly as its KFP component would. KEY is one of
the stage's inputs or outputs as the recipe (ac2_core/stages/recipe.py) names them: inputs
as written (--in actor=URI), outputs with or without their out_ prefix (--out chunks=URI or
--out out_chunks=URI). An input the stage may take as None (a grpo run's critic,
update_actor's reference when kl_beta is 0) may be left out. Seeds derive from
--iteration: pass the original one to reproduce an output exactly."""


def _with_config(sp) -> None:
    sp.add_argument("--config", required=True, help="YAML config (see pipelines/configs/)")
    sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. rollout.group_size=4")


def _add_run(sub) -> None:
    r = sub.add_parser("run", help="train on this machine: bootstrap, then N iterations")
    _with_config(r)
    r.add_argument("--iterations", type=int, help="override run.iterations")
    r.add_argument("--out", help="run folder (default runs/<run_id>); an existing run is resumed")
    r.add_argument(
        "--runner",
        choices=["kfp", "inprocess"],
        default="kfp",
        help="kfp: the real pipelines through kfp.local, one task per stage (default); "
        "inprocess: the same stages in one process, models kept in memory",
    )
    r.add_argument(
        "--bootstrap-from",
        metavar="RUN_DIR",
        help="start from another run folder's bootstrap (same model, task, warm start, eval and seed; either runner's"
        " folder) instead of making one",
    )
    r.add_argument(
        "--cold-tasks",
        action="store_true",
        help="kfp runner: every task imports the stage code itself, as on a cluster, instead of handing its stage"
        " call to a warm task host (same artifacts, about 3 s more per task)",
    )
    r.set_defaults(fn=cmd_run)


def _add_plan(sub) -> None:
    pl = sub.add_parser("plan", help="memory per GPU, FLOPs and time of one iteration on N GPUs per task (docs/scale.md)")
    _with_config(pl)
    pl.add_argument("--gpus", type=int, required=True, help="GPUs of each GPU stage's task")
    pl.add_argument("--arch", help="an HF config.json to size the model from (default: model.path's, or the tiny model's)")
    pl.add_argument("--prompt-tokens", type=int, default=512, help="tokens of a prompt (default 512)")
    pl.add_argument("--response-tokens", type=int, help="decoded tokens of a full answer (default: rollout.max_response_tokens)")
    pl.add_argument("--ready-share", type=float, default=0.0, help="share of problems in chunk mode (default 0: all full)")
    pl.set_defaults(fn=cmd_plan)


def _add_compile_and_submit(sub) -> None:
    c = sub.add_parser("compile", help="write a pipeline's KFP IR YAML (the config becomes config_json's default)")
    _with_config(c)
    c.add_argument("--out", required=True, help="YAML file to write")
    c.add_argument(
        "--pipeline", choices=["iteration", "bootstrap"], default="iteration", help="which pipeline (default iteration)"
    )
    c.set_defaults(fn=cmd_compile)

    s = sub.add_parser("submit", help="run on a KFP cluster: a bootstrap run, then one chained run per iteration")
    s.add_argument("--host", required=True, help="KFP API endpoint, e.g. http://localhost:8080")
    _with_config(s)
    s.add_argument("--iterations", type=int, help="override run.iterations")
    s.add_argument("--experiment", default="ac2", help="KFP experiment (default ac2)")
    s.add_argument("--pipeline-root", help="where runs write artifacts, e.g. s3://bucket/ac2 (required unless --dry-run)")
    s.add_argument("--timeout", type=float, default=24 * 3600, help="seconds to wait for each run (default 86400)")
    s.add_argument("--dry-run", action="store_true", help="compile and print the runs that would be submitted; send nothing")
    s.set_defaults(fn=cmd_submit)


def _add_stage(sub) -> None:
    st = sub.add_parser("stage", help="re-run one stage on existing artifacts", description=STAGE_HELP)
    st.add_argument("name", metavar="NAME", help=", ".join(STAGES))
    _with_config(st)
    st.add_argument("--in", dest="inputs", action="append", metavar="KEY=URI", help="an input artifact")
    st.add_argument("--out", dest="outputs", action="append", metavar="KEY=URI", help="where to write an output artifact")
    st.add_argument("--iteration", type=int, help="the iteration the stage runs as (default 1; 0 for the bootstrap)")
    st.set_defaults(fn=cmd_stage)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ac2", description="AC2: actor-critic with action chunking, as Kubeflow Pipelines")
    sub = p.add_subparsers(dest="command", required=True)
    _add_run(sub)
    v = sub.add_parser("validate", help="check a config and print its hash")
    _with_config(v)
    v.set_defaults(fn=cmd_validate)
    _add_plan(sub)
    _add_compile_and_submit(sub)
    _add_stage(sub)
    rp = sub.add_parser("report", help="learning_curve.png and report.md of a run folder (either runner)")
    rp.add_argument("run_dir", metavar="RUN_DIR")
    rp.set_defaults(fn=cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code (``EXIT_CODES``). Errors print one line on stderr."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage and the error (or the help)
        return EXIT_OK if e.code in (0, None) else EXIT_USAGE
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"ac2: {e}", file=sys.stderr)
        return EXIT_USAGE
    except RunFolderLocked as e:
        print(f"ac2: {e}", file=sys.stderr)
        return EXIT_LOCKED
    except (ArtifactError, ValueError, PipelineFailed, LaunchError) as e:  # DataError is a ValueError
        print(f"ac2: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("ac2: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception:  # noqa: BLE001 - a bug: the traceback, and still the documented code
        traceback.print_exc()
        return EXIT_FAILED


def console() -> None:
    """The ``ac2`` executable: ``main``, then the exit handlers, then ``os._exit`` with its code
    (``launch.exit_now``), so that no native thread torn down with the interpreter can turn it into an abort."""
    exit_now(main())


if __name__ == "__main__":
    console()
