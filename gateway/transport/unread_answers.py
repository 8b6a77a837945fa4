"""Bytes of answers handed to clients' connections and not yet taken by the clients:
the budgets that keep a slow reader from making the gateway hold its answers.

granian takes every byte of an answer at once (`tcp_acks`), so without these a
client reading a large answer (a `/tokenize` with pieces, a long stream) at a few
hundred KiB/s makes the gateway keep all of it, and a few dozen such clients exhaust
its memory. What each answer still owes its client is written - acknowledged
(`TcpAcks.acked`):

- per connection, back-pressure: a streamed answer's next piece waits until what its
  client has not taken is under `per_connection`, so a slow reader slows its own
  stream down to its pace (the replica's answer then waits in the replica's socket,
  and its generation with it), and a writer that found no room for `stall_s` ends
  its answer by aborting the connection;
- over the gateway, shedding: when what all clients have not taken passes `total`
  (whole answers of up to 8 MiB are handed at once, each counted as its client's
  debt until taken), the largest debtors' connections are aborted until it is under
  again, as Envoy's overload manager sheds the largest buffers first.

Small answers are not measured: the first `UNMEASURED_BYTES` of an answer are written
without asking the kernel (they fit the socket's own buffers). A whole answer past
that size is measured from just before it is handed; a stream from its first piece
past it, so what its client took of its first `UNMEASURED_BYTES` is unknown: the
back-pressure counts them as owed (a stream waits a little early), the shedding and
the total do not (a client that took everything is never shed)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from gateway.transport.tcp_acks import Address, TcpAcks, abort_connection, parse_address

log = logging.getLogger("kama.gateway")

UNMEASURED_BYTES: Final = 128 * 1024
DEFAULT_PER_CONNECTION_BYTES: Final = 4 * 1024 * 1024
DEFAULT_TOTAL_BYTES: Final = 256 * 1024 * 1024
DEFAULT_STALL_S: Final = 60.0
FIRST_WAIT_S: Final = 0.005  # a writer without room looks again after this, doubling
LONGEST_WAIT_S: Final = 0.1


class AnswerAborted(ConnectionResetError):
    """The client's connection was aborted: it took its answer too slowly."""


@dataclass(frozen=True)
class UnreadLimits:
    per_connection: int = DEFAULT_PER_CONNECTION_BYTES
    total: int = DEFAULT_TOTAL_BYTES
    stall_s: float = DEFAULT_STALL_S


class AnswerDebt:
    """What one answer has handed to its connection, and what its client has not
    taken of it at the last look."""

    __slots__ = (
        "acked_base",
        "done",
        "handed",
        "handed_at_base",
        "local",
        "on_abort",
        "owed",
        "peer",
    )

    def __init__(
        self, *, local: Address | None, peer: Address | None, on_abort: Callable[[], None]
    ) -> None:
        self.local = local
        self.peer = peer
        self.on_abort = on_abort  # what the answer's request does when it is shed
        self.handed = 0  # bytes of the answer handed to the connection
        self.acked_base: int | None = None  # the connection's acked bytes when measured first
        self.handed_at_base = 0
        self.owed = 0  # not taken at the last look, and handed since (an upper bound)
        self.done = False  # the answer's request is over

    @property
    def surely_owed(self) -> int:
        return max(0, self.owed - self.handed_at_base)


def answer_debt(*, local: str, peer: str, on_abort: Callable[[], None]) -> AnswerDebt:
    """The debt of an answer on the connection granian names `local` and `peer`."""
    return AnswerDebt(local=parse_address(local), peer=parse_address(peer), on_abort=on_abort)


class UnreadAnswers:
    """The gateway's answer debts (see the module's docstring)."""

    def __init__(self, *, limits: UnreadLimits, acks: TcpAcks | None = None) -> None:
        self.limits = limits
        self.acks = acks or TcpAcks()
        self.measured: set[AnswerDebt] = set()  # measured debts, until paid and done
        self.owed_total = 0  # surely owed over `measured`, at the last sweep
        self.aborted = 0  # connections aborted for taking their answers too slowly

    def handing(self, debt: AnswerDebt, size: int) -> None:
        """`size` more bytes of the answer are about to be handed to the connection (a
        whole answer, or a piece `room` made room for)."""
        if debt.acked_base is None and debt.handed + size > UNMEASURED_BYTES:
            self._start_measuring(debt)
        debt.handed += size
        debt.owed += size

    async def room(self, debt: AnswerDebt, size: int) -> None:
        """Wait until the connection has room for `size` more bytes under
        `per_connection`; AnswerAborted (the connection aborted) after `stall_s`
        without room."""
        if debt.owed + size <= self.limits.per_connection:
            return
        waited, pause = 0.0, FIRST_WAIT_S
        while self._measure(debt) + size > self.limits.per_connection:
            if waited >= self.limits.stall_s:
                self._abort(debt, why=f"no room for its answer in {waited:.0f}s")
                raise AnswerAborted("the client took its answer too slowly")
            await asyncio.sleep(pause)
            waited += pause
            pause = min(pause * 2, LONGEST_WAIT_S)

    def settle(self, debt: AnswerDebt) -> None:
        """The answer's request is over; its debt counts until its client took it."""
        debt.done = True  # only measured debts are kept, and `sweep` forgets them once paid

    def sweep(self) -> None:
        """Look at every measured debt, forget those paid whose request is over, and
        shed the largest while what is surely owed in all passes `total`."""
        total = 0
        for debt in list(self.measured):
            self._measure(debt)
            if debt.done and debt.surely_owed == 0:
                self._forget(debt)
            total += debt.surely_owed
        self.owed_total = total
        if total <= self.limits.total:
            return
        for debt in sorted(self.measured, key=lambda d: d.surely_owed, reverse=True):
            if self.owed_total <= self.limits.total:
                break
            self.owed_total -= debt.surely_owed
            self._abort(debt, why=f"the gateway held {total} bytes its clients had not taken")
            debt.on_abort()

    def _start_measuring(self, debt: AnswerDebt) -> None:
        if debt.local is None or debt.peer is None:
            return
        acked = self.acks.acked(local=debt.local, peer=debt.peer)
        if acked is not None:
            debt.acked_base, debt.handed_at_base = acked, debt.handed
            self.measured.add(debt)

    def _measure(self, debt: AnswerDebt) -> int:
        """What the debt's client may not have taken now (0 where it cannot be
        measured, or once its connection is gone, and what it held with it)."""
        if debt.acked_base is None or debt.local is None or debt.peer is None:
            return 0
        acked = self.acks.acked(local=debt.local, peer=debt.peer)
        if acked is None:
            self._forget(debt)
            return 0
        debt.owed = max(0, debt.handed - (acked - debt.acked_base))
        return debt.owed

    def _abort(self, debt: AnswerDebt, *, why: str) -> None:
        owed = debt.owed
        local, peer = debt.local, debt.peer
        if local is not None and peer is not None and abort_connection(local=local, peer=peer):
            self.aborted += 1
            log.warning(
                "aborted the connection of %s, %d bytes of its answer not taken (%s)",
                debt.peer,
                owed,
                why,
            )
        self._forget(debt)

    def _forget(self, debt: AnswerDebt) -> None:
        debt.acked_base = None
        debt.owed = debt.handed_at_base = 0
        self.measured.discard(debt)
