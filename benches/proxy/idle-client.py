#!/usr/bin/env python3
"""Opens COUNT keep-alive connections to HOST:PORT, makes one request on each (HTTP/1.1,
HTTP/1.1 over TLS 1.3, or HTTP/2 with prior knowledge), checks the answer is a 200,
then keeps every connection open and idle. Prints "ready N" once N connections are
idle, then waits for a line on stdin (or its end) and closes them all. Used by
idle-conns.sh; standard library only.

    idle-client.py PROTO HOST PORT COUNT      PROTO: http1 | tls | h2c
"""

import asyncio
import ssl
import sys

PARALLEL = 100


def h2_frame(kind, flags, stream, payload):
    n = len(payload)
    return bytes([n >> 16 & 0xFF, n >> 8 & 0xFF, n & 0xFF, kind, flags]) + stream.to_bytes(4, "big") + payload


def hpack_literal(name, value):
    # Literal header field without indexing, new name, no Huffman coding.
    def string(s):
        assert len(s) < 127
        return bytes([len(s)]) + s

    return b"\x00" + string(name) + string(value)


def h2_request(host):
    block = (
        hpack_literal(b":method", b"GET")
        + hpack_literal(b":scheme", b"http")
        + hpack_literal(b":path", b"/")
        + hpack_literal(b":authority", host.encode())
    )
    return (
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        + h2_frame(0x4, 0, 0, b"")
        # END_STREAM | END_HEADERS on stream 1.
        + h2_frame(0x1, 0x5, 1, block)
    )


async def http1_exchange(reader, writer, host):
    writer.write(f"GET / HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1]
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
        if name.strip().lower() == b"transfer-encoding":
            raise RuntimeError("chunked answer: not expected from the bench upstream")
    await reader.readexactly(length)
    if status != b"200":
        raise RuntimeError(f"status {status!r}")


async def h2_exchange(reader, writer, host):
    writer.write(h2_request(host))
    await writer.drain()
    acked = False
    done = False
    while not done:
        head = await reader.readexactly(9)
        n = int.from_bytes(head[:3], "big")
        kind, flags = head[3], head[4]
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        await reader.readexactly(n)
        if kind == 0x4 and not flags & 0x1 and not acked:
            writer.write(h2_frame(0x4, 0x1, 0, b""))
            acked = True
        elif kind == 0x7:
            raise RuntimeError("GOAWAY")
        elif kind == 0x3 and stream == 1:
            raise RuntimeError("RST_STREAM")
        elif stream == 1 and kind in (0x0, 0x1) and flags & 0x1:
            done = True
    await writer.drain()


async def main():
    proto, host, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    context = None
    if proto == "tls":
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.set_alpn_protocols(["http/1.1"])
    exchange = h2_exchange if proto == "h2c" else http1_exchange
    gate = asyncio.Semaphore(PARALLEL)
    held = []
    failures = []

    async def one():
        async with gate:
            try:
                reader, writer = await asyncio.open_connection(host, port, ssl=context)
                await exchange(reader, writer, host)
                held.append((reader, writer))
            except Exception as err:  # noqa: BLE001 - counted and reported
                failures.append(repr(err))

    await asyncio.gather(*(one() for _ in range(count)))
    if failures:
        print(f"failed {len(failures)} first: {failures[0]}", file=sys.stderr, flush=True)
    print(f"ready {len(held)}", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    for _, writer in held:
        writer.close()


asyncio.run(main())
