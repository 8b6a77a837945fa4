"""The `kama` command ends with its own exit status and output, whatever happens
while the interpreter finalizes: the Temporal SDK's threads can abort a finalizing
interpreter (temporalio/sdk-python#300), which once failed a `kama status` that had
done its work. Here a crash at exit is forced with an atexit hook, so the test does
not depend on the SDK's race."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kamadev.binaries import REPO_ROOT

# `python -m kamactl ARGS`, exactly as the stack and the pods start it, with a process
# that aborts if the interpreter gets as far as its atexit hooks
CRASHING_AT_EXIT = (
    "import atexit, os, runpy, sys; atexit.register(os.abort); "
    "sys.argv = ['kama', *sys.argv[1:]]; runpy.run_module('kamactl', run_name='__main__')"
)


def kama_crashing_at_exit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CRASHING_AT_EXIT, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_command_that_did_its_work_exits_zero_with_all_its_output() -> None:
    done = kama_crashing_at_exit("version")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("kama "), "stdout written before the exit must be flushed"


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (("no-such-command",), 2, "invalid choice"),  # argparse's own refusal
        (("status", "--output", "yaml"), 2, "--output"),
    ],
)
def test_a_refused_command_keeps_its_status_and_message(
    args: tuple[str, ...], code: int, said: str
) -> None:
    done = kama_crashing_at_exit(*args)
    assert done.returncode == code and said in done.stderr, done.stderr[-2000:]
