"""A byte relay: accepts TCP connections and pipes each, both ways, to one upstream,
without parsing anything. `bench_gateway_path.py` runs it on this host and inside the
gateway pod's network namespace, to price the extra hop a proxy adds (and the pod
networking it crosses) apart from what the gateway does with HTTP.

Run: python -m tests.bench.tcp_relay LISTEN_HOST LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT
"""

from __future__ import annotations

import asyncio
import sys

import uvloop

CHUNK = 1 << 16


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def relay(*, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(connection, *listen, backlog=256)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    host, port, up_host, up_port = sys.argv[1:5]
    uvloop.run(relay(listen=(host, int(port)), upstream=(up_host, int(up_port))))
