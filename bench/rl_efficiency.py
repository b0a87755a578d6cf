"""The central experiment: decode FLOPs (and wall time) for AC2 and for GRPO to reach
GRPO's peak validation score, on the built-in task.

    .venv/bin/python bench/rl_efficiency.py                      # ac2, grpo, grpo_skip × 3 seeds
    .venv/bin/python bench/rl_efficiency.py --variants ac2_no_gate ac2_no_ref   # ablations
    .venv/bin/python bench/rl_efficiency.py --report-only        # rebuild the tables and plot

Every run starts from the same warm-started model (one bootstrap, made with
--bootstrap-seed and adopted by every run), with the same problems, G, learning rate
and validation set; a seed varies the RL (problem draws, sampling), and the runs of
one seed share it. The variants differ only in the config keys listed in VARIANTS. The
variants of one seed run in one process, interleaved iteration by iteration, so that
the machine's load falls on all of them alike; the seeds run in parallel processes,
one thread each.

Headline: GRPO's peak of the moving average of the validation score (per seed); for each
run, the first iteration where its moving average reaches that peak; the ratio of
GRPO's cumulative decode FLOPs there to the run's. The same ratio in wall time counts
every stage but ``evaluate`` (critic scoring and training included). GRPO is the variant
``--reference`` names (default ``grpo``): GRPO at its best setting of the search.

Runs are resumable: the per-iteration records live under --out, and a variant run
later (an ablation) is compared with the GRPO runs already there. The tables and the
plot are rebuilt from every record under --out, each run to the invocation's
``run.iterations`` (a run taken further by a later invocation is cut there). Text below
the analysis marker of the results file is kept when the tables are rewritten. Not a
test: wall times depend on the machine's load; FLOPs and scores do not.

Every report archives the runs it reads (their records, and their diagnostics to the
iteration reported) under --archive, in a folder named as --out's: bench/runs is not
committed, so a fresh clone rebuilds a report from the archive, and a rerun is checked
against it (a run on the same inputs reproduces its scores and token counts exactly).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TOY = ROOT / "pipelines" / "configs" / "toy.yaml"
RESULTS = ROOT / "bench" / "results" / "rl_efficiency.md"
# every reported run's records and diagnostics, kept beside the results (bench/runs is not committed):
# a fresh clone rebuilds a report from them, and a rerun on the same inputs is checked against them
ARCHIVE = ROOT / "bench" / "results" / "records"
MARKER = "<!-- analysis: text below this line is kept when the tables are rewritten -->"

# What each variant changes; everything else comes from the config and --set.
ORACLE = {"critic.kind": "oracle"}  # a DIAGNOSTIC: the critic reads the worked solution; it decodes nothing extra
BLIND = {"critic.kind": "blind"}  # a DIAGNOSTIC: one value for every state; what AC2 learns with a critic that adds nothing
# the gate off, chunk-mode prefixes ending right before the token the actor finds least likely
UNCERTAIN = {"readiness.gate": False, "rollout.prefix_cut": "uncertain"}
# chunk advantages divided by max(group std, 0.1): near-equal targets amplified at most 10x
FLOOR = {"advantage.scale_std": True, "advantage.std_floor": 0.1}
AGE8 = {"rollout.prefix_max_age": 8}  # chunk-mode states cut from whole answers at most 8 iterations old
FULL2 = {"rollout.full_group_size": 2}  # full-mode groups of 2 answers once chunk mode is on (G stays 4)
R97 = {"rollout.revisit_fraction": 0.97}  # 97% of the problems from replay: a smaller pool, revisited more often
P0 = {"rollout.probe_fraction": 0.0}  # no probes: with the gate off a probe is only a full group
S2 = {"actor.steps_per_iteration": 2}  # two optimizer steps an iteration on the same rows (GRPO's best of the search)
# a revisited problem in full mode decodes one answer, measured against its replayed success rate (its whole
# answers kept in the replay ahead of continuations, for that rate and for the prefixes)
ONE = {"rollout.full_group_size": 1, "advantage.full_groups": "replay_rate", "replay.whole_answers_first": True}
# the critic's credit along whole answers (research log section 14): each chunk of a full-mode answer trained on
# the change in V it brought, not on the answer's outcome
CREDIT = {"advantage.full_credit": "critic"}
# the credit divided by the std the outcome advantage it replaces was divided by (beside std-scaled chunk rows)
SCALED = {"advantage.credit_scale": True}
MATCH = {"critic.reference_match": True}  # the value head also reads how the answer runs along its reference
# chunk-mode prefixes cut from answers that succeeded, right before the position where the actor's next-token
# distribution has the most entropy (a forking token, research log section 17); the gate is the variant's
FORK = {"rollout.prefix_cut": "entropy", "rollout.prefix_source": "success"}
# (research log section 19) the fork cut from successes alone: a problem never solved is refreshed by a whole answer
FORK_SUCCESS_ONLY = {**FORK, "rollout.prefix_source": "success_only"}
SOURCE_REF = {"critic.source_reference": True}  # a prefix whose only success is its source is shown that source
# every trained row weighs alike, its tokens averaged within it: a 16-token chunk weighs as a whole answer does
ROW = {"actor.loss_aggregation": "row"}
# twice the problems an iteration, spending chunk mode's saving on more of them; run to the same decode budget as a
# 64-problem GRPO over 80 iterations for GRPO (40 iterations) and to 48 for AC2 (research log section 21)
B128 = {"rollout.problems_per_iteration": 128}
# the success_only recipe (research log sections 19-21): the gate off, fork cuts from successes alone, std-scaled
# chunk advantages with the floor, states at most 8 iterations old, one-answer refreshes and two steps; the learned
# critic also reads its run along the reference and is shown the source where it is the only success
SRCONLY = {"readiness.gate": False, **FORK_SUCCESS_ONLY, **FLOOR, **AGE8, **ONE, **S2}
LEARNED_SRCONLY = {**SRCONLY, **MATCH, **SOURCE_REF}
ORACLE_SRCONLY = {**ORACLE, **SRCONLY}
VARIANTS: dict[str, dict] = {
    "ac2": {},
    "ac2_oracle": ORACLE,
    "grpo": {"algorithm": "grpo"},
    "grpo_skip": {"algorithm": "grpo", "rollout.skip_solved_groups": 2},
    # GRPO on a quarter of the problems an iteration: about the decoding of AC2 with the gate off
    "grpo_16": {"algorithm": "grpo", "rollout.problems_per_iteration": 16, "run.iterations": 36},
    "ac2_no_gate": {"readiness.gate": False},
    "ac2_no_ref": {"critic.use_reference": False},
    "ac2_chunk8": {"rollout.chunk_tokens": 8},
    "ac2_chunk32": {"rollout.chunk_tokens": 32},
    "ac2_no_gate_uncertain": UNCERTAIN,
    # ... with chunk advantages divided by their group's std (the oracle's magnitude, the learned critic's sign)
    "ac2_no_gate_uncertain_std": {**UNCERTAIN, "advantage.scale_std": True},
    # ... divided by max(std, 0.1) (offline: 95% of |A| points right)
    "ac2_no_gate_uncertain_floor": {**UNCERTAIN, **FLOOR},
    "ac2_oracle_no_gate_uncertain": {**ORACLE, **UNCERTAIN},
    # fresher chunk-mode states (research log section 10), DIAGNOSTICS with the oracle: 40% of the
    # revisited problems drawn as probes (full groups) rather than 10%, or states at most 4 / 8 / 16
    # iterations old, 8-token chunks, no probes
    "ac2_oracle_probe04": {**ORACLE, **UNCERTAIN, "rollout.probe_fraction": 0.4},
    "ac2_oracle_age4": {**ORACLE, **UNCERTAIN, "rollout.prefix_max_age": 4},
    "ac2_oracle_age8": {**ORACLE, **UNCERTAIN, **AGE8},
    # ... and the learned critic with the std floor on them
    "ac2_floor_age8": {**UNCERTAIN, **FLOOR, **AGE8},
    "ac2_oracle_age16": {**ORACLE, **UNCERTAIN, "rollout.prefix_max_age": 16},
    "ac2_oracle_age8_c8": {**ORACLE, **UNCERTAIN, **AGE8, "rollout.chunk_tokens": 8},
    # with the gate off probes only add full groups; freshness comes from the age limit
    "ac2_oracle_age8_p0": {**ORACLE, **UNCERTAIN, **AGE8, **P0},
    "ac2_floor_age8_p0": {**UNCERTAIN, **FLOOR, **AGE8, **P0},
    # a fresh state for half a full group's decoding (research log section 11), and GRPO searched alike
    "ac2_oracle_age8_f2": {**ORACLE, **UNCERTAIN, **AGE8, **FULL2},
    "ac2_floor_age8_f2": {**UNCERTAIN, **FLOOR, **AGE8, **FULL2},
    "grpo_g2": {"algorithm": "grpo", "rollout.group_size": 2},
    # revisited more often, so a fresh answer serves more chunk-mode visits before it ages out; GRPO draws alike
    "grpo_r97": {"algorithm": "grpo", **R97},
    "ac2_oracle_age8_p0_r97": {**ORACLE, **UNCERTAIN, **AGE8, **P0, **R97},
    "ac2_floor_age8_p0_r97": {**UNCERTAIN, **FLOOR, **AGE8, **P0, **R97},
    # two chunk-mode prefixes a problem (the fresh answer's two least likely tokens): more of the cheap chunk groups
    "ac2_oracle_age8_k2": {**ORACLE, **UNCERTAIN, **AGE8, "rollout.prefixes_per_problem": 2},
    # ... with whole answers kept in the replay ahead of the continuations that pushed them out
    "ac2_oracle_age8_k2_w": {
        **ORACLE,
        **UNCERTAIN,
        **AGE8,
        "rollout.prefixes_per_problem": 2,
        "replay.whole_answers_first": True,
    },
    # a larger actor step for both algorithms (3e-5 was GRPO's best of 1e-5, 3e-5 and 1e-4): does the pace grow with the signal?
    "grpo_lr5": {"algorithm": "grpo", "actor.lr": 5e-5},
    "ac2_oracle_age8_lr5": {**ORACLE, **UNCERTAIN, **AGE8, "actor.lr": 5e-5},
    # ... or two optimizer steps an iteration on the same rows (PPO's clip bounds the second)
    "grpo_s2": {"algorithm": "grpo", **S2},
    "ac2_oracle_age8_s2": {**ORACLE, **UNCERTAIN, **AGE8, **S2},
    # the step search goes on for GRPO: four steps, and half the problems an iteration
    "grpo_s4": {"algorithm": "grpo", "actor.steps_per_iteration": 4},
    "grpo_b32": {"algorithm": "grpo", "rollout.problems_per_iteration": 32},
    # the learned critic's arm with GRPO's better step
    "ac2_floor_age8_s2": {**UNCERTAIN, **FLOOR, **AGE8, **S2},
    # the oracle's advantages scaled by their group's std (floor 0.1), as GRPO's rewards are and the learned arms' are
    "ac2_oracle_floor_age8": {**ORACLE, **UNCERTAIN, **FLOOR, **AGE8},
    # the oracle's least-decoding structure (revisit 0.97, no probes) with GRPO's better step
    "ac2_oracle_age8_p0_r97_s2": {**ORACLE, **UNCERTAIN, **AGE8, **P0, **R97, **S2},
    # one-answer refreshes (research log section 13), for GRPO alike: every revisited problem one answer
    "grpo_one_s2": {"algorithm": "grpo", **ONE, **S2},
    "ac2_oracle_age8_one_s2": {**ORACLE, **UNCERTAIN, **AGE8, **ONE, **S2},
    "ac2_floor_age8_one_s2": {**UNCERTAIN, **FLOOR, **AGE8, **ONE, **S2},
    # ... with chunk-mode prefixes cut only from answers that succeeded (23% of its chunk groups started off the solution)
    "ac2_oracle_age8_one_success_s2": {**ORACLE, **UNCERTAIN, **AGE8, **ONE, **S2, "rollout.prefix_source": "success"},
    # ... the oracle's credit along every answer, decoding as GRPO does (every problem a full group of 4: what
    # credit alone buys), and along the one-answer refreshes and new groups of the cheapest structure
    "ac2_oracle_credit_full_s2": {**ORACLE, "readiness.gate": False, "rollout.probe_fraction": 1.0, **CREDIT, **S2},
    "ac2_oracle_age8_one_credit_s2": {**ORACLE, **UNCERTAIN, **AGE8, **ONE, **S2, **CREDIT},
    # ... and along the refreshes of 4 of the age-8 structure (0.485x GRPO's decoding, section 12)
    "ac2_oracle_age8_credit_s2": {**ORACLE, **UNCERTAIN, **AGE8, **S2, **CREDIT},
    # ... and the learned critic's on the cheapest structure, with the gate off as the other learned arms
    "ac2_floor_age8_one_credit_s2": {**UNCERTAIN, **FLOOR, **AGE8, **ONE, **S2, **CREDIT},
    # ... with the gate on: credit (and chunk mode) only where the learned critic is ready (gate off, a fresh
    # critic's flat V put all of iteration 1's credit on each answer's last chunk, and the arm fell from the start)
    "ac2_gate_age8_one_credit_s2": {"rollout.prefix_cut": "uncertain", **FLOOR, **AGE8, **ONE, **S2, **CREDIT},
    # ... and on the age-8 refreshes of 4 (the structure that paid with the oracle's credit, section 14)
    "ac2_gate_age8_credit_s2": {"rollout.prefix_cut": "uncertain", **FLOOR, **AGE8, **S2, **CREDIT},
    # ... fitted 4x as long an iteration (32 head steps, not 8): does a value fitted harder commit after a slip,
    # where it fell only from 0.42 to 0.22 (research log section 15)?
    "ac2_gate_age8_credit_c32_s2": {
        "rollout.prefix_cut": "uncertain",
        **FLOOR,
        **AGE8,
        **S2,
        **CREDIT,
        "critic.steps_per_iteration": 32,
    },
    # ... with a critic that reads its run along the reference (critic.reference_match): does a value that commits
    # after a slip (the critic bench: V after leaving the solution 0.07, where it succeeds 0.06) aim the credit as
    # the oracle's does, and does the gate then admit more problems?
    "ac2_gate_age8_credit_match_s2": {"rollout.prefix_cut": "uncertain", **FLOOR, **AGE8, **S2, **CREDIT, **MATCH},
    # ... and with the gate off, as the oracle's arm runs
    "ac2_floor_age8_credit_match_s2": {**UNCERTAIN, **FLOOR, **AGE8, **S2, **CREDIT, **MATCH},
    # ... behind the gate without the credit along whole answers: chunk mode alone on the better critic (with the
    # credit, trusting it on more problems slowed learning per iteration)
    "ac2_gate_age8_match_s2": {"rollout.prefix_cut": "uncertain", **FLOOR, **AGE8, **S2, **MATCH},
    # ... behind the gate, a revisited problem refreshing one whole answer measured against its replayed rate
    # (section 13's cheapest structure): what the reference match buys where decoding is scarcest
    "ac2_gate_age8_one_credit_match_s2": {
        "rollout.prefix_cut": "uncertain",
        **FLOOR,
        **AGE8,
        **ONE,
        **S2,
        **CREDIT,
        **MATCH,
    },
    # ... and with the gate off, its credit past the critic's warm-up everywhere, each segment also taking half of
    # the later segments' changes (GAE's lambda 0.5: a critic wrong about where an answer slipped misleads less)
    "ac2_floor_age8_credit_l05_s2": {**UNCERTAIN, **FLOOR, **AGE8, **S2, **CREDIT, "advantage.credit_lambda": 0.5},
    # the forking toy (research log section 17): chunk groups continue a success from its most uncertain position,
    # with the oracle (gate off) on the age-8 refreshes of 4 and on one-answer refreshes
    "ac2_oracle_age8_fork_credit_s2": {**ORACLE, "readiness.gate": False, **FORK, **AGE8, **S2, **CREDIT},
    "ac2_oracle_age8_one_fork_credit_s2": {**ORACLE, "readiness.gate": False, **FORK, **AGE8, **ONE, **S2, **CREDIT},
    # ... with 8-token chunks: the fork is the chunk's first token, and the oracle judges it within 8
    "ac2_oracle_age8_one_fork_c8_credit_s2": {
        **ORACLE,
        "readiness.gate": False,
        **FORK,
        **AGE8,
        **ONE,
        **S2,
        **CREDIT,
        "rollout.chunk_tokens": 8,
    },
    # ... and the learned critic that reads its run along the reference, behind the gate, without the credit
    "ac2_gate_age8_fork_match_s2": {**FORK, **FLOOR, **AGE8, **S2, **MATCH},
    # ... on the one-answer refreshes, behind the gate and with it off
    "ac2_gate_age8_one_fork_match_s2": {**FORK, **FLOOR, **AGE8, **ONE, **S2, **MATCH},
    "ac2_floor_age8_one_fork_match_s2": {"readiness.gate": False, **FORK, **FLOOR, **AGE8, **ONE, **S2, **MATCH},
    # ... with the oracle arm's 8-token chunks (research log section 18): the fork is the chunk's first token
    "ac2_floor_age8_one_fork_c8_match_s2": {
        "readiness.gate": False,
        **FORK,
        **FLOOR,
        **AGE8,
        **ONE,
        **S2,
        **MATCH,
        "rollout.chunk_tokens": 8,
    },
    # ... shown the success its prefix was cut from where the problem has no other (research log section 19): a
    # quarter of the 16-token arm's chunk groups had no reference, and there its advantages ranked at chance
    "ac2_floor_age8_one_fork_srcref_match_s2": {
        "readiness.gate": False,
        **FORK,
        **FLOOR,
        **AGE8,
        **ONE,
        **S2,
        **MATCH,
        **SOURCE_REF,
    },
    # ... whose critic also fits the answers replay holds from the last 8 iterations (research log section 20): an
    # iteration's few dozen whole answers left its values after a departure from the solution at 0.2-0.4
    "ac2_floor_age8_one_fork_srcref_match_crep8_s2": {
        "readiness.gate": False,
        **FORK,
        **FLOOR,
        **AGE8,
        **ONE,
        **S2,
        **MATCH,
        **SOURCE_REF,
        "critic.replay_iterations": 8,
    },
    # ... and the oracle in the learned arm's recipe (a DIAGNOSTIC; research log section 19): the same 16-token
    # chunks, std-scaled advantages with the floor and outcome advantages on whole answers, so the two differ in
    # the critic alone
    "ac2_oracle_floor_age8_one_fork_s2": {**ORACLE, "readiness.gate": False, **FORK, **FLOOR, **AGE8, **ONE, **S2},
    # ... and the blind critic in the same recipe (a DIAGNOSTIC; research log section 20): the other end, where an
    # unfinished chunk has no advantage, so the learned critic's place between the two is what it adds
    "ac2_blind_floor_age8_one_fork_s2": {**BLIND, "readiness.gate": False, **FORK, **FLOOR, **AGE8, **ONE, **S2},
    # ... with prefixes cut from successes alone (section 19: where a problem was never solved the learned critic has
    # no reference and ranked below chance), and its oracle
    "ac2_floor_age8_one_srconly_srcref_match_s2": LEARNED_SRCONLY,
    "ac2_oracle_floor_age8_one_srconly_s2": ORACLE_SRCONLY,
    # ... and both with every trained row weighed alike (research log section 20): under token aggregation the
    # chunk rows held about a quarter of the actor's gradient
    "ac2_floor_age8_one_srconly_srcref_match_row_s2": {**LEARNED_SRCONLY, **ROW},
    "ac2_oracle_floor_age8_one_srconly_row_s2": {**ORACLE_SRCONLY, **ROW},
    # ... and the learned success_only arm, its oracle and GRPO with 128 problems an iteration (research log section
    # 21): GRPO at 64 problems learned far faster per iteration than at 32, so a batch AC2's saving pays for may too
    "ac2_floor_age8_one_srconly_srcref_match_b128_s2": {**LEARNED_SRCONLY, **B128, "run.iterations": 48},
    "ac2_oracle_floor_age8_one_srconly_b128_s2": {**ORACLE_SRCONLY, **B128, "run.iterations": 48},
    "grpo_b128_s2": {"algorithm": "grpo", **S2, **B128, "run.iterations": 40},
    # ... and the learned success_only arm shown the problem's most likely success under the current actor, with
    # those it would write again with probability under e^-2 (lucky: a slip that cancelled an earlier error) neither
    # shown nor cut from (research log section 22)
    "ac2_floor_age8_one_srconly_srcref_match_likely_s2": {**LEARNED_SRCONLY, "critic.reference_min_logprob": -2.0},
    # ... and the oracle and learned success_only arms with two chunk-mode prefixes a problem, cut at the source's two
    # most uncertain positions (research log section 22: even the oracle only ties GRPO's pace; a chunk group costs
    # 64 decoded tokens against about 100 for a refresh)
    "ac2_oracle_floor_age8_one_srconly_p2_s2": {**ORACLE_SRCONLY, "rollout.prefixes_per_problem": 2},
    "ac2_floor_age8_one_srconly_srcref_match_p2_s2": {**LEARNED_SRCONLY, "rollout.prefixes_per_problem": 2},
    # (research log section 23) past iteration 80 the failures are slips and two thirds of the problems are refreshed:
    # the critic's credit along those one-answer refreshes, measured with the oracle first
    "ac2_oracle_floor_age8_one_srconly_credit_s2": {**ORACLE_SRCONLY, **CREDIT},
    # ... which weighs the credited refreshes 8x less than their outcome did beside the chunk rows (|A| 0.10 a token
    # against 0.80): the credit at the outcome's scale; the learned critic's only where it was shown a reference,
    # since without one its values along a failed answer are flat (0.52 before the slip and 0.53 after)
    "ac2_oracle_floor_age8_one_srconly_credit_scaled_s2": {**ORACLE_SRCONLY, **CREDIT, **SCALED},
    "ac2_floor_age8_one_srconly_srcref_match_credit_scaled_s2": {
        **LEARNED_SRCONLY,
        **CREDIT,
        **SCALED,
        "advantage.credit_needs_reference": True,
    },
    # (research log section 25) the learned critic is slow to commit a few tokens past a slip, where the log count of
    # tokens that left the reference is still small: the match features with a "has left" indicator beside it
    "ac2_floor_age8_one_srconly_srcref_match_left_s2": {**LEARNED_SRCONLY, "critic.reference_left_flag": True},
    # ... and 80% of the learned arm's inverted chunk groups were shown another success that is lucky (two cancelling
    # errors): every chunk prefix shown its own source, which agrees with it up to the cut
    "ac2_floor_age8_one_srconly_srcalways_match_s2": {**LEARNED_SRCONLY, "critic.source_reference": "always"},
    # (research log section 26) five changes raised the learned chunk signal's agreement with the oracle's without
    # moving the pace: where does the oracle's lead sit? The learned arm with the oracle's values on one class of chunk
    # group at a time, and on every group from iteration 20 on (DIAGNOSTICS: the learned critic still scores and trains)
    "ac2_floor_age8_one_srconly_srcref_match_oracle_off_s2": {**LEARNED_SRCONLY, "critic.oracle_groups": ["off_prefix"]},
    "ac2_floor_age8_one_srconly_srcref_match_oracle_mixed_s2": {**LEARNED_SRCONLY, "critic.oracle_groups": ["mixed"]},
    "ac2_floor_age8_one_srconly_srcref_match_oracle_agreeing_s2": {**LEARNED_SRCONLY, "critic.oracle_groups": ["agreeing"]},
    "ac2_floor_age8_one_srconly_srcref_match_oracle_from20_s2": {**LEARNED_SRCONLY, "critic.oracle_from_iteration": 20},
    # (section 27) every inverted mixed group was shown a lucky reference, and an off_prefix group is cut from a lucky
    # source: the oracle's values on both classes together bound what handling lucky successes right could give
    "ac2_floor_age8_one_srconly_srcref_match_oracle_offmixed_s2": {
        **LEARNED_SRCONLY,
        "critic.oracle_groups": ["off_prefix", "mixed"],
    },
    # ... and its learned counterpart: a success is a prefix source or a reference only once two whole answers wrote it,
    # the one most wrote shown (a lucky success is seldom written twice: 69% of the lucky references, 7% of the others)
    "ac2_floor_age8_one_srconly_srcref_match_rep2_s2": {**LEARNED_SRCONLY, "replay.success_repeats": 2},
    # GRPO's search on the forking toy, around its best setting of the old toy (two steps at lr 3e-5)
    "grpo_skip_s2": {"algorithm": "grpo", "rollout.skip_solved_groups": 2, **S2},
    "grpo_s2_lr5": {"algorithm": "grpo", **S2, "actor.lr": 5e-5},
    # chunk-mode prefixes cut from successful answers (none start past a fatal slip), gate off
    "ac2_no_gate_success": {"readiness.gate": False, "rollout.prefix_source": "success"},
    # ... and chunk advantages divided by their group's std, as GRPO divides its rewards'
    "ac2_no_gate_success_std": {"readiness.gate": False, "rollout.prefix_source": "success", "advantage.scale_std": True},
}
MAIN = ["ac2", "ac2_oracle", "grpo", "grpo_skip"]
# The benchmark's size: the toy config with a shorter run and a denser, smaller evaluation.
BENCH_SIZE = {"run.iterations": 40, "run.keep_models": 1}


def parse_value(text: str):
    """--set values: JSON where it parses (numbers, true/false, null), else the string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def configs_for(args: argparse.Namespace, seed: int, variants: list[str] | None = None) -> dict:
    from ac2_core.config import load_config

    base = {**BENCH_SIZE, **dict(args.set), "seed": seed}
    return {
        v: load_config(args.config, {**base, **VARIANTS[v], "run_id": f"{v.replace('_', '-')}-s{seed}"})
        for v in variants or args.variants
    }


