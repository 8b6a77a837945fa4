"""No test asserts how many seconds something took (issue #40, item 2).

A bound on wall-clock time fails when the machine is busy, not when the code is wrong:
CI re-runs tests/unit at nice 10 beside the stack tests, and there a GGUF header of
65,536 tensors that parses in well under a second took 8.23 s against a bound of 3 s.
So a test asserts behaviour (counts of operations, bytes read, work per input, one
event before another), a deadline is driven by a clock the test injects and moves, and
speed is measured in tests/bench/, against a baseline taken in the same run.

This test keeps it so. It parses every module under tests/ except tests/bench/ and
fails naming `file:line` for each `assert` that compares (`<`, `<=`, `>`, `>=`) a value
read from a wall clock: a call of `time.monotonic`, `perf_counter`, `time`,
`monotonic_ns`, `perf_counter_ns` or `time_ns` (however imported), `datetime.now` or
`utcnow`, or an event loop's `time()`; a name assigned, in the same function or one
that encloses it, from an expression such a value flows into; or a call of a function
of the same module that returns one. Waiting is not flagged: `eventually(...,
timeout=...)` and a polling loop's deadline in a `while` or `if` fail when the awaited
event does not come, which is the behaviour. Nor is workflow time: Temporal's
time-skipping test server moves `workflow.now()`, so `result.waited_s` is already an
injected clock.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
EXEMPT = TESTS / "bench"  # speed is measured there, against a baseline of the same run

CLOCKS = frozenset(
    {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time", "time_ns"}
)
WALL_DATES = frozenset({"now", "utcnow"})
LOOP_GETTERS = frozenset({"get_running_loop", "get_event_loop"})
# calls whose result is their argument's value, reshaped: a clock read stays one
PASS_THROUGH = frozenset({"abs", "float", "int", "max", "min", "round", "sorted", "sum"})
ORDERING = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
Scope = ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


@dataclass
class Imports:
    """How a module can name the wall clocks."""

    time_modules: set[str] = field(default_factory=set)  # `import time [as t]`
    clocks: set[str] = field(default_factory=set)  # `from time import monotonic [as m]`
    datetimes: set[str] = field(default_factory=set)  # the module or the class

    @classmethod
    def of(cls, tree: ast.Module) -> Imports:
        found = cls()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "time":
                        found.time_modules.add(alias.asname or "time")
                    elif alias.name == "datetime":
                        found.datetimes.add(alias.asname or "datetime")
            elif isinstance(node, ast.ImportFrom) and node.module == "time":
                found.clocks |= {a.asname or a.name for a in node.names if a.name in CLOCKS}
            elif isinstance(node, ast.ImportFrom) and node.module == "datetime":
                found.datetimes |= {a.asname or a.name for a in node.names if a.name == "datetime"}
        return found


class Clocks:
    """Which expressions of one module carry a wall-clock reading."""

    def __init__(self, tree: ast.Module) -> None:
        self.imports = Imports.of(tree)
        self.functions: set[str] = set()  # module functions that return a reading
        self.tainted: dict[ast.AST, set[str]] = {}  # per scope: names holding one
        self.loops: dict[ast.AST, set[str]] = {}  # per scope: names holding an event loop
        scopes = list(_scopes(tree))
        while True:  # to a fixpoint: a function returning a reading taints its callers
            for scope, enclosing in scopes:
                self._assigned(scope, enclosing)
            returning = {
                scope.name
                for scope, _ in scopes
                if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef)
                and any(
                    isinstance(node, ast.Return)
                    and node.value is not None
                    and self.reads(node.value, scope)
                    for node in _own_nodes(scope)
                )
            }
            if returning <= self.functions:
                return
            self.functions |= returning

    def _assigned(self, scope: Scope, enclosing: list[Scope]) -> None:
        tainted = set().union(*(self.tainted.get(s, set()) for s in enclosing))
        loops = set().union(*(self.loops.get(s, set()) for s in enclosing))
        self.tainted[scope], self.loops[scope] = tainted, loops
        changed = True
        while changed:
            changed = False
            for node in _own_nodes(scope):
                for targets, value in _assignments(node):
                    names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                    if self._is_loop(value, scope) and not names <= loops:
                        loops |= names
                        changed = True
                    if self.reads(value, scope) and not names <= tainted:
                        tainted |= names
                        changed = True

    def _is_loop(self, node: ast.expr, scope: Scope) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.loops.get(scope, set())
        return isinstance(node, ast.Call) and _called_name(node.func) in LOOP_GETTERS

    def _is_clock_call(self, node: ast.Call, scope: Scope) -> bool:
        func = node.func
        if isinstance(func, ast.Name):
            return func.id in self.imports.clocks or func.id in self.functions
        if not isinstance(func, ast.Attribute):
            return False
        owner = func.value
        if (
            func.attr in CLOCKS
            and isinstance(owner, ast.Name)
            and owner.id in self.imports.time_modules
        ):
            return True
        if func.attr == "time" and self._is_loop(owner, scope):
            return True
        if func.attr in WALL_DATES:
            if isinstance(owner, ast.Name):
                return owner.id in self.imports.datetimes
            return (
                isinstance(owner, ast.Attribute)
                and owner.attr == "datetime"
                and isinstance(owner.value, ast.Name)
                and owner.value.id in self.imports.datetimes
            )
        return False

    def reads(self, node: ast.expr, scope: Scope) -> bool:
        """Whether `node`'s value is, or is computed from, a wall-clock reading."""
        if isinstance(node, ast.Name):
            return node.id in self.tainted.get(scope, set())
        if isinstance(node, ast.Call):
            if self._is_clock_call(node, scope):
                return True
            if _called_name(node.func) in PASS_THROUGH:
                return any(self.reads(a, scope) for a in node.args)
            if isinstance(node.func, ast.Attribute):  # a reading's method: .total_seconds()
                return self.reads(node.func.value, scope)
            return False  # what another function makes of a reading is its own value
        if isinstance(node, ast.Lambda):
            return False
        return any(
            self.reads(child, scope)
            for child in ast.iter_child_nodes(node)
            if isinstance(child, ast.expr)
        )

    def findings(self, tree: ast.Module) -> Iterator[int]:
        """The line of each assert that orders a wall-clock reading."""
        for scope, _ in _scopes(tree):
            for node in _own_nodes(scope):
                if not isinstance(node, ast.Assert):
                    continue
                for compare in ast.walk(node.test):
                    if (
                        isinstance(compare, ast.Compare)
                        and any(isinstance(op, ORDERING) for op in compare.ops)
                        and any(self.reads(e, scope) for e in [compare.left, *compare.comparators])
                    ):
                        yield node.lineno
                        break


