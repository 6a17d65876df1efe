"""How many CPUs this process may use: the default of `serve --workers`.

In a container `os.cpu_count()` is the node's cores, not the pod's limit: a sidecar
limited to one CPU on a 32-core node would start 32 workers and be throttled. The
answer here is the smallest of the CPU quota of the process's cgroup v2 and every
cgroup above it (`cpu.max`: `QUOTA PERIOD`, rounded up; `max` is no limit) and the
CPUs the affinity mask allows (`os.sched_getaffinity`, which also honours `taskset`
and cpusets); at least 1.
"""

from __future__ import annotations

import math
import os
import pathlib

CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
PROC_CGROUP = pathlib.Path("/proc/self/cgroup")


def available_cpus(cgroup_root: pathlib.Path = CGROUP_ROOT, proc_cgroup: pathlib.Path = PROC_CGROUP) -> int:
    counts = [_affinity()]
    quota = cgroup_quota(cgroup_root, proc_cgroup)
    if quota is not None:
        counts.append(quota)
    return max(1, min(counts))


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def cgroup_quota(cgroup_root: pathlib.Path = CGROUP_ROOT, proc_cgroup: pathlib.Path = PROC_CGROUP) -> int | None:
    """The tightest cgroup v2 CPU quota over this process's cgroup and its ancestors, in
    whole CPUs (rounded up); None when none is set or cgroup v2 is not there."""
    directory = _own_cgroup(cgroup_root, proc_cgroup)
    if directory is None:
        return None
    quotas = []
    while True:
        quota = _quota_of(directory / "cpu.max")
        if quota is not None:
            quotas.append(quota)
        if directory == cgroup_root or cgroup_root not in directory.parents:
            break
        directory = directory.parent
    return min(quotas) if quotas else None


def _own_cgroup(cgroup_root: pathlib.Path, proc_cgroup: pathlib.Path) -> pathlib.Path | None:
    """The cgroup v2 directory of this process (`0::/path` in /proc/self/cgroup)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            relative = line[3:].strip().lstrip("/")
            directory = (cgroup_root / relative) if relative else cgroup_root
            # Inside a cgroup namespace the path may not exist under this mount: use the root.
            return directory if directory.is_dir() else cgroup_root
    return None


def _quota_of(cpu_max: pathlib.Path) -> int | None:
    try:
        fields = cpu_max.read_text().split()
    except OSError:
        return None
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))