# ---------------------------------------------------------------- running


def exit_with_parent(parent: int) -> None:
    """A pool worker's initializer: end the worker once the benchmark that started it is gone.
    A killed benchmark would otherwise leave its workers running (and writing) as orphans; the
    runs resume from their published iterations when the benchmark is started again."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def run_seed(args: argparse.Namespace, seed: int) -> None:
    """Bootstrap once for this seed, then run every variant, interleaved by iteration."""
    import torch

    from ac2_core import storage
    from ac2_core.models.store import ModelStore
    from ac2_core.runner import inprocess, loop
    from ac2_core.runner.layout import RunLayout

    torch.set_num_threads(args.threads)
    cfgs = configs_for(args, seed)
    seed_dir = Path(args.out) / f"seed{seed}"
    boot = bootstrap_layout(args)
    initial = storage.read_rows(boot.bootstrap("metrics"), kind="metrics")[0]

    runs = {}
    for v, cfg in cfgs.items():
        layout = RunLayout(str(seed_dir / v))
        if not storage.exists(layout.bootstrap("metrics")):
            # made with the bootstrap seed: adopt it as that seed's config would
            loop.adopt_bootstrap(cfg.model_copy(update={"seed": args.bootstrap_seed}), layout, boot.root)
        records = seed_dir / v / "records.jsonl"
        done = _valid_records(records, layout.completed_iterations())
        if done == 0:
            _write_records(records, [_record(v, seed, 0, initial, {}, 0.0, 0.0)])
        runs[v] = (cfg, layout, ModelStore(cfg, keep_in_memory=True), records, done)

    iterations = max(cfg.run.iterations for cfg in cfgs.values())
    for it in range(1, iterations + 1):
        for v, (cfg, layout, store, records, done) in runs.items():
            if it <= done or it > cfg.run.iterations:
                continue
            wall0, cpu0 = time.perf_counter(), time.process_time()
            ran = inprocess.run_iteration(cfg, layout, it, store)
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
            metrics = storage.read_rows(layout.output(it, "metrics"), kind="metrics")[-1]
            rec = _record(v, seed, it, metrics, ran.seconds, wall, cpu)
            with records.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            loop.prune(cfg, layout, it)
            val = "  -  " if metrics["val_score"] is None else f"{metrics['val_score']:.3f}"
            print(
                f"[seed {seed}] {v:<12} it {it:>3}  val {val}  ready {metrics['readiness_share']:.2f}"
                f"  chunk/full {metrics['chunk_groups']:>3}/{metrics['full_groups']:<3}"
                f"  dec_tok {metrics['decode_tokens']:>6}  {wall:5.1f}s",
                flush=True,
            )


def bootstrap_layout(args: argparse.Namespace):
    from ac2_core.runner.layout import RunLayout

    return RunLayout(str(Path(args.out) / "bootstrap"))


def make_bootstrap(args: argparse.Namespace) -> None:
    """The one warm start every run adopts (skipped when it exists)."""
    import torch

    from ac2_core import storage
    from ac2_core.runner import inprocess

    boot = bootstrap_layout(args)
    if storage.exists(boot.bootstrap("metrics")):
        return
    torch.set_num_threads(args.threads)
    cfg = configs_for(args, args.bootstrap_seed)[args.variants[0]]
    t0 = time.perf_counter()
    inprocess.run_bootstrap(cfg, boot, log=lambda m: print(f"[bootstrap] {m}", flush=True))
    print(f"[bootstrap] done in {time.perf_counter() - t0:.0f}s", flush=True)


def _record(variant: str, seed: int, it: int, metrics: dict, seconds: dict, wall: float, cpu: float) -> dict:
    keep = (
        "val_score", "readiness_share", "chunk_groups", "full_groups", "mean_train_reward", "critic_error",
        "decode_tokens", "cum_decode_tokens", "cum_decode_flops", "cum_prefill_flops", "cum_critic_flops",
        "cum_train_flops", "critic_auc", "full_rollout_tokens",
    )  # fmt: skip
    return {
        "variant": variant,
        "seed": seed,
        "iteration": it,
        **{k: metrics.get(k) for k in keep},
        "wall_s": wall,
        "cpu_s": cpu,
        "eval_s": seconds.get("evaluate", 0.0),
        "stage_s": seconds,
    }


def _valid_records(path: Path, completed: int) -> int:
    """Iterations that are both published and recorded; later records are dropped."""
    if not path.exists():
        return 0
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    recs = [r for r in recs if r["iteration"] <= completed]
    recorded = {r["iteration"] for r in recs}
    done = 0
    while done + 1 in recorded:
        done += 1
    _write_records(path, [r for r in recs if r["iteration"] <= done])
    return done


def _write_records(path: Path, recs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in recs))
    tmp.replace(path)


# ---------------------------------------------------------------- analysis


def load_runs(out: Path) -> dict[tuple[str, int], list[dict]]:
    runs = {}
    for path in sorted(out.glob("seed*/*/records.jsonl")):
        recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if recs:
            runs[(recs[0]["variant"], recs[0]["seed"])] = sorted(recs, key=lambda r: r["iteration"])
    return runs


def archive_dir(args: argparse.Namespace) -> Path:
    """The archive of the runs under --out: a folder of --archive named as --out's."""
    return Path(args.archive) / Path(args.out).name


