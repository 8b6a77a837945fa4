"""The benchmarks' CPU attribution (tests/bench/cpu_use.py): which part of the stack a
process is, and what the machine and this very process used in a window."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.bench.cpu_use import cpu_between, machine_busy_s, part_of, read_cpu


def test_kamas_processes_are_named_by_their_subcommand() -> None:
    argv = ["/work/.venv/bin/python", "-m", "kamactl", "watcher"]
    assert part_of(comm="python", args=argv) == "kama watcher"
    assert part_of(comm="kama", args=["/opt/kama/bin/kama", "runtime"]) == "kama runtime"


def test_the_benchmark_and_other_programs_are_told_apart() -> None:
    assert part_of(comm="python3.11", args=["python", "-m", "pytest", "x"]) == "benchmark (pytest)"
    assert part_of(comm="pytest", args=["/v/bin/python", "/v/bin/pytest"]) == "benchmark (pytest)"
    assert part_of(comm="python3", args=["python3", "-u", "/x/hub.py"]) == "python hub.py"
    assert part_of(comm="python3", args=["python3", "-m", "kamadev.hub"]) == "python -m kamadev.hub"
    assert part_of(comm="kube-apiserver", args=["/bin/kube-apiserver", "--v=2"]) == "kube-apiserver"


def test_machine_busy_time_leaves_out_idle_and_iowait() -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    stat = f"cpu  {ticks} 0 {ticks} {100 * ticks} {50 * ticks} 0 0 0 0 0\ncpu0 1 2 3\n"
    assert machine_busy_s(stat) == 2.0


def test_a_busy_loop_is_attributed_to_this_process() -> None:
    before = read_cpu()
    spin_until = time.process_time() + 0.3
    while time.process_time() < spin_until:
        pass
    used = cpu_between(before, read_cpu(), top=1000)
    me = Path("/proc/self")
    args = [a.decode() for a in (me / "cmdline").read_bytes().split(b"\0") if a]
    mine = part_of(comm=(me / "comm").read_text().strip(), args=args)
    assert used[mine] >= 0.25
    assert used["machine_busy"] >= 0.25
    assert used["window"] >= 0.25
