"""CPU time by part of the stack during a benchmark's window: what the API server,
etcd, the kubelets, Temporal, Kama's worker, watchers and gateway, and llama-server
used of the machine's cores while something was being timed. On a 2-core machine that
runs everything it measures, a phase that takes longer under one system than under
another is often its neighbours' CPU; this says whose.

Read from /proc: each process's user+system time at the window's start and end (a
process alive at both; identified by pid and start time), and the machine's busy time
from /proc/stat, which also holds what processes that came and went inside the window
used (runc, a container's shim starting): reported as `unattributed`."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def part_of(*, comm: str, args: list[str]) -> str:
    """The part a process belongs to: Kama's processes by their `kama` subcommand
    (`kamactl worker`, a serving pod's `kama runtime`), pytest as the benchmark itself
    (its load generator and observer), other Python programs by their script, anything
    else by its command name."""
    if "kamactl" in args:
        rest = args[args.index("kamactl") + 1 :]
        return f"kama {rest[0]}" if rest else "kama"
    if args and Path(args[0]).name == "kama":
        return f"kama {args[1]}" if len(args) > 1 else "kama"
    if comm == "pytest" or (comm.startswith("python") and any("pytest" in a for a in args)):
        return "benchmark (pytest)"
    if comm.startswith("python"):
        for flag in ("-m", "-c"):
            if flag in args[1:]:
                after = args[args.index(flag) + 1 :]
                return f"python -m {after[0]}" if flag == "-m" and after else f"python {flag}"
        scripts = [a for a in args[1:] if not a.startswith("-")]
        return f"python {Path(scripts[0]).name}" if scripts else "python"
    return comm


@dataclass(frozen=True)
class CpuReading:
    """Every process's CPU seconds so far, by (pid, start time), with its part; and the
    machine's busy seconds over all cores."""

    processes: dict[tuple[int, int], tuple[str, float]]
    busy_s: float
    at: float  # time.perf_counter()


def _process(pid_dir: Path) -> tuple[tuple[int, int], tuple[str, float]] | None:
    try:
        stat = (pid_dir / "stat").read_text()
        args = (pid_dir / "cmdline").read_bytes().split(b"\0")
    except OSError:  # gone since the listing
        return None
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2 :].split()
    # after the command: state is field 3 of proc(5), utime 14, stime 15, starttime 22
    used = (int(fields[11]) + int(fields[12])) / TICKS_PER_S
    key = (int(pid_dir.name), int(fields[19]))
    return key, (part_of(comm=comm, args=[a.decode(errors="replace") for a in args if a]), used)


def machine_busy_s(stat: str) -> float:
    """Busy seconds over all cores from /proc/stat's `cpu` line: everything but idle
    and iowait (guest time is already inside user)."""
    line = next(row for row in stat.splitlines() if row.startswith("cpu "))
    values = [int(v) for v in line.split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
    return (user + nice + system + irq + softirq + steal) / TICKS_PER_S


def read_cpu() -> CpuReading:
    processes = dict(
        found
        for pid_dir in PROC.iterdir()
        if pid_dir.name.isdigit() and (found := _process(pid_dir)) is not None
    )
    busy = machine_busy_s((PROC / "stat").read_text())
    return CpuReading(processes=processes, busy_s=busy, at=time.perf_counter())


def cpu_between(before: CpuReading, after: CpuReading, *, top: int = 8) -> dict[str, float]:
    """CPU seconds each part used between two readings (its `top` largest; the rest
    summed as `other`), the machine's busy seconds, what no process alive at both
    readings accounts for, and the window's length."""
    parts: dict[str, float] = defaultdict(float)
    for key, (part, used) in after.processes.items():
        if key in before.processes:
            parts[part] += used - before.processes[key][1]
    ranked = sorted(parts.items(), key=lambda item: -item[1])
    shown = {part: round(used, 3) for part, used in ranked[:top] if used > 0}
    busy = after.busy_s - before.busy_s
    return {
        **shown,
        "other": round(sum(used for _, used in ranked[top:]), 3),
        "unattributed": round(max(0.0, busy - sum(parts.values())), 3),
        "machine_busy": round(busy, 3),
        "window": round(after.at - before.at, 3),
    }