def _called_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def _scopes(tree: ast.Module) -> Iterator[tuple[Scope, list[Scope]]]:
    """Every scope with the scopes that enclose it, outermost first (a class body is
    not a scope its methods see, but its methods are scopes of their own)."""

    def walk(node: ast.AST, enclosing: list[Scope]) -> Iterator[tuple[Scope, list[Scope]]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield child, enclosing
                yield from walk(child, [*enclosing, child])
            else:
                yield from walk(child, enclosing)

    yield tree, []
    yield from walk(tree, [tree])


def _own_nodes(scope: Scope) -> Iterator[ast.AST]:
    """The nodes of `scope` itself, not those of the functions defined in it."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))


def _assignments(node: ast.AST) -> Iterator[tuple[list[ast.expr], ast.expr]]:
    if isinstance(node, ast.Assign):
        yield node.targets, node.value
    elif isinstance(node, ast.AnnAssign | ast.AugAssign | ast.NamedExpr) and node.value:
        yield [node.target], node.value


def wall_clock_asserts(source: str, *, name: str = "<source>") -> list[str]:
    """`name:line` of each assert in `source` that orders a wall-clock reading."""
    tree = ast.parse(source, filename=name)
    return [f"{name}:{line}" for line in sorted(set(Clocks(tree).findings(tree)))]


def test_no_test_asserts_on_wall_clock_time() -> None:
    found: list[str] = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.is_relative_to(EXEMPT):
            continue
        name = str(path.relative_to(TESTS.parent))
        found += wall_clock_asserts(path.read_text(), name=name)
    assert not found, (
        "these asserts bound wall-clock time, which fails on a busy machine, not on "
        "broken code: assert counts, bytes, work per input or the order of events; drive "
        "a deadline with an injected clock; measure speed in tests/bench/:\n" + "\n".join(found)
    )


# The check itself, on snippets ------------------------------------------------------


def lines_flagged(source: str) -> list[int]:
    return [int(f.rsplit(":", 1)[1]) for f in wall_clock_asserts(textwrap.dedent(source))]


def test_it_flags_elapsed_time_however_the_clock_is_named() -> None:
    source = """
        import time
        from time import perf_counter as pc
        import datetime

        def test_direct():
            started = time.monotonic()
            work()
            assert time.monotonic() - started < 3

        def test_through_a_name():
            t0 = pc()
            work()
            elapsed = pc() - t0
            took = round(elapsed, 1)
            assert took <= 2, "fast"

        def timed(run):
            start = time.perf_counter()
            run()
            return time.perf_counter() - start

        def test_through_a_helper():
            seconds = timed(work)
            assert 0.4 < seconds < 2
            assert seconds == seconds  # equality is not a bound

        async def test_loop_time():
            loop = asyncio.get_running_loop()
            asked = loop.time()
            await work()
            assert not failed and loop.time() - asked >= 1.0

        def test_dates():
            then = datetime.datetime.now()
            assert (datetime.datetime.now() - then).total_seconds() > 10

        from time import monotonic

        def test_imported_by_name():
            started = monotonic()
            assert monotonic() - started <= 0.5
    """
    assert lines_flagged(source) == [9, 16, 25, 32, 36, 42]


def test_it_leaves_waits_workflow_time_and_injected_clocks_alone() -> None:
    source = """
        import time

        def test_wait():
            eventually(lambda: ready(), timeout=5, what="ready")
            deadline = time.monotonic() + 5
            while not ready() and time.monotonic() < deadline:
                time.sleep(0.05)
            if time.monotonic() > deadline:
                raise AssertionError("not ready")
            assert ready()

        async def test_workflow_time(env):
            result = await env.client.execute_workflow(Waits.run)
            assert 180 <= result.waited_s < 240

        async def test_injected_clock(clock):
            arrived = clock.now()
            await clock.advance(0.2)
            assert clock.now() - arrived >= 0.2

        def test_counts(reader):
            answer = fetch(timeout=deadline_from(time.monotonic()))
            assert reader.reads <= 3 and len(answer) > 0
    """
    assert lines_flagged(source) == []