def archive_path(archive: Path, variant: str, seed: int) -> Path:
    return archive / f"seed{seed}" / f"{variant}.json"


def load_archive(archive: Path) -> dict[tuple[str, int], dict]:
    """The archived runs under ``archive`` (one results folder's): {"records": [...],
    "diagnostics": {"<iteration>": {...}}} per (variant, seed)."""
    runs = {}
    for path in sorted(archive.glob("seed*/*.json")):
        try:
            entry = json.loads(path.read_text())
            key = (entry["records"][0]["variant"], entry["records"][0]["seed"])
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise SystemExit(f"{path}: not an archived run ({type(e).__name__}: {e}); remove it or restore it from git") from None
        runs[key] = entry
    return runs


RECORD_CHECKS = ("val_score", "cum_decode_tokens")  # what a rerun on the same inputs reproduces exactly


def merge_runs(local: dict, archived: dict) -> dict[tuple[str, int], list[dict]]:
    """A run's records from its folder, or from the archive where the folder holds fewer
    iterations (a fresh clone, or a rerun still under way). A folder whose records disagree
    with the archive's on the iterations both hold is another run (another code version):
    it is kept, and the difference is reported."""
    runs = dict(local)
    for key, entry in archived.items():
        mine = runs.get(key, [])
        differ = next(
            (a["iteration"] for a, b in zip(mine, entry["records"]) if any(a.get(f) != b.get(f) for f in RECORD_CHECKS)),
            None,
        )
        if differ is not None:
            print(
                f"{key[0]} seed {key[1]}: its records differ from the archive's from iteration {differ}; the run's are"
                " reported and replace them in the archive (git holds the old ones)"
            )
        elif len(entry["records"]) > len(mine):
            runs[key] = entry["records"]
    return runs


