"""What Kama's Grafana dashboard queries, and what its sources expose, so that a test
can hold one against the other: a panel over a metric that was renamed or removed
shows "No data" for ever, and nothing else would say so.

The dashboard (`DASHBOARD`, shipped in the chart as a ConfigMap for Grafana's sidecar)
reads three kinds of series:

- Kama's own (the gateway's ops port, the worker's and the watcher's `metrics` port),
  defined as prometheus_client metrics: `registry_sample_names` lists what a registry
  exposes;
- llama-server's `/metrics` (`llamacpp:*`), defined in the pinned llama.cpp's
  `tools/server/server-task.cpp`: `llama_metric_names` reads them from that source;
- a live scrape of either: `exposed_names` reads Prometheus' text format.

`metric_names` pulls the metric names out of one PromQL expression (and out of
Grafana's `label_values(...)` and `query_result(...)` variable queries); names are
kept as written, so a query of `foo_bucket` matches a histogram's sample
`foo_bucket`, and a counter must be queried with its `_total` suffix.

Pure: no I/O (callers read the files)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Final

DASHBOARD: Final = (
    Path(__file__).resolve().parent.parent
    / "deploy"
    / "chart"
    / "kama"
    / "files"
    / "dashboards"
    / "kama.json"
)

_NAME: Final = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_FULL_NAME: Final = re.compile(_NAME + r"\Z")
_STRING: Final = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_MATCHER: Final = re.compile(r'__name__\s*(=~|=)\s*"((?:[^"\\]|\\.)*)"')
_MODIFIER: Final = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_BRACES: Final = re.compile(r"\{[^{}]*\}")
_BRACKETS: Final = re.compile(r"\[[^\[\]]*\]")
_OFFSET: Final = re.compile(r"(?:\boffset\b|@)\s*-?[\w.]+(?:\(\))?", re.IGNORECASE)
_VARIABLE: Final = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
_IDENTIFIER: Final = re.compile(r"(?<![\w:.$])(" + _NAME + r")(\s*\()?")
_KEYWORDS: Final = frozenset(
    {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "offset"}
    | {"group_left", "group_right", "atan2", "inf", "nan"}
)
_GRAFANA_CALL: Final = re.compile(
    r"\s*(label_values|query_result|metrics|label_names)\((.*)\)\s*\Z", re.S
)


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` reads: bare selectors and `__name__` matchers (a regex
    one only as a plain alternation, `a|b`); functions, aggregations, keywords, label
    matchers, grouping clauses, ranges, offsets and Grafana's variables are not
    names. ValueError for a `__name__` regex it cannot enumerate."""
    call = _GRAFANA_CALL.match(expr)
    if call is not None:
        function, inner = call.groups()
        if function == "query_result":
            return metric_names(inner)
        if function == "label_values" and _top_level_comma(inner) is not None:
            return metric_names(inner[: _top_level_comma(inner)])
        return set()  # label_values(label), metrics(regex), label_names(): no series named
    names: set[str] = set()
    for operator, value in _NAME_MATCHER.findall(expr):
        alternatives = value.split("|") if operator == "=~" else [value]
        if not all(_FULL_NAME.match(a) for a in alternatives):
            raise ValueError(f"cannot enumerate the metrics of __name__{operator}{value!r}")
        names.update(alternatives)
    text = _STRING.sub('""', expr)
    text = _VARIABLE.sub(" ", text)
    text = _BRACES.sub(" ", text)
    while True:  # nested subqueries: innermost first
        stripped = _BRACKETS.sub(" ", text)
        if stripped == text:
            break
        text = stripped
    text = _MODIFIER.sub(" ", text)
    text = _OFFSET.sub(" ", text)
    for name, call_paren in _IDENTIFIER.findall(text):
        if not call_paren and name.lower() not in _KEYWORDS:
            names.add(name)
    return names


def _top_level_comma(text: str) -> int | None:
    """The index of the last comma outside parentheses, braces and strings."""
    depth, found, quote = 0, None, ""
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote and text[i - 1] != "\\" else quote
        elif char in "\"'":
            quote = char
        elif char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
        elif char == "," and depth == 0:
            found = i
    return found


def panels(dashboard: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every panel that shows data (rows' nested panels included, rows themselves not)."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panels(panel)
        else:
            yield panel


def expressions(dashboard: Mapping[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: the panels' targets and the query
    variables."""
    found = [t["expr"] for p in panels(dashboard) for t in p.get("targets", []) if "expr" in t]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable.get("query")
        if isinstance(query, Mapping):
            query = query.get("query")
        if isinstance(query, str) and query:
            found.append(query)
    return found


def dashboard_metric_names(dashboard: Mapping[str, Any]) -> set[str]:
    return {name for expr in expressions(dashboard) for name in metric_names(expr)}


def family_samples(name: str, kind: str) -> set[str]:
    """The sample names of a prometheus_client metric family (`Metric.name`, which
    leaves out a counter's `_total`) of type `kind`."""
    if kind == "counter":
        return {f"{name}_total", f"{name}_created"}
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "summary":
        return {name, f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "info":
        return {f"{name}_info"}
    return {name}


def registry_sample_names(families: Iterable[Any]) -> set[str]:
    """What a prometheus_client registry exposes (`registry.collect()`), series or
    not: a labelled metric without series yet still names its samples."""
    return {sample for f in families for sample in family_samples(f.name, f.type)}


def exposed_names(text: str) -> set[str]:
    """The metric names of a scrape in Prometheus' text format: every sample's name,
    and those a `# TYPE` line declares (a labelled family with no series yet, such
    as the gateway's upstream errors before the first failure)."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                name, kind = parts[2], parts[3]
                if kind == "histogram":
                    names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
                elif kind == "summary":
                    names |= {name, f"{name}_sum", f"{name}_count"}
                else:  # the text format's TYPE line names a counter with its _total
                    names.add(name)
        elif line and not line.startswith("#"):
            match = re.match(_NAME, line)
            if match:
                names.add(match.group(0))
    return names


LLAMA_PREFIX: Final = "llamacpp:"
_TO_METRICS: Final = re.compile(r"::to_metrics\(\)\s*(?:const\s*)?\{")
_METRIC_ITEM: Final = re.compile(r'\{\s*"([a-z_][a-z0-9_]*)"\s*,\s*"')
_LITERAL: Final = re.compile(re.escape(LLAMA_PREFIX) + r"([a-z_][a-z0-9_]*)")


def llama_metric_names(source: str) -> set[str]:
    """The `llamacpp:*` names llama-server's `/metrics` can answer, read from the C++
    source of its `to_metrics()` (server-task.cpp: `metric_item`s named in two lists,
    prefixed when written, and the labelled ones written out whole)."""
    names: set[str] = set()
    for start in _TO_METRICS.finditer(source):
        body = _function_body(source, start.end() - 1)
        names |= {LLAMA_PREFIX + n for n in _METRIC_ITEM.findall(body)}
        names |= {LLAMA_PREFIX + n for n in _LITERAL.findall(body)}
    return names


def _function_body(source: str, brace: int) -> str:
    """The text between the brace at `brace` and its match (C++ strings ignored)."""
    depth, i, quote = 0, brace, ""
    while i < len(source):
        char = source[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return source[brace + 1 : i]
        i += 1
    return source[brace + 1 :]
