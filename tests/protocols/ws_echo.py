"""A WebSocket echo server for sluice's tests, on the `websockets` package: every
text or binary message comes back as it came.

Prints "listening PORT" once it serves on 127.0.0.1 (an ephemeral port), then one
JSON line per socket when it ends: {"messages": [...], "close_code": N} (the
messages as text; close_code is the code of the client's close frame, 1006 when
none came). Stops when its standard input closes.
"""

import asyncio
import json
import sys

from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed


async def echo(socket):
    messages = []
    try:
        async for message in socket:
            text = message if isinstance(message, str) else message.decode("latin-1")
            messages.append(text)
            await socket.send(message)
    except ConnectionClosed:
        pass
    # Read after the close handshake: the code the peer sent.
    await socket.wait_closed()
    received = socket.protocol.close_rcvd
    code = received.code if received is not None else 1006
    print(json.dumps({"messages": messages, "close_code": code}), flush=True)


async def main():
    async with serve(echo, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"listening {port}", flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)


asyncio.run(main())