def save_archive(archive: Path, archived: dict, whole: dict, reported: dict, diag: dict) -> None:
    """Archive the ``whole`` records of every ``reported`` run and, keyed by the iteration it
    was reported to, its diagnostics; those of other horizons already ``archived`` are kept.
    Each file is written whole or not at all."""
    for (v, seed), recs in reported.items():
        diagnostics = dict(archived.get((v, seed), {}).get("diagnostics", {}))
        if diag.get((v, seed)):
            diagnostics[str(recs[-1]["iteration"])] = diag[v, seed]
        path = archive_path(archive, v, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"records": whole[v, seed], "diagnostics": diagnostics}, sort_keys=True) + "\n")
        tmp.replace(path)


def curve(recs: list[dict], window: int) -> list[dict]:
    """One point per evaluation: the moving average of the last ``window`` validation
    scores, with the run's cumulative decode FLOPs and training wall time there."""
    points, vals, wall, cpu = [], [], 0.0, 0.0
    for r in recs:
        wall += r["wall_s"] - r["eval_s"]
        cpu += r["cpu_s"] * (1 - r["eval_s"] / r["wall_s"]) if r["wall_s"] else 0.0  # evaluate's share left out
        if r["val_score"] is None:
            continue
        if r["iteration"] == 0:  # the initial policy's score, measured with the bootstrap seed's stream
            continue
        vals.append(r["val_score"])
        if len(vals) >= window:
            points.append(
                {
                    "iteration": r["iteration"],
                    "ma": sum(vals[-window:]) / window,
                    "flops": r["cum_decode_flops"],
                    "wall": wall,
                    "cpu": cpu,
                }
            )
    return points


def first_reaching(points: list[dict], target: float) -> dict | None:
    return next((p for p in points if p["ma"] >= target - 1e-9), None)


def headline(runs: dict, window: int, reference: str = "grpo") -> tuple[dict, dict]:
    """Per seed: the peak of the ``reference`` GRPO (GRPO at its best setting) and where it is
    reached; per (variant, seed): the ratios."""
    peaks, ratios = {}, {}
    for (variant, seed), recs in runs.items():
        if variant == reference:
            pts = curve(recs, window)
            if pts:
                best = max(p["ma"] for p in pts)
                peaks[seed] = {"peak": best, **first_reaching(pts, best)}
    for (variant, seed), recs in runs.items():
        if seed not in peaks:
            continue
        g = peaks[seed]
        pts = curve(recs, window)
        hit = first_reaching(pts, g["peak"])
        if hit:
            ratios[variant, seed] = {
                "reached": True,
                "iteration": hit["iteration"],
                "flops_ratio": g["flops"] / hit["flops"],
                "wall_ratio": g["wall"] / hit["wall"],
                "cpu_ratio": g["cpu"] / hit["cpu"],
            }
        elif pts:  # not reached: its whole run's cost bounds the ratio from above
            ratios[variant, seed] = {
                "reached": False,
                "iteration": None,
                "flops_ratio": g["flops"] / recs[-1]["cum_decode_flops"],
                "wall_ratio": g["wall"] / pts[-1]["wall"],
                "cpu_ratio": g["cpu"] / pts[-1]["cpu"],
                "best": max(p["ma"] for p in pts),
            }
    return peaks, ratios


MILESTONES = (0.25, 0.5, 0.75)


def milestone_ratios(runs: dict, window: int, reference: str, fractions: Sequence[float] = MILESTONES) -> dict:
    """Per (variant, seed): the decode FLOPs ratio at GRPO's score ``fraction`` of the way
    through its run (its moving average at the last evaluation there), one entry per
    fraction, None where the run never reaches that score. Beside the headline's peak, these
    say whether a ratio holds at every score GRPO passes or hangs on where its run stopped."""
    out = {}
    for seed in sorted({s for v, s in runs if v == reference}):
        ref = curve(runs[reference, seed], window)
        if not ref:
            continue
        targets = []
        for f in fractions:
            at = [p for p in ref if p["iteration"] <= f * ref[-1]["iteration"]]
            if at:  # GRPO's own cost is where it first reached that score
                targets.append((at[-1]["ma"], first_reaching(ref, at[-1]["ma"])["flops"]))
            else:
                targets.append(None)
        for (variant, s), recs in runs.items():
            if s != seed:
                continue
            pts = curve(recs, window)
            hits = [t and first_reaching(pts, t[0]) for t in targets]
            out[variant, seed] = [t[1] / h["flops"] if t and h else None for t, h in zip(targets, hits)]
    return out


def diagnose(run_dir: Path, upto: int | None = None) -> dict:
    """Where a run's decoding and learning signal went, from its stage artifacts.

    Token counts are the chunks' own tokens (prefixes excluded). A row carries signal when
    the gate lets it through with a non-zero advantage. The critic's discrimination is
    the AUC of its out-of-sample predictions on every pair of the run, and the gap between
    its mean prediction on states that went on to succeed and on those that failed.
    """
    import numpy as np

    from ac2_core import storage
    from ac2_core.math.readiness import auc_error
    from ac2_core.runner.layout import RunLayout

    layout = RunLayout(str(run_dir))
    tokens = {"full": 0, "chunk": 0}
    signal_tokens, rows, signal_rows, chunk_rows, chunk_finished = 0, 0, 0, 0, 0
    abs_adv: dict[str, list[float]] = {"full": [], "chunk": []}
    preds, outs = [], []
    for it in published(layout, upto):
        scored = {r["chunk_id"]: r for r in storage.read_rows(layout.output(it, "scored_chunks"), kind="scored_chunks")}
        lengths = {c["chunk_id"]: len(c["token_ids"]) for c in storage.read_rows(layout.output(it, "chunks"), kind="chunks")}
        for a in storage.read_rows(layout.output(it, "advantages"), kind="advantages"):
            mode, n = scored[a["chunk_id"]]["mode"], lengths[a["chunk_id"]]
            tokens[mode] += n
            rows += 1
            if mode == "chunk":
                chunk_rows += 1
                chunk_finished += scored[a["chunk_id"]]["target_source"] == "reward"
            # a row credited token by token (advantage.full_credit: critic): the mean |A| of its tokens
            size = _mean([abs(x) for x in a["token_advantages"]]) if a["token_advantages"] else abs(a["advantage"])
            if a["weight"] > 0 and size > 1e-6:
                signal_rows += 1
                signal_tokens += n
                abs_adv[mode].append(size)
        if storage.exists(layout.output(it, "critic_pairs")):
            for p in storage.read_rows(layout.output(it, "critic_pairs"), kind="critic_pairs"):
                preds.append(p["prediction"])
                outs.append(p["outcome"])
    total = tokens["full"] + tokens["chunk"]
    preds_a, outs_a = np.asarray(preds), np.asarray(outs)
    on_solution = chunk_groups_on_solution(run_dir, upto)
    won = outs_a >= 0.5
    return {
        "chunk_token_share": tokens["chunk"] / total if total else 0.0,
        "chunk_finished_share": chunk_finished / chunk_rows if chunk_rows else None,
        "signal_row_share": signal_rows / rows if rows else 0.0,
        "signal_token_share": signal_tokens / total if total else 0.0,
        "mean_abs_adv_full": _mean(abs_adv["full"]),
        "mean_abs_adv_chunk": _mean(abs_adv["chunk"]),
        "critic_auc": 1 - auc_error(preds_a, outs_a) if won.any() and (~won).any() else None,
        "critic_gap": float(preds_a[won].mean() - preds_a[~won].mean()) if won.any() and (~won).any() else None,
        **on_solution,
    }


