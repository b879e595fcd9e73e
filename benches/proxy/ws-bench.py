#!/usr/bin/env python3
"""WebSocket peers for the proxy benchmarks (compare.sh's ws scenario, idle-conns.sh's
ws protocol); standard library only, raw frames on asyncio.

    ws-bench.py serve PORT                 an echo server on 127.0.0.1:PORT: every
                                           text or binary message comes back
                                           (unmasked), a close frame is answered
    ws-bench.py load URL CONNS SECONDS [SIZE]
                                           CONNS sockets to URL (ws://host:port/path),
                                           each sending a SIZE-byte (32) text message
                                           and waiting for its echo, again and again,
                                           for SECONDS; prints wrk's summary lines
                                           (a message is a "request") for compare.sh
    ws-bench.py count URL MESSAGES          one socket to URL sending MESSAGES 32-byte
                                           messages, each after the last one's echo,
                                           then a close (callgrind.sh's ws scenarios)
    ws-bench.py idle HOST PORT PATH COUNT  COUNT sockets, one echoed message each, then
                                           idle; prints "ready N", waits for a line on
                                           stdin (or its end), closes them

The echo server and the load client are the same for every proxy measured, so they
bound the messages per second alike; compare.sh also reports each proxy's CPU per
message, which they do not bound.
"""

import asyncio
import base64
import hashlib
import os
import sys
import time

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PARALLEL = 100


def frame(opcode, payload, mask):
    head = bytes([0x80 | opcode])
    n = len(payload)
    bit = 0x80 if mask else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + n.to_bytes(2, "big")
    else:
        head += bytes([bit | 127]) + n.to_bytes(8, "big")
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + unmask(payload, key)


def unmask(payload, key):
    n = len(payload)
    if n == 0:
        return payload
    keys = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(keys, "big")).to_bytes(n, "big")


async def read_frame(reader):
    """(fin, opcode, payload unmasked)."""
    b0, b1 = await reader.readexactly(2)
    n = b1 & 0x7F
    if n == 126:
        n = int.from_bytes(await reader.readexactly(2), "big")
    elif n == 127:
        n = int.from_bytes(await reader.readexactly(8), "big")
    key = await reader.readexactly(4) if b1 & 0x80 else None
    payload = await reader.readexactly(n)
    if key:
        payload = unmask(payload, key)
    return b0 & 0x80, b0 & 0x0F, payload


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return lines[0], headers


# ---- the echo server -----------------------------------------------------------------


async def echo(reader, writer):
    try:
        _, headers = await read_head(reader)
        accept = base64.b64encode(hashlib.sha1(headers["sec-websocket-key"].encode() + GUID).digest())
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
        )
        while True:
            _, opcode, payload = await read_frame(reader)
            if opcode == 0x8:
                writer.write(frame(0x8, payload[:2], False))
                await writer.drain()
                break
            if opcode == 0x9:
                writer.write(frame(0xA, payload, False))
            elif opcode in (0x0, 0x1, 0x2):
                writer.write(frame(opcode or 0x1, payload, False))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, KeyError):
        pass
    writer.close()


async def serve(port):
    server = await asyncio.start_server(echo, "127.0.0.1", port, backlog=4096)
    print(f"listening {port}", flush=True)
    async with server:
        await server.serve_forever()


# ---- clients -------------------------------------------------------------------------


async def open_socket(host, port, path):
    reader, writer = await asyncio.open_connection(host, port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    status, _ = await read_head(reader)
    if " 101 " not in status + " ":
        raise RuntimeError(f"not switched: {status}")
    return reader, writer


def split_url(url):
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    return host, int(port or 80), "/" + path


async def load(url, conns, seconds, size):
    host, port, path = split_url(url)
    message = frame(0x1, b"x" * size, True)
    sockets = [await open_socket(host, port, path) for _ in range(conns)]
    latencies = []
    failures = []
    deadline = time.monotonic() + seconds

    async def one(reader, writer):
        try:
            while time.monotonic() < deadline:
                sent = time.perf_counter()
                writer.write(message)
                _, opcode, payload = await read_frame(reader)
                if opcode != 0x1 or len(payload) != size:
                    raise RuntimeError(f"got opcode {opcode} with {len(payload)} bytes")
                latencies.append(time.perf_counter() - sent)
            writer.write(frame(0x8, (1000).to_bytes(2, "big"), True))
            await writer.drain()
        except Exception as err:  # noqa: BLE001 - counted and reported
            failures.append(repr(err))
        writer.close()

    start = time.monotonic()
    await asyncio.gather(*(one(r, w) for r, w in sockets))
    took = time.monotonic() - start
    latencies.sort()
    n = len(latencies)

    def pct(p):
        return latencies[min(n - 1, int(n * p))] * 1e6 if n else 0

    # wrk's summary lines, which compare.sh reads.
    print(f"     50%  {pct(0.50):.0f}us")
    print(f"     99%  {pct(0.99):.0f}us")
    print(f"  {n} requests in {took:.2f}s")
    if failures:
        print(f"  Socket errors: connect 0, read {len(failures)}, write 0, timeout 0")
        print(f"first failure: {failures[0]}", file=sys.stderr)
    print(f"Requests/sec: {n / took:.2f}")


async def count(url, messages):
    reader, writer = await open_socket(*split_url(url))
    message = frame(0x1, b"x" * 32, True)
    for _ in range(messages):
        writer.write(message)
        _, opcode, payload = await read_frame(reader)
        if opcode != 0x1 or len(payload) != 32:
            raise RuntimeError(f"got opcode {opcode} with {len(payload)} bytes")
    writer.write(frame(0x8, (1000).to_bytes(2, "big"), True))
    await writer.drain()
    while (await read_frame(reader))[1] != 0x8:
        pass
    writer.close()


async def idle(host, port, path, count):
    gate = asyncio.Semaphore(PARALLEL)
    held = []
    failures = []
    message = frame(0x1, b"hello", True)

    async def one():
        async with gate:
            try:
                reader, writer = await open_socket(host, port, path)
                writer.write(message)
                await read_frame(reader)
                held.append(writer)
            except Exception as err:  # noqa: BLE001 - counted and reported
                failures.append(repr(err))

    await asyncio.gather(*(one() for _ in range(count)))
    if failures:
        print(f"failed {len(failures)} first: {failures[0]}", file=sys.stderr, flush=True)
    print(f"ready {len(held)}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    for writer in held:
        writer.close()


def main():
    mode = sys.argv[1]
    if mode == "serve":
        asyncio.run(serve(int(sys.argv[2])))
    elif mode == "load":
        size = int(sys.argv[5]) if len(sys.argv) > 5 else 32
        asyncio.run(load(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), size))
    elif mode == "count":
        asyncio.run(count(sys.argv[2], int(sys.argv[3])))
    elif mode == "idle":
        asyncio.run(idle(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])))
    else:
        sys.exit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
