"""How much of what the gateway wrote to one client connection that client has taken,
and how to abort a connection whose client takes too little.

granian (2.8) hands a streamed RSGI answer to its connection over an unbounded
channel: an awaited `send_bytes` returns at once however slowly the client reads, and
a whole answer is kept until it is taken (granian bounded that channel for ASGI and
WSGI only). The kernel knows what the peer acknowledged: `tcpi_bytes_acked` of the
socket's `tcp_info` (Linux 4.1+), which `TcpAcks` asks for by the connection's two
addresses over `sock_diag` netlink (`NETLINK_SOCK_DIAG`, as `ss` does: no privilege
within the process's own network namespace, one request and answer, a few µs). Bytes
written and not acknowledged are what the gateway still holds for the client, in
granian's buffers or the socket's.

To abort a connection its descriptor is needed (destroying a socket over netlink
needs CAP_NET_ADMIN): `abort_connection` finds it among the process's descriptors by
its two addresses (granian runs embedded, in this process) and shuts it down both
ways, so granian drops it and the answer it held. A descriptor is only borrowed, never
closed here, and its addresses are checked at the moment of use, as granian may close
it and the kernel reuse its number at any time.

Where this cannot work (not Linux, no sock_diag) `TcpAcks.acked` answers None and the
caller cannot measure the connection."""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
from typing import Final

log = logging.getLogger("kama.gateway")

NETLINK_SOCK_DIAG: Final = 4
SOCK_DIAG_BY_FAMILY: Final = 20
NLM_F_REQUEST: Final = 1
NLMSG_ERROR: Final = 2
INET_DIAG_INFO: Final = 2  # the attribute holding struct tcp_info
ALL_STATES: Final = 0xFFFFFFFF
NO_COOKIE: Final = 0xFFFFFFFF
NLMSG_HEADER: Final = struct.Struct("=IHHII")
DIAG_REQUEST: Final = struct.Struct("=BBBBI")
DIAG_MESSAGE_BYTES: Final = 72  # struct inet_diag_msg, before its attributes
BYTES_ACKED_AT: Final = 120  # struct tcp_info: tcpi_bytes_acked, a u64
ANSWER_BYTES: Final = 8192
FD_DIR: Final = "/proc/self/fd"
Address = tuple[str, int]


def parse_address(text: str) -> Address | None:
    """`host:port` (`[v6]:port`) as granian writes a scope's `client` and `server`."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _family(host: str) -> int:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _packed(host: str) -> bytes:
    raw = socket.inet_pton(_family(host), host)
    return raw + bytes(16 - len(raw))


class TcpAcks:
    """`tcpi_bytes_acked` of this network namespace's TCP sockets, by their addresses."""

    def __init__(self) -> None:
        self._netlink: socket.socket | None = None
        self._sequence = 0
        self._broken = False

    def acked(self, *, local: Address, peer: Address) -> int | None:
        """Bytes the peer of the connection `local` <-> `peer` has acknowledged over the
        connection's life; None where the connection is gone or cannot be asked."""
        netlink = self._open()
        if netlink is None:
            return None
        self._sequence = (self._sequence + 1) & 0xFFFFFFFF
        family = _family(local[0])
        try:
            sockid = (
                struct.pack("!HH", local[1], peer[1])
                + _packed(local[0])
                + _packed(peer[0])
                + struct.pack("=III", 0, NO_COOKIE, NO_COOKIE)
            )
        except OSError:  # not an address of that family
            return None
        request = (
            DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 0, ALL_STATES)
            + sockid
        )
        header = NLMSG_HEADER.pack(
            NLMSG_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, self._sequence, 0
        )
        try:
            netlink.send(header + request)
            while True:  # an answer to an earlier request that timed out is skipped
                answer = netlink.recv(ANSWER_BYTES)
                if len(answer) >= NLMSG_HEADER.size:
                    _, _, _, sequence, _ = NLMSG_HEADER.unpack_from(answer)
                    if sequence == self._sequence:
                        break
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self._close()
            return None
        return _bytes_acked(answer)

    def _open(self) -> socket.socket | None:
        if self._netlink is None and not self._broken:
            try:
                self._netlink = socket.socket(
                    socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG
                )
                self._netlink.settimeout(0.05)
            except (OSError, AttributeError) as exc:  # AF_NETLINK: Linux only
                log.warning("cannot ask the kernel what clients took (%s): not measured", exc)
                self._broken = True
        return self._netlink

    def _close(self) -> None:
        if self._netlink is not None:
            self._netlink.close()
            self._netlink = None


def _bytes_acked(answer: bytes) -> int | None:
    length, kind = struct.unpack_from("=IH", answer)
    if kind == NLMSG_ERROR or length > len(answer):
        return None  # ENOENT: no such connection (any more)
    offset = NLMSG_HEADER.size + DIAG_MESSAGE_BYTES
    while offset + 4 <= length:
        size, attribute = struct.unpack_from("=HH", answer, offset)
        if size < 4:
            return None
        if attribute == INET_DIAG_INFO and size >= 4 + BYTES_ACKED_AT + 8:
            acked: int = struct.unpack_from("=Q", answer, offset + 4 + BYTES_ACKED_AT)[0]
            return acked
        offset += (size + 3) & ~3
    return None


def _borrowed(fd: int) -> socket.socket | None:
    """A socket object over `fd`, to be `detach`ed, never closed; None for a
    descriptor that is not a TCP stream."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        sock.detach()
        return None
    return sock


def _is(sock: socket.socket, *, local: Address, peer: Address) -> bool:
    try:
        here, there = sock.getsockname(), sock.getpeername()
    except OSError:
        return False
    return (here[0], here[1]) == local and (there[0], there[1]) == peer


def abort_connection(*, local: Address, peer: Address, fd_dir: str = FD_DIR) -> bool:
    """Shut down both ways the process's own socket of the connection `local` <->
    `peer`; False where it has none (any more)."""
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            fd = int(name)
            if not os.readlink(f"{fd_dir}/{name}").startswith("socket:"):
                continue
        except (ValueError, OSError):
            continue
        sock = _borrowed(fd)
        if sock is None:
            continue
        try:
            if _is(sock, local=local, peer=peer):
                sock.shutdown(socket.SHUT_RDWR)
                return True
        except OSError:
            return False
        finally:
            sock.detach()
    return False
