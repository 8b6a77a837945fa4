"""`python -m kamadev.processnode CONFIG.json`: run the process node."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from kamadev.processnode.config import NodeConfig
from kamadev.processnode.node import ProcessNode


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    node = ProcessNode(config=NodeConfig.load(Path(sys.argv[1])))
    shutdown = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        shutdown.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=node.run, name="pod-watch", daemon=True).start()
    shutdown.wait()
    node.stop()


if __name__ == "__main__":
    main()
