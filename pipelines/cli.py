"""The ``ac2`` command line.

    ac2 run      --config C [--iterations N] [--out DIR] [--runner kfp|inprocess] [--bootstrap-from RUN_DIR]
                 [--cold-tasks] [--resume auto|never]
    ac2 validate --config C
    ac2 plan     --config C --gpus N [--arch CONFIG_JSON] [--prompt-tokens T] [--response-tokens T] [--ready-share S]
    ac2 compile  --config C --out FILE [--pipeline iteration|bootstrap]
    ac2 submit   --host URL --config C [--iterations N] [--experiment NAME] [--pipeline-root URI] [--dry-run]
    ac2 stage    NAME --config C --in KEY=URI ... --out KEY=URI ... [--iteration K]
    ac2 report   RUN_DIR [RUN_DIR ...] [--out DIR]
    ac2 lineage  ARTIFACT_URI [--depth N]

Every command that takes ``--config`` (and ``--set key=value`` overrides) validates it
before it starts anything. Errors print one line, ``ac2: <what is wrong>``, and exit with
one of the codes ``pipelines.exits`` documents, every time:

    0    done
    1    failed: a damaged or missing artifact, a bad data file, a stage, pipeline or
         launched process that failed; an unexpected error (a bug) too, its one line saying
         that ``ac2 --debug ...`` prints the traceback
    2    a bad command line or config (a misspelt flag or command gets a "did you mean")
    3    the run folder refuses this run: another run holds its lock (the message names it),
         or it holds another run (another config, or ``--resume never``)
    130  interrupted (Ctrl-C)

The process ends with ``os._exit`` once the command's exit handlers have run: what
native libraries' threads would do while the interpreter tears down (torch's and Arrow's
thread pools; one of them aborted with ``terminate called without an active exception``
in some runs) can no longer change the exit code.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import time
import traceback
from importlib.metadata import PackageNotFoundError, version

import yaml

from ac2_core.config import AC2Config, ConfigError, load_config
from ac2_core.launch import exit_now
from ac2_core.runner.report import metrics_markdown
from ac2_core.stages.recipe import STAGES
from pipelines import exits


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


def summary_table(rows: list[dict], seconds: dict | None = None) -> str:
    return metrics_markdown(rows, seconds)


def cmd_run(args) -> int:
    cfg = _config(args)
    out = args.out or f"runs/{cfg.run_id}"
    remote = "://" in out and not out.startswith("file://")
    if remote and args.runner == "kfp":
        raise ValueError(
            f"--out {out}: kfp.local keeps its pipeline root on local disk; use --runner inprocess for object storage"
        )
    _log(f"config {args.config} ok (hash {cfg.config_hash()[:12]}), algorithm {cfg.algorithm}, runner {args.runner}, out {out}")
    options = dict(log=_log, bootstrap_from=args.bootstrap_from, resume=args.resume)
    from ac2_core import storage
    from ac2_core.runner.timings import read_timings

    with storage.using(cfg.storage):  # the resume hint and the timings read the run folder too
        try:
            match args.runner:
                case "inprocess":
                    from ac2_core.runner import inprocess

                    rows = inprocess.run(cfg, out, **options)
                case "kfp":
                    from pipelines import local

                    rows = local.run(cfg, out, **options, task_host=not args.cold_tasks)
        except KeyboardInterrupt:
            raise Interrupted(_resume_hint(out)) from None
        print("\n" + summary_table(rows, read_timings(out)), flush=True)  # loop.run wrote it to <out>/summary.md
    return 0


class Interrupted(Exception):
    """Ctrl-C, with the one line to print."""


def _resume_hint(out: str) -> str:
    from ac2_core.runner.layout import RunLayout

    try:
        done = RunLayout(out).completed_iterations()
    except Exception:  # noqa: BLE001  (a hint only: the folder may be unreadable mid-write)
        done = None
    after = f" after iteration {done}" if done else ""
    return f"interrupted; run the same command again to resume {out}{after}"


def cmd_validate(args) -> int:
    cfg = _config(args)
    report = {"ok": True, "algorithm": cfg.algorithm, "config_hash": cfg.config_hash(), "run_hash": cfg.run_hash()}
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
        full_group_ratio=cfg.full_group_samples / r.group_size,
        smaller_for_revisits_only=cfg.smaller_groups_for_revisits_only,
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
    from ac2_core import storage
    from ac2_core.runner.report import write_report

    with storage.using(load_config(args.config).storage) if args.config else _nothing():
        png, md = write_report(args.run_dirs, args.out)
    _log(f"wrote {png} and {md}")
    return 0


def cmd_lineage(args) -> int:
    from ac2_core import storage
    from ac2_core.runner.lineage import chain

    with storage.using(load_config(args.config).storage) if args.config else _nothing():
        lines = chain(args.artifact, depth=args.depth)
    print("\n".join(lines), flush=True)
    return 0


def _nothing():
    import contextlib

    return contextlib.nullcontext()


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


RUN_HELP = """Train on this machine: the bootstrap (warm start included), then run.iterations RL
iterations, with a progress display (elapsed time and ETA) and a row per iteration. The run
folder records its resolved config (<out>/config.yaml) at first start; run again on the same
folder, it resumes after the last finished iteration, and stops at once (exit 3), listing the
fields, if the config differs from the recorded one (only run.iterations, run.keep_models,
run.keep_best, tracking, storage, cluster, model.device and the process counts may). Scalars
go to TensorBoard (<out>/tensorboard) and, with tracking.mlflow_uri, to MLflow."""


def _add_run(sub) -> None:
    r = sub.add_parser("run", help="train on this machine: bootstrap, then N iterations", description=RUN_HELP)
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
    r.add_argument(
        "--resume",
        choices=["auto", "never"],
        default="auto",
        help="auto: continue a run folder that holds a run of the same config (default); never: refuse a folder that"
        " holds any of a run",
    )
    r.set_defaults(fn=cmd_run)


def _positive_int(text: str) -> int:
    """A flag's whole number of at least 1; argparse names the flag in the error (exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, found {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, found {value}")
    return value