def published(layout, upto: int | None = None) -> Iterator[int]:
    """The iterations 1, 2, ... a run has published, to ``upto`` (all without)."""
    from ac2_core import storage

    it = 1
    while (upto is None or it <= upto) and storage.exists(layout.output(it, "advantages")):
        yield it
        it += 1


def worked_solution(layout):
    """For arith, ``on(problem_id, token_ids)``: whether an answer written so far is still a
    prefix of the problem's worked solution (a DIAGNOSTIC: a run never sees it); None for
    other tasks."""
    from ac2_core import storage
    from ac2_core.models.tokenizer import load_tokenizer
    from ac2_core.tasks.arith import agrees

    problems = {p["problem_id"]: p for p in storage.read_rows(layout.bootstrap("problems"), kind="problems")}
    if not problems or any(p["task"] != "arith" for p in problems.values()):
        return None
    tokenizer = load_tokenizer(layout.bootstrap("actor"))
    return lambda pid, ids: agrees(problems[pid]["solution"], tokenizer.decode(ids, skip_special_tokens=True))


def solution_groups(run_dir: Path, upto: int | None = None) -> list[list[dict]]:
    """A run's chunk groups, each row marked against the task's worked solution (arith only;
    empty for other tasks): ``start`` (the prefix is still on it), ``stays`` (prefix + chunk
    still is; a finished chunk: it succeeded), ``reference`` (the reference its critic was
    shown: None without one, else whether that success follows the worked solution, as a
    success that left it and came back by a second error does not), and the row's
    ``advantage``, ``target`` and ``value_start`` as the run computed them, and whether the chunk
    ``finished`` the answer (its target is then the reward, not V). A DIAGNOSTIC:
    nothing here feeds a run."""
    from ac2_core import storage
    from ac2_core.runner.layout import RunLayout

    layout = RunLayout(str(run_dir))
    on = worked_solution(layout)
    if on is None:
        return []
    groups: dict[str, list[dict]] = {}
    ref_on: dict[str, bool] = {}  # a reference trajectory's agreement with the worked solution, once each
    for it in published(layout, upto):
        prefixes = {p["prefix_id"]: p for p in storage.read_rows(layout.output(it, "prefixes"), kind="prefixes")}
        advantage = {a["chunk_id"]: a["advantage"] for a in storage.read_rows(layout.output(it, "advantages"), kind="advantages")}
        replay = {t["trajectory_id"]: t for t in storage.read_rows(layout.output(it, "replay"), kind="replay")}
        for c in storage.read_rows(layout.output(it, "scored_chunks"), kind="scored_chunks"):
            if c["mode"] != "chunk":
                continue
            pid, ref = c["problem_id"], c["ref_trajectory_id"]
            if ref is not None and ref not in ref_on:
                ref_on[ref] = on(pid, replay[ref]["token_ids"])
            groups.setdefault(c["prefix_id"], []).append({
                "start": on(pid, prefixes[c["prefix_id"]]["prefix_token_ids"]),
                "reference": ref_on.get(ref),
                "stays": (c["reward"] or 0.0) > 0 if c["finished"] else on(pid, c["response_token_ids"]),
                "finished": c["finished"],
                "advantage": advantage[c["chunk_id"]],
                "target": c["target"],
                "value_start": c["value_start"],
            })  # fmt: skip
    return list(groups.values())


def oracle_agreement(run_dir: Path, advantage, upto: int | None = None) -> dict:
    """A DIAGNOSTIC for arith: the cosine between the run's chunk advantages (0 where the gate
    held a row back) and the ones the oracle critic would have given the same chunks, its values
    from the same iteration's whole answers (``stages.oracle_critic``) put through the run's own
    chunk advantage (``advantage``: the config's baseline, std scaling and floor). 1 for an oracle
    arm. Over the blind, learned and oracle critics the pace followed it (research log, section
    20). Empty for other tasks and for a critic baseline (the oracle has no value at a prefix's
    start here)."""
    import torch

    from ac2_core import storage
    from ac2_core.math.advantages import group_advantages
    from ac2_core.models.tokenizer import load_tokenizer
    from ac2_core.runner.layout import RunLayout
    from ac2_core.stages.oracle_critic import oracle_value, whole_answer_rates

    layout = RunLayout(str(run_dir))
    problems = {p["problem_id"]: p for p in storage.read_rows(layout.bootstrap("problems"), kind="problems")}
    if advantage.baseline == "critic" or not problems or any(p["task"] != "arith" for p in problems.values()):
        return {}
    tokenizer = load_tokenizer(layout.bootstrap("actor"))
    dot = run_sq = oracle_sq = 0.0
    for it in published(layout, upto):
        scored = [
            s
            for s in storage.read_rows(layout.output(it, "scored_chunks"), kind="scored_chunks")
            if s["reward"] is not None or not s["finished"]
        ]
        chunks = [s for s in scored if s["mode"] == "chunk"]
        if not chunks:
            continue
        rows = {a["chunk_id"]: a for a in storage.read_rows(layout.output(it, "advantages"), kind="advantages")}
        solution = lambda pid: problems[pid]["solution"]  # noqa: E731
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
        depths, rates = whole_answer_rates(scored, solution, decode)
        targets = [
            s["reward"]
            if s["finished"]
            else oracle_value(solution(s["problem_id"]), decode(s["response_token_ids"]), depths, rates)
            for s in chunks
        ]
        group = {pid: k for k, pid in enumerate(sorted({s["prefix_id"] for s in chunks}))}
        oracle, _ = group_advantages(
            torch.tensor(targets, dtype=torch.float64),
            torch.tensor([group[s["prefix_id"]] for s in chunks]),
            baseline=advantage.baseline,
            scale_std=advantage.scale_std,
            std_floor=advantage.std_floor,
        )
        run = [rows[s["chunk_id"]]["advantage"] * (rows[s["chunk_id"]]["weight"] > 0) for s in chunks]
        dot += sum(a * b for a, b in zip(run, oracle.tolist()))
        run_sq += sum(a * a for a in run)
        oracle_sq += float((oracle**2).sum())
    return {"chunk_oracle_cos": dot / (run_sq * oracle_sq) ** 0.5} if run_sq > 0 and oracle_sq > 0 else {}


def differs(group: list[dict]) -> bool:
    """Whether some continuations of the group stay on the worked solution and some leave it."""
    return len({r["stays"] for r in group}) > 1


def advantage_aim(groups: list[list[dict]], advantages: list[list[float]]) -> tuple[float | None, float | None]:
    """Of the total |A|: the share on groups that differ in staying on, and the share of that
    which points the right way (staying on above the group's mean, leaving below it)."""
    on_differ = total = right = 0.0
    for group, adv in zip(groups, advantages):
        total += sum(abs(a) for a in adv)
        if differs(group):
            on_differ += sum(abs(a) for a in adv)
            mean = sum(r["stays"] for r in group) / len(group)
            right += sum(abs(a) for r, a in zip(group, adv) if a * (r["stays"] - mean) > 0)
    return (on_differ / total if total else None), (right / on_differ if on_differ else None)


REFS = {"noref": None, "ref_on": True, "ref_off": False}  # the reference a chunk group's critic was shown


def chunk_groups_on_solution(run_dir: Path, upto: int | None = None) -> dict:
    """A DIAGNOSTIC for arith: the run's chunk groups measured against the worked solution.

    The share of chunk groups whose prefix was already off it (every continuation fails
    alike), the share whose continuations differ in staying on (the groups an oracle critic
    would give signal), within those how often the run's advantage ranks a continuation that
    stays on above one that leaves, and where the advantages' |A| went (``advantage_aim``);
    then that ranking by the reference the group's critic was shown (``REFS``), with the share
    of the pairs each kind holds; and the critic's mean V at the end of an unfinished chunk whose
    prefix was on the solution, where the chunk stays on it and where it leaves (the oracle's is 0
    there): the size of the step a chunk-mode advantage is made of.
    """
    groups = solution_groups(run_dir, upto)
    if not groups:
        return {}
    mixed = [g for g in groups if differs(g)]
    pairs = [
        (a["advantage"], b["advantage"], g[0]["reference"]) for g in mixed for a in g if a["stays"] for b in g if not b["stays"]
    ]

    def ranked(kept: list) -> float | None:
        return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b, _ in kept) / len(kept) if kept else None

    on_differ, right = advantage_aim(groups, [[r["advantage"] for r in g] for g in groups])
    ends = [r for g in groups for r in g if r["start"] and not r["finished"]]
    by_reference = {name: [p for p in pairs if p[2] is shown] for name, shown in REFS.items()}
    return {
        "chunk_start_off": sum(not g[0]["start"] for g in groups) / len(groups),
        "chunk_mixed": len(mixed) / len(groups),
        "chunk_within_auc": ranked(pairs),
        "chunk_abs_a_on_differ": on_differ,
        "chunk_abs_a_right": right,
        **{f"chunk_pairs_{name}": len(kept) / len(pairs) if pairs else None for name, kept in by_reference.items()},
        **{f"chunk_within_auc_{name}": ranked(kept) for name, kept in by_reference.items()},
        "chunk_v_stays": _mean([r["target"] for r in ends if r["stays"]]),
        "chunk_v_leaves": _mean([r["target"] for r in ends if not r["stays"]]),
    }


