"""The soak's upstream: a small asyncio HTTP/1.1 server on loopback.

GET /stream/...  answers 200 with a chunked body of STREAM_CHUNKS chunks of 16 KiB,
                 a short pause between them (clients cut it mid-response);
GET /__counts    JSON of what arrived: requests per first path segment (two
                 for /exact/...), the arrival
                 times of /exact/sliding, streams cut before their end;
anything else    200 "ok\n".

Keep-alive as HTTP/1.1 wants. Usage: upstream.py PORT
"""

import asyncio
import json
import sys
import time
from collections import Counter

STREAM_CHUNKS = 64
CHUNK = b"x" * 16384
counts = Counter()
sliding_arrivals = []
streams = Counter()


async def respond_stream(writer):
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n"
                 b"transfer-encoding: chunked\r\n\r\n")
    try:
        for _ in range(STREAM_CHUNKS):
            writer.write(b"4000\r\n" + CHUNK + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        streams["completed"] += 1
        return True
    except (ConnectionError, OSError):
        streams["cut"] += 1
        return False


async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0") or 0)
            if length:
                await reader.readexactly(length)
            path = target.split("?", 1)[0]
            segment = path.split("/")[1] if path.count("/") >= 1 else ""
            if segment == "exact":
                segment = "/".join(path.split("/")[1:3])
            if path == "/__counts":
                body = json.dumps({"requests": counts, "sliding": sliding_arrivals,
                                   "streams": streams}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
                continue
            counts[segment] += 1
            if path.startswith("/exact/sliding"):
                sliding_arrivals.append(time.monotonic())
            if segment == "stream":
                if not await respond_stream(writer):
                    break
                continue
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                         b"content-length: 3\r\n\r\nok\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError,
            OSError, ValueError):
        pass
    finally:
        writer.close()


async def main(port):
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