def _share(text: str) -> float:
    """A flag's share, from 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, found {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, found {value}")
    return value


def _add_plan(sub) -> None:
    pl = sub.add_parser(
        "plan",
        help="memory per GPU, FLOPs and time of one iteration on N GPUs per task (docs/scale.md)",
        description="Size a config for N GPUs per task: the memory per GPU of each GPU stage, the FLOPs of one"
        " iteration and its time at stated H200 rates (docs/scale.md explains the numbers).",
    )
    _with_config(pl)
    pl.add_argument("--gpus", type=_positive_int, required=True, help="GPUs of each GPU stage's task")
    pl.add_argument("--arch", help="an HF config.json to size the model from (default: model.path's, or the tiny model's)")
    pl.add_argument("--prompt-tokens", type=_positive_int, default=512, help="tokens of a prompt (default 512)")
    pl.add_argument(
        "--response-tokens", type=_positive_int, help="decoded tokens of a full answer (default: rollout.max_response_tokens)"
    )
    pl.add_argument("--ready-share", type=_share, default=0.0, help="share of problems in chunk mode (default 0: all full)")
    pl.set_defaults(fn=cmd_plan)


def _add_compile_and_submit(sub) -> None:
    c = sub.add_parser(
        "compile",
        help="write a pipeline's KFP IR YAML (the config becomes config_json's default)",
        description="Compile the bootstrap or the iteration pipeline, built from the recipe, to KFP's IR YAML,"
        " with the validated config as the default of its config_json parameter.",
    )
    _with_config(c)
    c.add_argument("--out", required=True, help="YAML file to write")
    c.add_argument(
        "--pipeline", choices=["iteration", "bootstrap"], default="iteration", help="which pipeline (default iteration)"
    )
    c.set_defaults(fn=cmd_compile)

    s = sub.add_parser(
        "submit",
        help="run on a KFP cluster: a bootstrap run, then one chained run per iteration",
        description="Submit to a Kubeflow Pipelines cluster: compile both pipelines, submit the bootstrap run, then"
        " one run per iteration, each importing the outputs of the one before from the pipeline root (s3://...)."
        " Prints a row per finished iteration.",
    )
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


REPORT_HELP = """Write learning_curve.png (validation score against iterations and against cumulative
decode FLOPs, one line per run, with a legend) and report.md (each run's metrics table, with
seconds per iteration, and its latest decoded samples). With one run folder they are written
into it; with several, into --out. Run folders of either runner, local or s3://."""

LINEAGE_HELP = """Print the chain of artifacts that made ARTIFACT_URI, back to the bootstrap, from the
manifests: each artifact's kind, stage, iteration, content and config hashes, and each input
it read with the content hash it had then, and whether the artifact there now is the same one,
another one, or gone (a pruned checkpoint)."""


