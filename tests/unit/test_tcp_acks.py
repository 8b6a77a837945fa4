"""The kernel's count of what a client took (sock_diag's `tcp_info`), over a real
loopback connection: it follows what the peer reads, not what was written; a
connection that does not exist has none; and a connection of this process can be
aborted by its addresses, which its peer sees as the end of the stream."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

from gateway.transport.tcp_acks import TcpAcks, abort_connection, parse_address


@contextmanager
def connection() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(the server's end, a client whose receive buffer is small)"""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    try:
        yield server, client
    finally:
        server.close()
        client.close()


def fill(sock: socket.socket) -> int:
    sock.setblocking(False)
    sent = 0
    try:
        while True:
            sent += sock.send(b"x" * 65536)
    except BlockingIOError:
        return sent


def acked_after(acks: TcpAcks, server: socket.socket, *, at_least: int) -> int:
    local, peer = server.getsockname(), server.getpeername()
    deadline = time.monotonic() + 5
    while True:
        acked = acks.acked(local=local, peer=peer)
        assert acked is not None
        if acked >= at_least or time.monotonic() > deadline:
            return acked
        time.sleep(0.01)


def test_what_the_peer_acknowledged_follows_what_it_read() -> None:
    acks = TcpAcks()
    with connection() as (server, client):
        written = fill(server)
        assert written > 1 << 20  # the kernel took far more than the client's buffer
        before = acked_after(acks, server, at_least=0)
        assert before < 256 * 1024
        read = 0
        client.settimeout(1)
        while read < 512 * 1024:
            read += len(client.recv(65536))
        after = acked_after(acks, server, at_least=read)
        assert read <= after < written


def test_a_connection_that_does_not_exist_has_no_count() -> None:
    assert TcpAcks().acked(local=("127.0.0.1", 1), peer=("127.0.0.1", 2)) is None


def test_a_connection_is_aborted_by_its_addresses() -> None:
    with connection() as (server, client):
        local, peer = server.getsockname(), server.getpeername()
        assert abort_connection(local=local, peer=peer)
        client.settimeout(2)
        assert client.recv(10) == b""  # the stream ended
        assert not abort_connection(local=("127.0.0.1", 1), peer=("127.0.0.1", 2))


def test_granians_addresses_are_parsed() -> None:
    assert parse_address("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_address("[::1]:443") == ("::1", 443)
    assert parse_address("garbage") is None
