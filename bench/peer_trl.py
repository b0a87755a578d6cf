"""ac2's GRPO mode against TRL's ``GRPOTrainer``: wall time per optimizer step, side by side.

    .venv/bin/python bench/peer_trl.py [--steps 10] [--warmup 2] [--bootstrap-from DIR]

Needs the bench extra (``trl``); see bench/results/peer_trl.md for how it was installed.

Both sides start from the same warm-started actor (``pipelines/configs/toy.yaml`` with
``algorithm: grpo``, bootstrapped here or adopted from ``--bootstrap-from``), the same
tokenizer, the same training problems, the same reward (``ac2_core.tasks.grade`` of the
arith task on the decoded completion), and the same sizes:

    problems × G       rollout.problems_per_iteration × rollout.group_size completions per step
                       (TRL: num_generations=G, generation batch = problems × G)
    completion length  max_completion_length = rollout.max_response_tokens
    sampling           temperature = rollout.temperature, top_p 1, top_k 0 (the full distribution)
    micro-batches      actor.micro_batch_size sequences per forward/backward
                       (TRL: per_device_train_batch_size = micro batch, gradient_accumulation_steps =
                       steps_per_generation = problems × G / micro batch)
    update             one AdamW step per batch (num_iterations=1), lr = actor.lr, constant, no
                       weight decay, grad-norm clip actor.max_grad_norm, PPO clip 0.2 / 0.28
                       (TRL: epsilon / epsilon_high), no KL (beta=0), token-level loss over the
                       whole batch (TRL: loss_type dapo), group-std-scaled advantages
                       (TRL: scale_rewards group), float32, no gradient checkpointing (TRL's
                       defaults bf16 and gradient_checkpointing are turned off)

One ac2 step is one GRPO iteration of the ``inprocess`` runner without ``evaluate``:
``sample_prefixes``, ``generate_chunks``, ``score_chunks``, ``check_readiness``,
``update_actor``, reading and writing their Parquet artifacts and saving the actor
checkpoint (weights and optimizer state), as the pipeline does. One TRL step is one
optimizer step of ``GRPOTrainer.train``: ``model.generate`` of the batch, reward, then
the micro-batches' forward/backward and the AdamW step, plus the trainer's own
bookkeeping and logging. Neither side evaluates.

The two run interleaved in one process: a ``TrainerCallback`` runs one ac2 iteration at
the end of every TRL step, so both sides see the same machine load. A TRL step is timed
from the end of the previous ac2 iteration to the end of its own optimizer step. The
first ``--warmup`` steps of each side are not counted; the median of the rest is reported.

Writes bench/results/peer_trl.md. Not a test: the numbers depend on the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ac2_core import storage  # noqa: E402
from ac2_core.config import AC2Config, load_config  # noqa: E402
from ac2_core.models.hf import load_model  # noqa: E402
from ac2_core.models.store import ModelStore  # noqa: E402
from ac2_core.runner import inprocess  # noqa: E402
from ac2_core.runner.layout import RunLayout  # noqa: E402
from ac2_core.stages.common import prompt_ids  # noqa: E402
from ac2_core.tasks import grade  # noqa: E402
from bench._common import add_run_arguments, prepare_bootstrap, publish, set_threads  # noqa: E402
from bench.stage_throughput import IO_KINDS, StageClock  # noqa: E402

TOY = ROOT / "pipelines" / "configs" / "toy.yaml"
RESULTS = ROOT / "bench" / "results" / "peer_trl.md"
AC2_STAGES = ("sample_prefixes", "generate_chunks", "score_chunks", "check_readiness", "update_actor")


def ac2_config(problems: int | None) -> AC2Config:
    overrides = {"algorithm": "grpo"}
    if problems:
        overrides["rollout.problems_per_iteration"] = problems
    return load_config(TOY, overrides)


class Ac2Side:
    """ac2's GRPO iterations through the real stage functions, minus ``evaluate``."""

    def __init__(self, cfg: AC2Config, layout: RunLayout):
        self.cfg, self.layout = cfg, layout
        self.store = ModelStore(cfg, keep_in_memory=True)
        self.clock = StageClock()
        self.it = 0
        self.steps: list[dict] = []  # per step: total and per-stage seconds, I/O, counts

    def step(self) -> None:
        self.it += 1
        record: dict = {"stages": {}}
        io_before = sum(self.clock.io_seconds(s) for s in AC2_STAGES)
        t_step = time.perf_counter()
        with self.clock.patched():
            for call in inprocess.stage_calls(self.cfg, self.layout, self.it):
                name = call.stage
                if name not in AC2_STAGES:  # evaluate: excluded on both sides
                    continue
                self.clock.stage = name
                t0 = time.perf_counter()
                m = call.run(self.cfg, store=self.store)
                record["stages"][name] = time.perf_counter() - t0
                self.clock.stage = "outside"
                if name == "generate_chunks":
                    record["completions"], record["decode_tokens"] = m.chunks, m.decode_tokens
                if name == "score_chunks":
                    record["mean_reward"] = m.mean_reward
                if name == "update_actor":
                    record["trained_rows"] = m.trained_chunks
        record["seconds"] = time.perf_counter() - t_step
        record["io"] = sum(self.clock.io_seconds(s) for s in AC2_STAGES) - io_before
        self.steps.append(record)


