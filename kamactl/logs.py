"""How every Kama process logs: one function, `configure_logging`, called once by the
`kama` command before any subcommand runs (worker, watcher, gateway, importer,
runtime supervisor), so `KAMA_LOG_FORMAT` means the same everywhere.

`text` (the default) is the line a person reads in `kubectl logs`; `json` is one JSON
object per line, what a log pipeline (Loki, Elasticsearch, Cloud Logging) parses
without a regular expression: `time` (RFC 3339, UTC, milliseconds), `level`,
`logger`, `message`, and `exception` (the formatted traceback) when there is one.
`KAMA_LOG_LEVEL` (DEBUG, INFO, WARNING, ERROR) sets the root level; INFO by default."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Final, Literal

LogFormat = Literal["text", "json"]

TEXT_FORMAT: Final = "%(asctime)s %(name)s %(levelname)s %(message)s"
FORMATS: Final[tuple[LogFormat, ...]] = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (tracebacks are escaped, not wrapped)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def log_format(*, env: Mapping[str, str]) -> LogFormat:
    """`KAMA_LOG_FORMAT`, checked: a typo is an error at start-up, not silent text."""
    value = env.get("KAMA_LOG_FORMAT", "text").strip().lower() or "text"
    if value == "json":
        return "json"
    if value == "text":
        return "text"
    raise ValueError(f"KAMA_LOG_FORMAT must be one of {', '.join(FORMATS)}, not {value!r}")


def log_level(*, env: Mapping[str, str], default: str = "INFO") -> int:
    """`KAMA_LOG_LEVEL` as a logging level (`default` when unset)."""
    name = env.get("KAMA_LOG_LEVEL", default).strip().upper() or default
    level = logging.getLevelNamesMapping().get(name)
    if level is None:
        raise ValueError(f"KAMA_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR, not {name!r}")
    return level


def formatter_for(fmt: LogFormat) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)


def configure_logging(*, env: Mapping[str, str], default_level: str = "INFO") -> LogFormat:
    """Send the root logger to stderr in the configured format, replacing any handler
    installed before (so it is the one place that decides); the format chosen. A bad
    value raises ValueError naming the variable."""
    fmt = log_format(env=env)
    level = log_level(env=env, default=default_level)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter_for(fmt))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    return fmt
