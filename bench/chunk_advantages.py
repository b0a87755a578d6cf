"""Which chunk-advantage rule aims a learned critic's targets best: an offline bench.

    .venv/bin/python bench/chunk_advantages.py --runs bench/runs/rl_cut/seed0/ac2_no_gate_uncertain

It takes the chunk groups of finished runs (their critic targets, as scored) and computes
their advantages again with the library's ``group_advantages`` under each rule: leave-one-
out unscaled (the toy's), divided by the group's std, and divided by max(std, floor) for
``--floors``. Each rule is measured against the task's worked solution (arith only; a
DIAGNOSTIC, as in ``rl_efficiency``'s report): the share of the total |A| that falls on
groups whose continuations differ in staying on it, the share of that which points the right
way, and the mean |A| of a chunk row (its size beside a full group's, ~0.9). Nothing is
trained or decoded; it runs in seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

RESULTS = ROOT / "bench" / "results" / "chunk_advantages.md"


def rules(floors: list[float]) -> dict[str, dict]:
    """Name -> keyword arguments of ``group_advantages`` (the baseline is leave-one-out)."""
    out = {"unscaled (the toy's)": {"scale_std": False}, "std": {"scale_std": True}}
    out.update({f"std, floor {f:g}": {"scale_std": True, "std_floor": f} for f in floors})
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", required=True, help="finished run folders (variant and seed of rl_efficiency)")
    p.add_argument("--floors", nargs="+", type=float, default=[0.02, 0.05, 0.1, 0.2])
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args(argv)
    command = "python bench/chunk_advantages.py " + " ".join(sys.argv[1:] if argv is None else argv)

    import torch
    from rl_efficiency import advantage_aim, solution_groups

    from ac2_core.math.advantages import group_advantages

    groups = [g for run in args.runs for g in solution_groups(Path(run))]
    if not groups:
        raise SystemExit(f"no arith chunk groups in {args.runs}")
    rows = sum(len(g) for g in groups)
    targets = torch.tensor([r["target"] for g in groups for r in g], dtype=torch.float32)
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    lines = [
        "# Which chunk-advantage rule aims a learned critic's targets best",
        "",
        f"Reproduce: `{command}`. Machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} when written.",
        "",
        f"Input: {len(groups)} chunk groups ({rows} rows) of {', '.join(f'`{r}`' for r in args.runs)}, their critic"
        " targets as the runs scored them, advantages recomputed by `group_advantages` (leave-one-out baseline)."
        " Measured against the worked solution (a DIAGNOSTIC).",
        "",
        "| rule | share of abs A on groups that differ in staying on | of which points right | mean abs A a chunk row |",
        "|---|---:|---:|---:|",
    ]
    as_run = [[r["advantage"] for r in g] for g in groups]
    on, right = advantage_aim(groups, as_run)
    mean = sum(abs(a) for adv in as_run for a in adv) / rows
    lines.append(f"| as the runs computed them | {on:.3f} | {right:.3f} | {mean:.3f} |")
    for name, kw in rules(args.floors).items():
        adv, _ = group_advantages(targets, ids, baseline="loo", **kw)
        on, right = advantage_aim(groups, [a.tolist() for a in adv.split([len(g) for g in groups])])
        lines.append(f"| {name} | {on:.3f} | {right:.3f} | {float(adv.abs().mean()):.3f} |")
    text = "\n".join(lines) + "\n"
    Path(args.results).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
