"""Where a chunk-mode prefix should end: the offline bench for the structure of chunk groups.

    .venv/bin/python bench/prefix_cuts.py --run bench/runs/rl_cut/seed0/ac2_no_gate
    .venv/bin/python bench/prefix_cuts.py --run DIR --seeds 0 1 2 3 --chunk-tokens 8 16

A chunk group teaches the actor only when its continuations differ, and differ in what
matters. This bench takes a finished run's last iteration (its replay, scored chunks,
readiness and actor) and runs the project's own ``sample_prefixes`` and ``generate_chunks``
stages once more on it under each setting of ``rollout.prefix_cut`` x ``rollout.prefix_source``
x ``rollout.chunk_tokens`` (each ``--seeds`` value draws other problems and cuts). Every
chunk group it decodes is then measured against the task's worked solution (arith only; a
DIAGNOSTIC, since a run never sees the worked solution):

- **identical**: all continuations are the same text (no advantage can come of them);
- **prefix off**: the prefix has already left the worked solution (every continuation fails);
- **differ in staying on**: some continuations stay on the worked solution and some leave
  it, the groups whose advantages an oracle critic would not leave at zero.

Per setting it reports those shares, the decoded tokens a group, and the "differ" groups
per thousand decoded chunk tokens. Nothing is trained. One torch thread; run it under
``nice``. The run should have been made with the gate off (``readiness.gate: false``), so
every problem with a window is in chunk mode; pass the run's own overrides with ``--set``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rl_efficiency import key_value, worked_solution  # noqa: E402

TOY = ROOT / "pipelines" / "configs" / "toy.yaml"
RESULTS = ROOT / "bench" / "results" / "prefix_cuts.md"
CUTS = ("boundary", "uncertain", "entropy")
SOURCES = ("any", "success")


def measure(on, prefixes: list[dict], chunks: list[dict]) -> dict:
    """The groups of one setting against the worked solution (``on``: ``rl_efficiency.worked_solution``)."""
    by_prefix: dict[str, list[dict]] = {}
    for c in chunks:
        by_prefix.setdefault(c["prefix_id"], []).append(c)
    counts = {"groups": 0, "identical": 0, "off": 0, "differ": 0, "tokens": 0}
    for p in prefixes:
        if p["mode"] != "chunk":
            continue
        group = by_prefix[p["prefix_id"]]
        stays = {on(p["problem_id"], p["prefix_token_ids"] + c["token_ids"]) for c in group}
        counts["groups"] += 1
        counts["identical"] += len({tuple(c["token_ids"]) for c in group}) == 1
        counts["off"] += not on(p["problem_id"], p["prefix_token_ids"])
        counts["differ"] += len(stays) > 1
        counts["tokens"] += sum(len(c["token_ids"]) for c in group)
    return counts


def run_setting(cfg, layout, iteration: int, store, out: Path, on) -> dict:
    """``sample_prefixes`` then ``generate_chunks`` of a would-be next iteration, wired by the
    recipe to the run's artifacts, with this iteration's outputs under ``out``."""
    from ac2_core import storage
    from ac2_core.stages.recipe import calls

    def published(it: int, name: str) -> str:
        return str(out / name) if it == iteration + 1 else layout.output(it, name)

    for call in calls(cfg, iteration + 1, published)[:2]:  # sample_prefixes, generate_chunks
        call.run(cfg, store=store)
    prefixes = storage.read_rows(str(out / "prefixes"), kind="prefixes")
    return measure(on, prefixes, storage.read_rows(str(out / "chunks"), kind="chunks"))


def render(args: argparse.Namespace, totals: dict, iteration: int, elapsed: float) -> str:
    lines = [
        "# Where a chunk-mode prefix should end",
        "",
        f"Reproduce: `{args.command}`. Machine: {os.cpu_count()} CPUs, load average"
        f" {os.getloadavg()[0]:.2f} when written; {elapsed:.0f} s.",
        "",
        f"Input: iteration {iteration} of `{args.run}` (its replay, scored chunks, readiness and actor),"
        f" continued once more by the project's `sample_prefixes` and `generate_chunks` under each setting,"
        f" seeds {args.seeds}; config `{Path(args.config).name}` with {dict(args.set) or 'no overrides'}.",
        "",
        "Measured against the task's worked solution (a DIAGNOSTIC; see `bench/prefix_cuts.py`).",
        "",
        "| prefix_cut | prefix_source | chunk_tokens | groups | identical | prefix off | differ in staying on"
        " | decoded tokens a group | differ groups per 1k chunk tokens |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (cut, source, width), c in totals.items():
        n = c["groups"] or 1
        lines.append(
            f"| {cut} | {source} | {width} | {c['groups']} | {c['identical'] / n:.2f} | {c['off'] / n:.2f}"
            f" | {c['differ'] / n:.2f} | {c['tokens'] / n:.1f} | {1000 * c['differ'] / max(c['tokens'], 1):.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a finished run folder (one variant and seed of rl_efficiency)")
    p.add_argument("--config", default=str(TOY))
    p.add_argument("--set", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help="config override, e.g. --set readiness.gate=false (the run's own)")  # fmt: skip
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    p.add_argument("--chunk-tokens", nargs="+", type=int, default=[8, 16])
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args(argv)
    args.command = "python bench/prefix_cuts.py " + " ".join(sys.argv[1:] if argv is None else argv)

    import torch

    from ac2_core.config import ConfigError, load_config
    from ac2_core.models.store import ModelStore
    from ac2_core.runner.layout import RunLayout

    torch.set_num_threads(1)
    layout = RunLayout(args.run)
    iteration = layout.completed_iterations()
    if iteration < 1:
        raise SystemExit(f"{args.run}: no finished iteration to continue")
    try:
        base = load_config(args.config, dict(args.set))
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    on = worked_solution(layout)
    if on is None:
        raise SystemExit(f"{args.run}: not an arith run; the groups are measured against its worked solution")
    store = ModelStore(base, keep_in_memory=True)
    totals: dict[tuple, dict] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for (cut, source, width), seed in itertools.product(itertools.product(CUTS, SOURCES, args.chunk_tokens), args.seeds):
            overrides = {"rollout.prefix_cut": cut, "rollout.prefix_source": source, "rollout.chunk_tokens": width, "seed": seed}
            cfg = load_config(args.config, {**dict(args.set), **overrides})
            counts = run_setting(cfg, layout, iteration, store, Path(tmp) / f"{cut}-{source}-{width}-{seed}", on)
            total = totals.setdefault((cut, source, width), dict.fromkeys(counts, 0))
            for k, v in counts.items():
                total[k] += v
            print(f"{cut:9} {source:7} chunk {width:2} seed {seed}: {counts}", flush=True)
    text = render(args, totals, iteration, time.perf_counter() - t0)
    Path(args.results).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
