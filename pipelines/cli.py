"""The ``ac2`` command line.

    ac2 run --config C [--iterations N] [--out DIR] [--runner inprocess|kfp] [--set key=value ...]

Every command validates the config before it starts anything.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

from ac2_core.config import AC2Config, ConfigError, load_config


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
    lines = [
        "| iteration | validation score | readiness share | chunk/full groups | decode tokens | decode FLOPs (cum.) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for m in rows:
        val = "" if m["val_score"] is None else f"{m['val_score']:.3f}"
        lines.append(
            f"| {m['iteration']} | {val} | {m['readiness_share']:.2f} | {m['chunk_groups']}/{m['full_groups']} |"
            f" {m['decode_tokens']} | {m['cum_decode_flops']:.3e} |"
        )
    scored = [m for m in rows if m["val_score"] is not None]
    if scored:
        lines.append("")
        lines.append(
            f"validation score: {scored[0]['val_score']:.3f} at iteration {scored[0]['iteration']}"
            f" -> {scored[-1]['val_score']:.3f} at iteration {scored[-1]['iteration']}"
        )
    return "\n".join(lines)


def cmd_run(args) -> int:
    cfg = _config(args)
    out = args.out or f"runs/{cfg.run_id}"
    _log(f"config {args.config} ok (hash {cfg.config_hash()[:12]}), algorithm {cfg.algorithm}, runner {args.runner}, out {out}")
    match args.runner:
        case "inprocess":
            from ac2_core.stages import inprocess

            rows = inprocess.run(cfg, out, log=_log)
        case "kfp":
            from pipelines import local

            rows = local.run(cfg, out, log=_log)
    table = summary_table(rows)
    print("\n" + table, flush=True)
    Path(out, "summary.md").write_text(table + "\n")
    return 0


def cmd_validate(args) -> int:
    cfg = _config(args)
    print(json.dumps({"ok": True, "algorithm": cfg.algorithm, "config_hash": cfg.config_hash()}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ac2", description="AC2: actor-critic with action chunking, as Kubeflow Pipelines")
    sub = p.add_subparsers(dest="command", required=True)

    def with_config(sp):
        sp.add_argument("--config", required=True, help="YAML config (see pipelines/configs/)")
        sp.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field, e.g. rollout.group_size=4")

    r = sub.add_parser("run", help="train: bootstrap, then N iterations")
    with_config(r)
    r.add_argument("--iterations", type=int, help="override run.iterations")
    r.add_argument("--out", help="run folder (default runs/<run_id>); an existing run is resumed")
    r.add_argument("--runner", choices=["inprocess", "kfp"], default="inprocess")
    r.set_defaults(fn=cmd_run)

    v = sub.add_parser("validate", help="check a config and print its hash")
    with_config(v)
    v.set_defaults(fn=cmd_validate)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"ac2: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
