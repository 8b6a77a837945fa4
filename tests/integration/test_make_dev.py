"""`make dev` as a developer runs it (`python -m kamadev`, on a stack of its own): it
prints the lines the README promises, Kama runs as pods the chart installed, the
printed chat request (through the real `openai` client) wakes the demo model at zero
and is answered, the real model (Gemma 3 270M) completes the printed prompt with real
text, and Ctrl-C tears everything down, leaving no process behind."""

from __future__ import annotations

import json
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import openai

from kamadev.binaries import REPO_ROOT
from kamadev.kama_demo import DEMO_MODEL, KAMA_NAMESPACE, REAL_MODEL

UP_TIMEOUT_S = 420  # a fresh machine builds nothing here: make test built it all first
LAST_LINE = "Ctrl-C tears everything down."


def read_lines(stream: subprocess.Popen[str], into: queue.Queue[str | None]) -> None:
    """Every line make dev prints, then None when its output ends."""
    assert stream.stdout is not None
    for line in stream.stdout:
        into.put(line.rstrip("\n"))
    into.put(None)


def test_make_dev_serves_the_printed_chat_request_and_tears_down() -> None:
    dev = subprocess.Popen(
        [sys.executable, "-m", "kamadev"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=read_lines, args=(dev, lines), daemon=True).start()
    printed: list[str] = []
    try:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while LAST_LINE not in printed:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            assert line is not None, "make dev ended early:\n" + "\n".join(printed)
            printed.append(line)
        text = "\n".join(printed)
        for promised in ("export KUBECONFIG=", "Temporal:", "(UI http://", "gateway:", "chat:"):
            assert promised in text, f"{promised!r} not printed:\n{text}"
        gateway = re.search(r"OpenAI base URL (http://\S+/v1)\)", text)
        kubeconfig = re.search(r"export KUBECONFIG=(\S+)", text)
        kubectl = re.search(r"kubectl:\s+(\S+)", text)
        api_key = re.search(r"API key:\s+(\S+)", text)
        assert gateway and kubeconfig and kubectl and api_key, text

        # Kama's processes are the chart's pods, under their own ServiceAccounts
        pods = json.loads(
            subprocess.run(
                [kubectl[1], "get", "pods", "-n", KAMA_NAMESPACE, "-o", "json"],
                env={"KUBECONFIG": kubeconfig[1]},
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout
        )["items"]
        accounts = {p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in pods}
        for component in ("worker", "watcher", "gateway"):
            assert accounts[component]["spec"]["serviceAccountName"] == f"kama-{component}"

        api = openai.OpenAI(base_url=gateway[1], api_key=api_key[1], timeout=180)
        reply = api.chat.completions.create(
            model=DEMO_MODEL,
            messages=[{"role": "user", "content": "Hello"}],
            max_tokens=16,
        )
        assert reply.model == DEMO_MODEL and reply.choices[0].message.content is not None
        # the printed completion on the real model answers real text
        complete = re.search(r"complete:\s+curl .*'model':'([^']+)'", text.replace('"', "'"))
        assert complete and complete[1] == REAL_MODEL, text
        real = api.completions.create(
            model=REAL_MODEL, prompt="The capital of France is", max_tokens=16, temperature=0
        )
        assert real.model == REAL_MODEL and re.search(r"[A-Za-z]{3,}", real.choices[0].text)
    finally:
        dev.send_signal(signal.SIGINT)
        try:
            dev.wait(timeout=180)
        except subprocess.TimeoutExpired:
            dev.kill()
            raise
        while (rest := lines.get(timeout=10)) is not None:
            printed.append(rest)
    assert dev.returncode == 0, "\n".join(printed[-20:])
    assert not any("leftover" in line for line in printed), "\n".join(printed[-20:])