def departure(on, problem_id: str, ids: list[int]) -> int:
    """The length of the shortest prefix of ``ids`` off the worked solution (``on``); agreement only ever ends."""
    lo, hi = 0, len(ids)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if on(problem_id, ids[:mid]) else (lo, mid)
    return hi


def fork_choices(run_dir: Path, digits: Sequence[int], *, span: int = 4, upto: int | None = None) -> dict:
    """A DIAGNOSTIC for arith: how often the whole answers take the misconception's fork
    (``tasks.arith.trigger_choices``), over the run's first and last ``span`` iterations: the
    misconceived share of the triggers reached on the worked solution, and the share of the
    failed answers that left the solution there rather than by a slip. ``digits``: the
    misconception's trigger digits (``warm_start.misconception_digits``)."""
    from ac2_core import storage
    from ac2_core.models.tokenizer import load_tokenizer
    from ac2_core.runner.layout import RunLayout
    from ac2_core.tasks.arith import terms_of, trigger_choices

    layout = RunLayout(str(run_dir))
    if worked_solution(layout) is None:
        return {}
    prompts = {p["problem_id"]: p["prompt"] for p in storage.read_rows(layout.bootstrap("problems"), kind="problems")}
    tokenizer = load_tokenizer(layout.bootstrap("actor"))
    last = min(layout.completed_iterations(), upto or sys.maxsize)
    out = {}
    # both windows within the iterations the run has (a run still under way may have fewer than span)
    for name, its in (("start", range(1, min(span, last) + 1)), ("end", range(max(last - span + 1, 1), last + 1))):
        taken, reached, failed, by_fork = 0, 0, 0, 0
        for it in its:
            for c in storage.read_rows(layout.output(it, "scored_chunks"), kind="scored_chunks"):
                if c["mode"] != "full" or c["reward"] is None:
                    continue
                text = tokenizer.decode(c["response_token_ids"], skip_special_tokens=True)
                choices = trigger_choices(terms_of(prompts[c["problem_id"]]), text, digits)
                taken, reached = taken + sum(choices), reached + len(choices)
                if c["reward"] < 1:
                    failed += 1
                    by_fork += bool(choices) and choices[-1]
        out[f"fork_taken_{name}"] = taken / reached if reached else None
        out[f"fork_failures_{name}"] = by_fork / failed if failed else None
    return out


def credit_aim(run_dir: Path, chunk_tokens: int, *, from_iteration: int = 5, upto: int | None = None) -> dict:
    """A DIAGNOSTIC for arith: where the critic's credit along whole answers put a failed
    answer's blame. For each credited answer that failed after leaving the worked solution,
    the share of its |A| (summed over tokens) on the segment where it first left, and on its
    last segment; means over those answers. The oracle at lambda 0 puts all of it on the
    slip's segment; a flat critic puts all of it on the last.

    Also why: the critic's out-of-sample V at the cuts of finished full-mode answers (iterations
    ``from_iteration`` on, past the critic's first fits): on successes, and on failed answers that
    left the solution, up to the segment where they left and after it."""
    from ac2_core import storage
    from ac2_core.runner.layout import RunLayout

    layout = RunLayout(str(run_dir))
    on = worked_solution(layout)
    if on is None:
        return {}
    on_slip, on_last, v_success, v_before, v_after = [], [], [], [], []
    for it in published(layout, upto):
        credited = {
            a["chunk_id"]: a["token_advantages"]
            for a in storage.read_rows(layout.output(it, "advantages"), kind="advantages")
            if a["token_advantages"] and a["weight"] > 0
        }
        values: dict[str, dict[int, float]] = {}
        if it >= from_iteration:
            for pair in storage.read_rows(layout.output(it, "critic_pairs"), kind="critic_pairs"):
                values.setdefault(pair["trajectory_id"], {})[pair["cut"]] = pair["prediction"]
        for c in storage.read_rows(layout.output(it, "scored_chunks"), kind="scored_chunks"):
            credit, ids, cuts = credited.get(c["chunk_id"]), c["response_token_ids"], values.get(c["chunk_id"], {})
            whole = c["mode"] == "full" and c["finished"]
            if (c["reward"] or 0.0) > 0:
                v_success += list(cuts.values()) if whole else []
                continue
            if on(c["problem_id"], ids):
                continue
            slip = (departure(on, c["problem_id"], ids) - 1) // chunk_tokens * chunk_tokens
            for cut, v in cuts.items() if whole else ():
                (v_before if cut <= slip else v_after).append(v)
            mass = [abs(x) for x in credit or []]
            total = sum(mass)
            if total > 0:
                last = (len(mass) - 1) // chunk_tokens * chunk_tokens
                on_slip.append(sum(mass[slip : slip + chunk_tokens]) / total)
                on_last.append(sum(mass[last:]) / total)
    return {
        "credit_answers": len(on_slip),
        "credit_on_slip": _mean(on_slip),
        "credit_on_last": _mean(on_last),
        "v_success": _mean(v_success),
        "v_before_slip": _mean(v_before),
        "v_after_slip": _mean(v_after),
    }


