"""ac2_core.threads: the thread count from affinity, cgroup quota, OMP_NUM_THREADS and model.threads,
and OpenMP's wait policy. Timings live in bench/contention.py, never here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from ac2_core import launch, threads
from ac2_core.config import ConfigError, config_from_json, load_config
from ac2_core.models.store import ModelStore
from tests.conftest import TOY, tiny_config


def _cgroup(tmp_path, proc_lines: list[str], files: dict[str, str]):
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    root.mkdir(exist_ok=True)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("\n".join(proc_lines) + "\n")
    return root, proc


def test_a_v2_quota_is_read_along_the_cgroup_path_and_the_tightest_wins(tmp_path):
    root, proc = _cgroup(
        tmp_path,
        ["0::/kubepods/pod1/ctr"],
        {
            "cgroup.controllers": "cpu\n",
            "kubepods/cpu.max": "max 100000\n",
            "kubepods/pod1/cpu.max": "250000 100000\n",  # 2.5 CPUs for the pod
            "kubepods/pod1/ctr/cpu.max": "150000 100000\n",  # 1.5 for the container
        },
    )
    assert threads.cgroup_quota(root, proc) == 1.5
    affinity = len(os.sched_getaffinity(0))
    count, why = threads.usable_cpus(root, proc)
    assert count == min(affinity, 2)  # 1.5 rounded up, never more than the affinity mask
    assert why == f"the CPUs this process may use: affinity {affinity}, cgroup quota 1.5"


def test_a_v1_quota_and_a_container_that_sees_only_its_own_mount(tmp_path):
    # inside a container /proc/self/cgroup names the host's path, which is not mounted: the mount's root counts
    root, proc = _cgroup(
        tmp_path,
        ["4:memory:/docker/abc", "2:cpu,cpuacct:/docker/abc", "0::/"],
        {"cpu,cpuacct/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"},
    )
    assert threads.cgroup_quota(root, proc) == 0.5
    assert threads.usable_cpus(root, proc)[0] == 1  # at least one thread


def test_no_quota_leaves_the_affinity_mask(tmp_path):
    root, proc = _cgroup(tmp_path, ["1:cpu:/", "0::/"], {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"})
    assert threads.cgroup_quota(root, proc) is None
    assert threads.usable_cpus(root, proc) == (
        len(os.sched_getaffinity(0)),
        f"the CPUs this process may use: affinity {len(os.sched_getaffinity(0))}, no cgroup quota",
    )
    assert threads.cgroup_quota(tmp_path / "absent", tmp_path / "absent-proc") is None


def test_model_threads_wins_then_omp_num_threads_then_the_usable_cpus(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads.choose_threads(5) == threads.Threads(5, "model.threads")
    assert threads.choose_threads(None) == threads.Threads(3, "OMP_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")  # a count per nesting level: the first is the pool's
    assert threads.choose_threads(None).count == 4
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert threads.choose_threads(None).count == threads.usable_cpus()[0]


@pytest.mark.parametrize("value", ["zero", "0", "-2"])
def test_a_bad_omp_num_threads_is_named(monkeypatch, value):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    with pytest.raises(ValueError, match=rf"OMP_NUM_THREADS must be a positive integer; found '{value}'"):
        threads.choose_threads(None)


def test_a_model_store_sets_torchs_threads_when_it_resolves_the_device(monkeypatch):
    before = torch.get_num_threads()
    try:
        store = ModelStore(tiny_config(model__threads=1))
        assert store.device == torch.device("cpu")
        assert store.threads == threads.Threads(1, "model.threads") and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_threads_say_how_not_what_so_hashes_ignore_them():
    base = load_config(TOY)
    other = load_config(TOY, {"model.threads": 1})
    assert other.config_hash() == base.config_hash() and other.bootstrap_hash() == base.bootstrap_hash()
    with pytest.raises(ConfigError, match=r"model\.threads"):
        load_config(TOY, {"model.threads": 0})


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, "PASSIVE"),  # nothing set: ac2 makes waits passive
        ({"OMP_WAIT_POLICY": "active"}, "active"),  # a user's choice stays
        ({"GOMP_SPINCOUNT": "300000"}, None),  # a spin count says how to wait: no policy is added
    ],
)
def test_importing_ac2_core_makes_openmp_waits_passive_unless_the_environment_says_otherwise(env, expected):
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    probe = "import os, ac2_core; print(os.environ.get('OMP_WAIT_POLICY'))"
    out = subprocess.run([sys.executable, "-c", probe], env={**clean, **env}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(expected)


def test_launched_processes_share_the_threads_of_the_process_that_launches_them(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.per_process(5, 2) == 2 and threads.per_process(1, 2) == 1  # at least one each
    assert threads.per_process(None, 1) == threads.usable_cpus()[0]
    cfg = tiny_config(model__threads=4)
    each = threads.per_process(cfg.model.threads, 2)
    with launch.scratch("threads") as folder:
        launch.write_spec(folder, {"config": launch.child_config(cfg, each)})
        launch.spawn("tests.unit.threads_probe", folder, None, 2, threads_each=each, what="probe")
        reports = [launch.read_result(folder, rank) for rank in range(2)]
    # model.threads 4 over 2 processes: 2 each, not 4 each (8 threads on 4 CPUs)
    assert reports == [{"torch": 2, "why": "model.threads", "env": "2"}] * 2
    assert config_from_json(launch.child_config(cfg, each)).config_hash() == cfg.config_hash()
