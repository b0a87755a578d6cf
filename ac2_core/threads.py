"""How many CPU threads torch runs, and how its threads wait for each other.

Left alone, torch sizes its OpenMP pool by the cores the machine has, not by the CPUs a
container's quota lets the process use, and GNU OpenMP (torch's CPU wheels bundle it) keeps
a waiting thread spinning for about 3 ms before it sleeps. Where other work runs, the
spinning thread holds a core that the thread it waits for needs, and every one of the
thousands of small parallel regions of a decode step pays for it: with one busy process
beside it on 2 cores, a 2-iteration toy run took 5 min 11 s spinning and 38 s with passive
waits (one measurement, load about 4.5; ``bench/contention.py --baseline`` repeats it).
So, for every process of a run:

- OpenMP threads wait passively (``OMP_WAIT_POLICY=PASSIVE``). OpenMP reads the setting
  once, when torch loads it, so ``wait_passively`` runs when ``ac2_core`` is imported;
  child processes (kfp.local's tasks, the task host) inherit it. A value set beforehand
  for ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is left as it is.
- The thread count (intra- and inter-op) is ``model.threads`` when set, else
  ``OMP_NUM_THREADS`` when set, else the CPUs this process may use: its affinity mask,
  bounded by the cgroup CPU quota (rounded up). ``ModelStore.device`` applies it, so a
  stage sets it before it loads its first model.
- A stage that launches N processes (``ac2_core.launch``: data-parallel updates, sharded
  generation and scoring) gives each of them its share, ``per_process``: the count this
  process would use, divided by N (at least 1), as ``model.threads`` in their config and
  ``OMP_NUM_THREADS`` in their environment. N processes then fill the CPUs one would,
  instead of N times over.

The count changes how float sums are split, so a seed reproduces a CPU run's bytes with the
same count; the runners log it. The wait policy changes no result.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def wait_passively() -> None:
    """Make OpenMP threads sleep at once when they wait, unless the environment already says how they wait."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def cgroup_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """CPUs the cgroup CPU quota allows this process (e.g. 1.5), the tightest along its cgroup
    path; None when no quota is set or no cgroup file system is visible. cgroup v2 and v1."""
    quotas = [q for folder in _cgroup_folders(root, proc_cgroup) if (q := _quota_in(folder)) is not None]
    return min(quotas) if quotas else None


def _cgroup_folders(root: Path, proc_cgroup: Path) -> list[Path]:
    """The folders that may hold this process's CPU limits: its cgroup and each parent, for
    v2 (``0::/path``) and v1 (``N:cpu,cpuacct:/path``); inside a container the path may name
    the host's hierarchy, which is not mounted, so the mount's root is always a candidate."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    unified = root if (root / "cgroup.controllers").exists() else root / "unified"  # v2 alone, or beside v1
    mounts = [unified]
    relative = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            relative.append((unified, path))
        elif "cpu" in controllers.split(","):
            mount = next((m for m in (root / controllers, root / "cpu", root / "cpu,cpuacct") if m.is_dir()), root / "cpu")
            mounts.append(mount)
            relative.append((mount, path))
    folders = []
    for mount, path in relative:
        folder = mount / path.lstrip("/")
        while folder != mount and mount in folder.parents:
            folders.append(folder)
            folder = folder.parent
    return [*folders, *mounts]


def _quota_in(folder: Path) -> float | None:
    try:
        if (folder / "cpu.max").is_file():  # v2: "max 100000" or "150000 100000"
            quota, period = (folder / "cpu.max").read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if (folder / "cpu.cfs_quota_us").is_file():  # v1: -1 for none
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            return None if quota <= 0 else quota / int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None


def usable_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> tuple[int, str]:
    """How many CPUs this process may keep busy, and why: its affinity mask, bounded by the cgroup quota."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_quota(root, proc_cgroup)
    if quota is None:
        return affinity, f"the CPUs this process may use: affinity {affinity}, no cgroup quota"
    return max(1, min(affinity, math.ceil(quota))), f"the CPUs this process may use: affinity {affinity}, cgroup quota {quota:g}"


@dataclass(frozen=True)
class Threads:
    count: int
    why: str  # model.threads, OMP_NUM_THREADS, or the usable CPUs

    def __str__(self) -> str:
        waits = os.environ.get("OMP_WAIT_POLICY", "libgomp's default")
        return f"{self.count} torch thread(s) ({self.why}; OpenMP waits: {waits})"


def choose_threads(setting: int | None) -> Threads:
    """The thread count for ``model.threads`` = ``setting`` on this machine (see the module's docstring)."""
    if setting is not None:
        return Threads(setting, "model.threads")
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env:
        try:
            count = int(env.split(",")[0])  # OpenMP allows a list per nesting level: the first is the pool
        except ValueError:
            raise ValueError(f"OMP_NUM_THREADS must be a positive integer; found {env!r}") from None
        if count < 1:
            raise ValueError(f"OMP_NUM_THREADS must be a positive integer; found {env!r}")
        return Threads(count, "OMP_NUM_THREADS")
    count, why = usable_cpus()
    return Threads(count, why)


def per_process(setting: int | None, processes: int) -> int:
    """Threads for each of ``processes`` launched processes: ``choose_threads(setting)`` shared among them."""
    return max(1, choose_threads(setting).count // processes)


def use_threads(setting: int | None) -> Threads:
    """Set torch's intra-op threads (and, once per process, its inter-op threads) to ``choose_threads(setting)``."""
    import torch

    chosen = choose_threads(setting)
    if torch.get_num_threads() != chosen.count:
        torch.set_num_threads(chosen.count)
    if torch.get_num_interop_threads() != chosen.count:
        try:
            torch.set_num_interop_threads(chosen.count)
        except RuntimeError:  # settable once, before any inter-op work; ac2 starts none, so only a caller's own use
            pass
    return chosen