class Parser(argparse.ArgumentParser):
    """argparse with errors on one line (exit 2) and a "did you mean" for misspelt flags and commands."""

    def error(self, message: str):
        hint = _did_you_mean(self, message)
        self.exit(exits.USAGE, f"{self.prog}: error: {message}{hint} (see {self.prog} --help)\n")


def _did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    if m := re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message):
        choices = re.findall(r"'([^']*)'", m.group(2)) or [c.strip() for c in m.group(2).split(",")]
        close = difflib.get_close_matches(m.group(1), choices, n=1, cutoff=0.5)
        return f"; did you mean {close[0]!r}?" if close else ""
    if m := re.search(r"unrecognized arguments: (.*)", message):
        flags = [opt for action in parser._actions for opt in action.option_strings]
        for action in parser._actions:  # the chosen command's flags too (argparse reports extras on the top parser)
            if isinstance(action, argparse._SubParsersAction):
                chosen = next((a for a in getattr(parser, "_argv_seen", []) if a in action.choices), None)
                if chosen:
                    flags += [opt for a in action.choices[chosen]._actions for opt in a.option_strings]
        hints = []
        for token in m.group(1).split():
            close = difflib.get_close_matches(token.split("=")[0], flags, n=1, cutoff=0.6) if token.startswith("-") else []
            if close:
                hints.append(f"{token} -> {close[0]}")
        return f"; did you mean {', '.join(hints)}?" if hints else ""
    return ""


def _version() -> str:
    try:
        return version("ac2")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="ac2", description="AC2: actor-critic with action chunking, as Kubeflow Pipelines")
    p._argv_seen = []
    p.add_argument("--version", action="version", version=f"ac2 {_version()}")
    p.add_argument("--debug", action="store_true", help="show the traceback of an unexpected error")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    _add_run(sub)
    v = sub.add_parser(
        "validate",
        help="check a config and print its hash",
        description="Validate a config (with its --set overrides) and print its algorithm and config hash as JSON;"
        " an error names each field to change.",
    )
    _with_config(v)
    v.set_defaults(fn=cmd_validate)
    _add_plan(sub)
    _add_compile_and_submit(sub)
    _add_stage(sub)
    rp = sub.add_parser("report", help="learning curves and tables of one or more run folders", description=REPORT_HELP)
    rp.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    rp.add_argument("--out", help="folder for learning_curve.png and report.md (default: the one run folder)")
    rp.add_argument("--config", help="a config whose storage section reaches s3:// run folders (default: the environment)")
    rp.set_defaults(fn=cmd_report)
    ln = sub.add_parser("lineage", help="the chain of artifacts that made one, back to the bootstrap", description=LINEAGE_HELP)
    ln.add_argument("artifact", metavar="ARTIFACT_URI")
    ln.add_argument("--depth", type=int, help="follow inputs at most this many iterations back (default: all)")
    ln.add_argument("--config", help="a config whose storage section reaches s3:// artifacts (default: the environment)")
    ln.set_defaults(fn=cmd_lineage)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code (``exits.MEANING``). Errors print one line on stderr."""
    parser = build_parser()
    parser._argv_seen = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed the error on one line (or the help, or --version)
        return exits.OK if e.code in (0, None) else exits.USAGE
    try:
        return args.fn(args)
    except Interrupted as e:
        print(f"ac2: {e}", file=sys.stderr)
        return exits.INTERRUPTED
    except KeyboardInterrupt:
        print("ac2: interrupted", file=sys.stderr)
        return exits.INTERRUPTED
    except Exception as e:  # noqa: BLE001  (every error ends in one line; unexpected ones say how to see more)
        code = exits.exit_code(e)
        if code is None and args.debug:
            traceback.print_exc()  # a bug: the traceback, and still the documented code
            return exits.FAILED
        if code is None:
            hint = "(ac2 --debug ... shows the traceback)"
            print(f"ac2: unexpected {type(e).__name__}: {exits.one_line(e)} {hint}", file=sys.stderr)
            return exits.FAILED
        print(f"ac2: {exits.one_line(e)}", file=sys.stderr)
        return code


def console() -> None:
    """The ``ac2`` executable: ``main``, then the exit handlers, then ``os._exit`` with its code
    (``launch.exit_now``), so that no native thread torn down with the interpreter can turn it into an abort."""
    exit_now(main())


if __name__ == "__main__":
    console()