class TrlSide:
    """TRL's GRPOTrainer on the same actor, problems, reward and sizes; steps timed by a callback."""

    def __init__(self, cfg: AC2Config, layout: RunLayout, work: Path, *, max_steps: int, ac2: Ac2Side, seed: int):
        from datasets import Dataset
        from trl import GRPOConfig, GRPOTrainer

        model, tok = load_model(storage.local_model_dir(layout.bootstrap("actor"), kind="actor"), dtype=cfg.model.dtype)
        problems = [r for r in storage.read_rows(layout.bootstrap("problems"), kind="problems") if r["split"] == "train"]
        self.tokenizer = tok
        self.prompt_ids = {r["prompt"]: prompt_ids(tok, r["prompt"]) for r in problems}
        dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"], "task": r["task"]} for r in problems])
        batch = cfg.rollout.problems_per_iteration * cfg.rollout.group_size
        micro = min(cfg.actor.micro_batch_size, batch)
        if batch % micro:
            raise SystemExit(f"problems × G = {batch} must be a multiple of actor.micro_batch_size {micro}")
        self.args = GRPOConfig(
            output_dir=str(work / "trl"),
            use_cpu=True,
            bf16=False,
            fp16=False,
            gradient_checkpointing=False,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=batch // micro,
            steps_per_generation=batch // micro,
            num_generations=cfg.rollout.group_size,
            max_completion_length=cfg.rollout.max_response_tokens,
            temperature=cfg.rollout.temperature,
            top_p=1.0,
            top_k=0,
            num_iterations=1,
            beta=0.0,
            epsilon=cfg.actor.clip_low,
            epsilon_high=cfg.actor.clip_high,
            loss_type="dapo",
            scale_rewards="group" if cfg.advantage.grpo_scale_std else "none",
            mask_truncated_completions=False,
            learning_rate=cfg.actor.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=cfg.actor.weight_decay,
            max_grad_norm=cfg.actor.max_grad_norm,
            optim="adamw_torch",
            max_steps=max_steps,
            logging_steps=10,  # TRL's default
            disable_tqdm=True,
            report_to="none",
            save_strategy="no",
            disable_dropout=True,
            log_completions=False,
            dataloader_num_workers=0,
            seed=seed,
        )
        self.reward_calls: list[tuple[int, float, float]] = []  # (completions, seconds, mean reward)
        self.generate_seconds: list[float] = []
        self.prompt_mismatches = 0
        self.trainer = GRPOTrainer(
            model=model,
            reward_funcs=self.reward,
            args=self.args,
            train_dataset=dataset,
            processing_class=tok,
            callbacks=[self._callback(ac2)],
        )
        self._time_generate(self.trainer.model)
        self.step_seconds: list[float] = []

    def reward(self, prompts, completions, answer, task, completion_ids=None, **_):
        t0 = time.perf_counter()
        rewards = [grade(t, a, c) for c, a, t in zip(completions, answer, task)]
        # the prompts TRL fed are the token ids ac2 feeds (no template, no special tokens)
        self.prompt_mismatches += sum(
            self.tokenizer(p, add_special_tokens=False)["input_ids"] != self.prompt_ids[p] for p in set(prompts)
        )
        self.reward_calls.append((len(completions), time.perf_counter() - t0, sum(rewards) / len(rewards)))
        return rewards

    def _time_generate(self, model) -> None:
        inner = model.generate

        def generate(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.generate_seconds.append(time.perf_counter() - t0)

        model.generate = generate

    def _callback(self, ac2: Ac2Side):
        from transformers import TrainerCallback

        side = self

        class Interleave(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                side._resumed = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                side.step_seconds.append(time.perf_counter() - side._resumed)
                print(f"  step {state.global_step}: TRL {side.step_seconds[-1]:.2f}s", end="", flush=True)
                ac2.step()
                print(f", ac2 {ac2.steps[-1]['seconds']:.2f}s", flush=True)
                side._resumed = time.perf_counter()

        return Interleave()

    def train(self) -> None:
        self.trainer.train()


def median_after(values: list[float], warmup: int) -> float:
    return statistics.median(values[warmup:])


def report(args, cfg: AC2Config, ac2: Ac2Side, trl: TrlSide, load: tuple, started: float) -> str:
    import torch
    import transformers
    import trl as trl_pkg

    w = args.warmup
    measured = len(trl.step_seconds) - w
    a_med, t_med = median_after([s["seconds"] for s in ac2.steps], w), median_after(trl.step_seconds, w)
    batch = cfg.rollout.problems_per_iteration * cfg.rollout.group_size
    a_steps = ac2.steps[w:]
    stage_med = {s: statistics.median(r["stages"][s] for r in a_steps) for s in AC2_STAGES}
    io_med = statistics.median(r["io"] for r in a_steps)
    gen_med = median_after(trl.generate_seconds, w) if len(trl.generate_seconds) > w else float("nan")
    rew_med = statistics.median(s for _, s, _ in trl.reward_calls[w:])
    zero_adv = [1 - r["trained_rows"] / r["completions"] for r in a_steps]
    # an estimate of ac2 training every row: update_actor's time grows with the rows it computes
    scaled_update = [r["stages"]["update_actor"] * r["completions"] / max(r["trained_rows"], 1) for r in a_steps]
    scaled_step = [r["seconds"] - r["stages"]["update_actor"] + u for r, u in zip(a_steps, scaled_update)]
    cmd = f".venv/bin/python bench/peer_trl.py --steps {args.steps} --warmup {args.warmup}"
    if args.problems:
        cmd += f" --problems {args.problems}"
    if args.bootstrap_from:
        cmd += f" --bootstrap-from {args.bootstrap_from}"
    if args.threads:
        cmd += f" --threads {args.threads}"
    lines = [
        "# ac2 (algorithm: grpo) against TRL GRPOTrainer: wall time per optimizer step",
        "",
        f"Reproduce: `{cmd}`",
        "",
        "Without `--bootstrap-from` the script makes its own bootstrap of the toy config (SFT warm start, seeded;"
        " not timed); with it, it adopts one made with the same model, task and warm-start settings, such as the"
        " `base` folder of `bench/stage_throughput.py --out DIR`.",
        "",
        f"Machine: {os.cpu_count()} CPUs (torch threads {torch.get_num_threads()}), shared with other work while this ran:"
        f" load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} (1/5/15 min) at the start, {os.getloadavg()[0]:.2f}"
        f" at the end; this process ran at niceness {os.nice(0)}. The two sides ran interleaved, step for step, in one"
        f" process, so they shared the same load. Whole benchmark: {time.perf_counter() - started:.0f}s.",
        f"Versions: torch {torch.__version__}, transformers {transformers.__version__}, trl {trl_pkg.__version__}.",
        "",
        "| | median s/step | steps measured (after warm-up) | min s | max s |",
        "|---|---:|---:|---:|---:|",
        f"| ac2 (grpo, inprocess stages, no evaluate) | {a_med:.2f} | {measured} (+{w}) |"
        f" {min(s['seconds'] for s in a_steps):.2f} | {max(s['seconds'] for s in a_steps):.2f} |",
        f"| TRL GRPOTrainer (CPU, use_vllm=False) | {t_med:.2f} | {measured} (+{w}) | {min(trl.step_seconds[w:]):.2f} |"
        f" {max(trl.step_seconds[w:]):.2f} |",
        "",
        f"**TRL / ac2 wall time per optimizer step: {t_med / a_med:.2f}x** (median TRL s/step over median ac2 s/step).",
        f"ac2 skips the rows with zero advantage (see below); against an estimate of ac2 training every"
        f" row ({statistics.median(scaled_step):.2f} s/step) the ratio is {t_med / statistics.median(scaled_step):.2f}x.",
        "",
        "## Config (both sides)",
        "",
        f"- model: the toy Qwen3-architecture actor ({sum(p.numel() for p in trl.trainer.model.parameters()):,} parameters,"
        f" float32, eager attention), warm-started by ac2's bootstrap; byte-level tokenizer; prompts fed as the same"
        f" token ids on both sides (prompt mismatches seen: {trl.prompt_mismatches})",
        f"- batch: {cfg.rollout.problems_per_iteration} problems × G={cfg.rollout.group_size} = {batch} completions per"
        f" optimizer step, max {cfg.rollout.max_response_tokens} completion tokens, temperature {cfg.rollout.temperature},"
        f" micro-batches of {min(cfg.actor.micro_batch_size, batch)}",
        f"- update: AdamW lr {cfg.actor.lr} constant, weight decay {cfg.actor.weight_decay}, clip {cfg.actor.clip_low} /"
        f" {cfg.actor.clip_high}, grad norm {cfg.actor.max_grad_norm}, no KL, one optimizer step per batch",
        "- reward: `ac2_core.tasks.grade('arith', answer, decoded completion)` (1 if it ends in `#<answer>`)",
        f"- mean training reward over the measured steps: ac2 {statistics.mean(r['mean_reward'] for r in a_steps):.3f},"
        f" TRL {statistics.mean(m for _, _, m in trl.reward_calls[w:]):.3f}; completions per reward call on the TRL side:"
        f" {sorted({n for n, _, _ in trl.reward_calls})}",
        "",
        "## Where each side's step goes (medians over the measured steps)",
        "",
        "| ac2 stage | s |",
        "|---|---:|",
        *[f"| {s} | {stage_med[s]:.2f} |" for s in AC2_STAGES],
        f"| of which artifact I/O ({', '.join(IO_KINDS)}) | {io_med:.2f} |",
        "",
        "| TRL part | s |",
        "|---|---:|",
        f"| model.generate | {gen_med:.2f} |",
        f"| reward function | {rew_med:.3f} |",
        f"| the rest: tokenizing, decoding, forwards, loss, backward, AdamW, logging | {t_med - gen_med - rew_med:.2f} |",
        "",
        "## What differs in the work itself",
        "",
        f"- ac2's update_actor computes only rows with a non-zero advantage: groups whose G rewards are all equal get"
        f" advantage 0 and add nothing to the gradient. Over the measured steps {statistics.mean(zero_adv):.0%} of"
        " completions were skipped this way (median of decoded tokens per step:"
        f" {statistics.median(r['decode_tokens'] for r in a_steps):,.0f}). TRL forwards and backpropagates every"
        " completion, zero advantage or not. Were ac2 to train every row, its update_actor would take about"
        f" {statistics.median(scaled_update):.2f}s (its time scaled by completions / trained rows), and its step"
        f" about {statistics.median(scaled_step):.2f}s.",
        "- ac2 generates with its own sampling loop (a KV cache allocated once per batch, logits of the last position"
        " only, rows stop at eos and leave the attention);"
        " TRL calls `model.generate` with sampling (same model, eager attention).",
        "- ac2 writes every artifact (prefixes, chunks, scored chunks, advantages as Parquet, the actor checkpoint with"
        " optimizer state) and reads them back verified; TRL keeps everything in memory. That I/O is part of ac2's"
        " step above.",
        "- ac2's AdamW runs with foreach=False (bit-identical reruns); TRL's optim adamw_torch uses PyTorch's default.",
        "",
        "## bench extra",
        "",
        "`trl` is a bench-only dependency (`pip install -e '.[bench]'`). It was installed into .venv with a constraints"
        " file holding `torch==2.13.0` and `transformers==5.19.0`, so that neither moved; trl's newest release, 1.16.0,"
        " accepts transformers 5.19 (it added accelerate 1.15.0 and psutil).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per side, warm-up included (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="first steps of each side not counted (default 2)")
    p.add_argument("--problems", type=int, help="problems per step (default: the toy config's rollout.problems_per_iteration)")
    add_run_arguments(
        p,
        bootstrap_help="adopt this run folder's bootstrap (made with toy.yaml) instead of bootstrapping afresh"
        " (SFT, about 2 minutes)",
    )
    p.add_argument("--seed", type=int, default=0, help="TRL's seed (ac2's comes from the config)")
    args = p.parse_args()
    if not 0 <= args.warmup < args.steps:
        p.error(f"--warmup must be in [0, --steps); found {args.warmup} with --steps {args.steps}")
    try:
        import trl  # noqa: F401
    except ImportError:
        raise SystemExit(
            "bench/peer_trl.py needs trl: .venv/bin/pip install -e '.[bench]' (see bench/results/peer_trl.md)"
        ) from None

    set_threads(args.threads)
    started, load = time.perf_counter(), os.getloadavg()
    cfg = ac2_config(args.problems)
    work = Path(args.out or tempfile.mkdtemp(prefix="ac2-peer-trl-")).resolve()
    print(f"work folder {work}; load average {load[0]:.2f}", flush=True)
    layout = RunLayout(str(work / "ac2"))
    prepare_bootstrap(cfg, layout, args.bootstrap_from)

    ac2 = Ac2Side(cfg, layout)
    trl_side = TrlSide(cfg, layout, work, max_steps=args.steps, ac2=ac2, seed=args.seed)
    trl_side.train()
    text = report(args, cfg, ac2, trl_side, load, started)
    publish(text, RESULTS)


if __name__ == "__main__":
    main()
