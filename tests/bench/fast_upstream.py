"""An upstream that answers every request at once: a minimal keep-alive HTTP/1.1
server, so that what a gateway benchmark measures is the proxy in front of it. Served
from the benchmark's own event loop, or as a process of its own inside a pod's network
namespace (the pod IP exists only there on real nodes):

    nsenter --net=/proc/PID/ns/net python -m tests.bench.fast_upstream HOST PORT
"""

from __future__ import annotations

import asyncio
import sys

import uvloop

FAST_BODY = b'{"choices":[{"text":"ok","index":0}],"object":"text_completion"}'
FAST_RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(FAST_BODY)).encode()
    + b"\r\n\r\n"
    + FAST_BODY
)


async def serve_fast_upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer each request on the connection, until the client goes."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length:
                await reader.readexactly(length)
            writer.write(FAST_RESPONSE)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def serve(*, host: str, port: int) -> None:
    server = await asyncio.start_server(serve_fast_upstream, host, port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve(host=sys.argv[1], port=int(sys.argv[2])))