def bootstrap_ci(values: list[float], *, resamples: int = 10_000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median over ``values`` (the seeds)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    v = np.asarray(values, dtype=float)
    medians = np.median(v[rng.integers(0, len(v), size=(resamples, len(v)))], axis=1)
    lo, hi = np.quantile(medians, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def eval_standard_error(score: float, answers: int) -> float:
    """Binomial standard error of one evaluation's mean of ``answers`` 0/1 rewards."""
    return (score * (1 - score) / answers) ** 0.5 if answers else float("nan")


def _median_spread(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{statistics.median(values):.2f} [{min(values):.2f}–{max(values):.2f}]"


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _fmt(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def budget_note(runs: dict, args: argparse.Namespace) -> list[str]:
    """With ``--reference-iterations``: a paragraph saying that GRPO's peak is its best within that
    budget, and what share of GRPO's decoding the runs that go on past it spent to their horizon."""
    if not args.reference_iterations:
        return []
    budget = {s: recs[-1] for (v, s), recs in runs.items() if v == args.reference}
    shares = [
        recs[-1]["cum_decode_tokens"] / budget[s]["cum_decode_tokens"]
        for (v, s), recs in runs.items()
        if v != args.reference
        and s in budget
        and budget[s]["cum_decode_tokens"]
        and recs[-1]["iteration"] > args.reference_iterations  # a run that stops within the budget goes no further
    ]
    return [
        "",
        f"**Equal decode budgets, not equal iterations.** GRPO's run is cut at iteration {args.reference_iterations}"
        " (`--reference-iterations`): its peak is its best within that budget. The other runs go on to their own"
        f" `run.iterations`, having decoded at most {max(shares, default=float('nan')):.2f} of GRPO's budget by"
        " then, so every ratio here compares the decoding each needs to reach a score GRPO reached within its budget."
        " A run that reaches it past GRPO's iteration count is not faster per iteration, only cheaper.",
    ]


def run_diagnostics(runs: dict, args: argparse.Namespace, archived: dict) -> dict:
    """Per run, the diagnostics of its stage artifacts to the iteration its records reach; a
    run whose artifacts are gone (a fresh clone) takes the archived ones of that horizon, or none."""
    from ac2_core.runner.layout import RunLayout

    cfgs = configs_for(args, 0, sorted({v for v, _ in runs}))  # a seed changes no size and no task
    diag = {}
    for v, seed in runs:
        run_dir, upto = Path(args.out) / f"seed{seed}" / v, runs[v, seed][-1]["iteration"]
        if RunLayout(str(run_dir)).completed_iterations() < upto:
            diag[v, seed] = archived.get((v, seed), {}).get("diagnostics", {}).get(str(upto), {})
            continue
        diag[v, seed] = diagnose(run_dir, upto)
        diag[v, seed].update(credit_aim(run_dir, cfgs[v].rollout.chunk_tokens, upto=upto))
        diag[v, seed].update(fork_choices(run_dir, cfgs[v].warm_start.misconception_digits, upto=upto))
        diag[v, seed].update(oracle_agreement(run_dir, cfgs[v].advantage, upto=upto))
    return diag


def render(runs: dict, args: argparse.Namespace, elapsed: float | None, diag: dict) -> str:
    peaks, ratios = headline(runs, args.smooth, args.reference)
    milestones = milestone_ratios(runs, args.smooth, args.reference)
    standard_errors = [
        eval_standard_error(r["val_score"], args.val_answers)
        for recs in runs.values()
        for r in recs
        if r["val_score"] is not None
    ]
    variants = [v for v in VARIANTS if any(k[0] == v for k in runs)]
    seeds = sorted({s for _, s in runs})
    lines = [
        "# RL efficiency: AC2 against GRPO on decode FLOPs",
        "",
        "Reproduce: make each variant's runs with `python bench/rl_efficiency.py --variants V --seeds S`"
        " and the `--set`s, `--out` and `--reference` of the command below, GRPO's first (a run's records do not"
        " depend on which other variants or seeds its invocation holds: reruns reproduce them exactly); a run"
        " cut shorter, such as GRPO's, adds `--set run.iterations=N` after the others. Then that command, with"
        " `--report-only`, rebuilds this file from the runs under"
        f" `{Path(args.out).relative_to(ROOT) if Path(args.out).is_relative_to(ROOT) else args.out}`"
        " (with `--variants`, only those variants and `--seeds`), or from the archive on a fresh clone."
        f" This file was last written by `{args.command}`. Machine: "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} when written"
        + (f"; this invocation took {elapsed / 60:.1f} min." if elapsed else "."),
        "",
        f"Config: `{Path(args.config).relative_to(ROOT) if Path(args.config).is_relative_to(ROOT) else args.config}`"
        f" with {', '.join(f'`{k}={v}`' for k, v in {**BENCH_SIZE, **dict(args.set)}.items())}; seeds {seeds}."
        f" Validation: moving average of the last {args.smooth} evaluations (iterations ≥ 1)."
        f" Every run adopts one warm start (seed {args.bootstrap_seed}),"
        f" whose validation score is {next(iter(runs.values()))[0]['val_score']:.3f}.",
        "",
        "Variants (what each changes): "
        + "; ".join(f"**{v}** {json.dumps(VARIANTS[v]) if VARIANTS[v] else '(the config as it is)'}" for v in variants)
        + ".",
        "",
        "## Headline: GRPO's decode FLOPs / the run's, at the first iteration each reaches GRPO's peak",
        "",
        f"GRPO here is **{args.reference}** ({json.dumps(VARIANTS[args.reference])}): the GRPO the ratios are"
        " measured against. Median over seeds [min–max]. A run that never reaches the peak counts with the bound its whole"
        " run gives (marked ≤); > 1 means fewer decode FLOPs than GRPO. Wall and CPU time count every"
        " stage but `evaluate`, critic scoring and training included. Wall-time ratios compare runs of"
        " one invocation (the same load); a variant run in a later invocation is compared with GRPO's"
        " wall time from another, so read its CPU-time ratio (each process has one thread).",
        *budget_note(runs, args),
        "",
        "| variant | decode FLOPs ratio | 95% bootstrap CI of the median | wall-time ratio | CPU-time ratio | reached"
        " | per seed (FLOPs ratio @ iteration) |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for v in variants:
        rs = [ratios[v, s] for s in seeds if (v, s) in ratios]
        bound = "≤ " if any(not r["reached"] for r in rs) else ""
        lo, hi = bootstrap_ci([r["flops_ratio"] for r in rs]) if rs else (float("nan"), float("nan"))
        per_seed = ", ".join(
            f"s{s}: {ratios[v, s]['flops_ratio']:.2f} @ {ratios[v, s]['iteration']}"
            if ratios[v, s]["reached"]
            else f"s{s}: ≤{ratios[v, s]['flops_ratio']:.2f} (best {ratios[v, s]['best']:.3f})"
            for s in seeds
            if (v, s) in ratios
        )
        lines.append(
            f"| {v} | {bound}{_median_spread([r['flops_ratio'] for r in rs])} | [{lo:.2f}–{hi:.2f}]"
            f" | {bound}{_median_spread([r['wall_ratio'] for r in rs])}"
            f" | {bound}{_median_spread([r['cpu_ratio'] for r in rs])}"
            f" | {sum(r['reached'] for r in rs)}/{len(rs)} | {per_seed} |"
        )
    lines += [
        "",
        "GRPO's peak per seed: "
        + ", ".join(f"s{s}: {p['peak']:.3f} at iteration {p['iteration']}" for s, p in sorted(peaks.items()))
        + (
            f" (spread over seeds: {min(p['peak'] for p in peaks.values()):.3f}–{max(p['peak'] for p in peaks.values()):.3f})."
            if peaks
            else "."
        ),
        "",
        "The same ratio at the score GRPO had "
        + ", ".join(f"{f:.0%}" for f in MILESTONES)
        + " of the way through its run (median over the seeds that reach it [min–max], seeds reaching it):"
        " a ratio that holds at every score GRPO passes does not hang on where GRPO's run stopped.",
        "",
        "| variant | " + " | ".join(f"at {f:.0%} of GRPO's run" for f in MILESTONES) + " |",
        "|---|" + "---:|" * len(MILESTONES),
        *(
            f"| {v} | "
            + " | ".join(
                f"{_median_spread([x for x in col if x is not None])} ({sum(x is not None for x in col)}/{len(col)})"
                for col in zip(*(m for (mv, _), m in milestones.items() if mv == v))
            )
            + " |"
            for v in variants
            if any(mv == v for mv, _ in milestones)
        ),
        "",
        f"Evaluation noise: one evaluation grades {args.val_answers:,} answers; at the scores seen its binomial standard"
        f" error is {_fmt(_mean(standard_errors), '.4f')}"
        " (mean over evaluations), and a moving average of evaluations on the same problems is no less noisy than"
        " one of them in the problems it draws. A difference inside these is a tie.",
        "",
        "## Per run",
        "",
        "| variant | seed | iterations | val start → end (MA) | peak MA | decode tokens | decode FLOPs"
        " | critic FLOPs | train FLOPs | train wall s | ready share | chunk groups | critic error |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v in variants:
        for s in seeds:
            recs = runs.get((v, s))
            if not recs:
                continue
            pts, last = curve(recs, args.smooth), recs[-1]
            steps = recs[1:]
            groups = sum(r["chunk_groups"] + r["full_groups"] for r in steps)
            lines.append(
                f"| {v} | {s} | {last['iteration']} | {recs[0]['val_score']:.3f} → "
                f"{_fmt(pts[-1]['ma'] if pts else None, '.3f')} | {_fmt(max((p['ma'] for p in pts), default=None), '.3f')}"
                f" | {last['cum_decode_tokens']:,} | {last['cum_decode_flops']:.3e} | {last['cum_critic_flops']:.2e}"
                f" | {last['cum_train_flops']:.2e} | {sum(r['wall_s'] - r['eval_s'] for r in steps):.0f}"
                f" | {_fmt(_mean([r['readiness_share'] for r in steps]), '.2f')}"
                f" | {sum(r['chunk_groups'] for r in steps) / groups if groups else 0:.2f}"
                f" | {_fmt(_mean([r['critic_error'] for r in steps]), '.3f')} |"
            )
    lines += [
        "",
        "## Where the decoding and the learning signal went (median over seeds)",
        "",
        "| variant | decode tokens / GRPO's, per iteration | decode saved against full rollouts, per iteration"
        " | chunk-mode share of decoded tokens | chunks that finish | rows with signal | decoded tokens with signal"
        " | mean abs A full / chunk | critic AUC (pooled) | critic AUC within iterations | critic V gap (success − failure) |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    grpo_tokens = {s: runs[v, s][-1]["cum_decode_tokens"] / runs[v, s][-1]["iteration"] for v, s in runs if v == args.reference}

    def med(v: str, field: str, spec: str) -> str:
        values = [diag[v, s].get(field) for s in seeds if (v, s) in diag and diag[v, s].get(field) is not None]
        return _fmt(statistics.median(values) if values else None, spec)

    for v in variants:
        per_it = [
            runs[v, s][-1]["cum_decode_tokens"] / runs[v, s][-1]["iteration"] / grpo_tokens[s]
            for s in seeds
            if (v, s) in runs and s in grpo_tokens
        ]
        saved = [
            _mean([1 - r["decode_tokens"] / r["full_rollout_tokens"] for r in runs[v, s][1:] if r.get("full_rollout_tokens")])
            for s in seeds
            if (v, s) in runs
        ]
        within = [_mean([r.get("critic_auc") for r in runs[v, s][1:]]) for s in seeds if (v, s) in runs]

        def median_of(values: list) -> str:
            values = [x for x in values if x is not None]
            return _fmt(statistics.median(values) if values else None, ".3f")

        lines.append(
            f"| {v} | {_fmt(statistics.median(per_it) if per_it else None, '.3f')}"
            f" | {median_of(saved)}"
            f" | {med(v, 'chunk_token_share', '.3f')} | {med(v, 'chunk_finished_share', '.2f')}"
            f" | {med(v, 'signal_row_share', '.3f')} | {med(v, 'signal_token_share', '.3f')}"
            f" | {med(v, 'mean_abs_adv_full', '.3f')} / {med(v, 'mean_abs_adv_chunk', '.3f')}"
            f" | {med(v, 'critic_auc', '.3f')}"
            f" | {median_of(within)}"
            f" | {med(v, 'critic_gap', '.3f')} |"
        )

    def table(shown_by, intro: str, header: str, row) -> list[str]:
        """A diagnostic table of the variants with a run whose diagnostics ``shown_by`` accepts; none without any."""
        shown = [v for v in variants if any(shown_by(diag[k]) for k in diag if k[0] == v)]
        if not shown:
            return []
        return ["", intro, "", header, "|---|" + "---:|" * header.count(" | "), *map(row, shown)]

    lines += table(
        lambda d: d.get("chunk_mixed") is not None,
        "Chunk groups against the task's worked solution (arith; a DIAGNOSTIC, nothing here feeds a run):",
        "| variant | prefix already off the solution | continuations differ in staying on"
        " | advantage ranks staying on above leaving, within those | share of |A| on those | of which points right"
        " | V at an unfinished chunk's end from a prefix on it: stays on / leaves"
        " | cosine of the chunk advantages with the oracle's on the same chunks |",
        lambda v: (
            f"| {v} | {med(v, 'chunk_start_off', '.2f')} | {med(v, 'chunk_mixed', '.2f')}"
            f" | {med(v, 'chunk_within_auc', '.3f')} | {med(v, 'chunk_abs_a_on_differ', '.3f')}"
            f" | {med(v, 'chunk_abs_a_right', '.3f')}"
            f" | {med(v, 'chunk_v_stays', '.3f')} / {med(v, 'chunk_v_leaves', '.3f')}"
            f" | {med(v, 'chunk_oracle_cos', '.3f')} |"
        ),
    )
    lines += table(
        lambda d: d.get("chunk_pairs_noref") is not None,
        "The same ranking by the reference the critic was shown (arith; a DIAGNOSTIC): the share of the"
        " (staying on, leaving) pairs whose prefix had no reference, a reference on the worked solution, or a"
        " success off it (one that left the solution and came back by a second error), and within each the share"
        " ranked right.",
        "| variant | no reference: pairs, ranked right | on the solution: pairs, ranked right"
        " | off the solution: pairs, ranked right |",
        lambda v: "".join(
            [f"| {v} |", *(f" {med(v, f'chunk_pairs_{n}', '.2f')}, {med(v, f'chunk_within_auc_{n}', '.3f')} |" for n in REFS)]
        ),
    )
    lines += table(
        lambda d: d.get("credit_answers"),
        "The critic's credit along whole answers (arith; a DIAGNOSTIC): of a credited answer that failed"
        " after leaving the worked solution, the share of its |A| on the segment where it left, and on its"
        " last segment (mean over such answers). Why: the critic's out-of-sample V at the cuts of finished"
        " full-mode answers from iteration 5 on, on successes and, on failed answers that left the solution,"
        " up to the segment where they left and after it (a calibrated V after a slip is about the share of such"
        " answers that still succeed, well under 0.1 on the toy).",
        "| variant | answers | on the slip's segment | on the last segment | V on successes | V up to the slip | V after it |",
        lambda v: (
            f"| {v} | {med(v, 'credit_answers', '.0f')} | {med(v, 'credit_on_slip', '.3f')}"
            f" | {med(v, 'credit_on_last', '.3f')} | {med(v, 'v_success', '.3f')} | {med(v, 'v_before_slip', '.3f')}"
            f" | {med(v, 'v_after_slip', '.3f')} |"
        ),
    )
    lines += table(
        lambda d: d.get("fork_taken_start") is not None,
        "The misconception's fork in the whole answers (arith; a DIAGNOSTIC): at the triggers an answer"
        " reached on the worked solution (a term whose ones digit is one of warm_start.misconception_digits"
        " and whose ones place carries), the share where it"
        " dropped the carry; and the share of the failed answers that left the solution there rather than"
        " by a slip. Over the first and the last 4 iterations.",
        "| variant | misconceived at a trigger, start → end | failures at the fork, start → end |",
        lambda v: (
            f"| {v} | {med(v, 'fork_taken_start', '.3f')} → {med(v, 'fork_taken_end', '.3f')}"
            f" | {med(v, 'fork_failures_start', '.3f')} → {med(v, 'fork_failures_end', '.3f')} |"
        ),
    )
    lines += [
        "",
        "Rows with signal: chunks the gate lets through with a non-zero advantage (a group whose"
        " targets are all equal has none). Critic AUC and V gap: its out-of-sample predictions on every"
        " (state, outcome) pair of the run, before it trained on them.",
        "",
        f"![validation score against cumulative decode FLOPs]({Path(args.results).with_suffix('.png').name})",
        "",
        "Ready share: ready problems / problems with a readiness window, mean over iterations."
        " Chunk groups: share of groups in chunk mode. Critic error: binned calibration error of"
        " the critic on each iteration's out-of-sample pairs, mean over iterations.",
        "",
    ]
    return "\n".join(lines)


def plot(runs: dict, window: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = dict(zip(VARIANTS, itertools.cycle(plt.get_cmap("tab20").colors)))
    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(8, 5))
    for (v, s), recs in sorted(runs.items()):
        pts = curve(recs, window)
        if pts:
            ax.plot(
                [p["flops"] for p in pts],
                [p["ma"] for p in pts],
                color=colors[v],
                linestyle=styles[s % len(styles)],
                label=f"{v} seed {s}",
            )
    ax.set_xlabel("cumulative decode FLOPs")
    ax.set_ylabel(f"validation score (moving average of {window})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def write_results(args: argparse.Namespace, elapsed: float | None) -> None:
    archive = archive_dir(args)
    archived = load_archive(archive)
    runs = whole = merge_runs(load_runs(Path(args.out)), archived)
    if unknown := sorted({v for v, _ in runs} - VARIANTS.keys()):
        # runs of another invocation (or version) of this script in the same folder: the tables and
        # the plot are keyed by VARIANTS, so they are left out of both, by name
        print(f"not reported, variants this script does not define: {', '.join(unknown)}", flush=True)
    runs = {k: v for k, v in runs.items() if k[0] in VARIANTS}
    if args.only:
        runs = {k: v for k, v in runs.items() if k[0] in args.variants and k[1] in args.seeds}
    if not runs:
        raise SystemExit(f"no records under {args.out} or {archive}: run the benchmark first")
    # a run taken further by a later invocation is reported to this invocation's run.iterations
    upto = {v: cfg.run.iterations for v, cfg in configs_for(args, 0, sorted({v for v, _ in runs})).items()}
    if args.reference_iterations and args.reference in upto:  # GRPO's budget, shorter than the others' horizon
        upto[args.reference] = min(upto[args.reference], args.reference_iterations)
    runs = {k: [r for r in recs if r["iteration"] <= upto[k[0]]] for k, recs in runs.items()}
    if empty := sorted(k for k, recs in runs.items() if len(recs) < 2):
        # a run stopped before its first iteration was recorded: only the initial policy's score
        print("not reported, no iteration recorded yet: " + ", ".join(f"{v} seed {seed}" for v, seed in empty), flush=True)
        runs = {k: recs for k, recs in runs.items() if len(recs) >= 2}
    if not any(v == args.reference for v, _ in runs):
        raise SystemExit(f"--reference {args.reference}: no runs of it under {args.out} (among the reported variants)")
    kept = ""
    results = Path(args.results)
    if results.exists() and MARKER in results.read_text():
        kept = results.read_text().split(MARKER, 1)[1]
    diag = run_diagnostics(runs, args, archived)
    text = render(runs, args, elapsed, diag) + "\n" + MARKER + (kept or "\n")
    plot(runs, args.smooth, results.with_suffix(".png"))
    tmp = results.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(results)
    print(text.split(MARKER)[0])
    save_archive(archive, archived, whole, runs, diag)
    print(f"wrote {results} and {results.with_suffix('.png')}; the runs' records are archived under {archive}")


# ---------------------------------------------------------------- main


def key_value(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set takes KEY=VALUE (dotted keys), found {text!r}")
    return key, parse_value(value)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(TOY))
    p.add_argument(
        "--variants", nargs="+", choices=list(VARIANTS),
        help=f"default: {' '.join(MAIN)}; with --report-only, the report covers only these variants and --seeds",
    )  # fmt: skip
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--bootstrap-seed", type=int, default=0, help="seed of the one warm start every run adopts")
    p.add_argument("--set", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help="config override for every run (dotted key), e.g. --set run.iterations=60")  # fmt: skip
    p.add_argument("--smooth", type=int, default=3, help="evaluations in the moving average")
    p.add_argument("--jobs", type=int, default=3, help="seeds run at once, one process each")
    p.add_argument("--threads", type=int, default=1, help="torch threads per process")
    p.add_argument("--out", default=str(ROOT / "bench" / "runs" / "rl_efficiency"))
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--report-only", action="store_true")
    p.add_argument(
        "--archive", default=str(ARCHIVE),
        help="where reported runs are archived, in a folder named as --out's; a report reads a run whose folder is gone"
        " from there",
    )  # fmt: skip
    p.add_argument(
        "--reference",
        default="grpo",
        choices=[v for v, keys in VARIANTS.items() if keys.get("algorithm") == "grpo"],
        help="the GRPO variant whose peak the ratios are measured at: GRPO at its best setting (it must be among the runs)",
    )
    p.add_argument(
        "--reference-iterations", type=int, default=None, metavar="N",
        help="report the --reference GRPO's runs to iteration N only (its decode budget), the others to run.iterations:"
        " the decoding each needs to reach GRPO's peak within that budget (default: every run to run.iterations)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.reference_iterations is not None and args.reference_iterations < 1:
        p.error(f"--reference-iterations must be at least 1; got {args.reference_iterations}")
    args.only = args.report_only and args.variants is not None
    args.variants = args.variants or MAIN
    args.command = "python bench/rl_efficiency.py " + " ".join(sys.argv[1:] if argv is None else argv)

    from ac2_core.config import ConfigError

    try:  # every config is validated before anything starts
        for s in args.seeds:
            configs_for(args, s)
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    if (
        not args.report_only
        and args.reference not in args.variants
        and not (Path(args.out) / f"seed{args.seeds[0]}" / args.reference).is_dir()
        and not archive_path(archive_dir(args), args.reference, args.seeds[0]).exists()
    ):
        # the report measures every run against the reference: found missing only after the runs, it would cost the report
        raise SystemExit(
            f"--reference {args.reference}: neither among --variants nor run under {args.out} (or archived); run it beside the"
            " variants, or name the GRPO variant that is (e.g. --reference grpo_s2)"
        )
    probe = configs_for(args, args.seeds[0])[args.variants[0]]
    args.val_answers = probe.task.val_size * probe.eval.samples_per_problem
    t0 = time.perf_counter()
    if not args.report_only:
        print(f"reproduce: {args.command}", flush=True)
        make_bootstrap(args)
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
        with ProcessPoolExecutor(
            max_workers=args.jobs, mp_context=get_context("spawn"), initializer=exit_with_parent, initargs=(os.getpid(),)
        ) as pool:
            for f in [pool.submit(run_seed, args, s) for s in args.seeds]:
                f.result()
    write_results(args, None if args.report_only else time.perf_counter() - t0)


if __name__ == "__main__":
    main()
