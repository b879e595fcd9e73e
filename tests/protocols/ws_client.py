"""A WebSocket client for sluice's tests, on the `websockets` package.

    python3 ws_client.py URL N

Opens one socket to URL and sends N text messages "m0" .. "mN-1", each after the
echo of the one before. Prints one JSON line: {"echoed": [...], "close_code": N,
"close_reason": "..."} (the echoes received; the code and reason of the close frame
the server sent, null if the socket is still open after the last echo, which it
then closes with 1000). A refused handshake prints {"status": N}.
"""

import asyncio
import json
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus


async def main(url, count):
    echoed = []
    try:
        async with connect(url, compression=None) as socket:
            try:
                for i in range(count):
                    await socket.send(f"m{i}")
                    echoed.append(await socket.recv())
            except ConnectionClosed as closed:
                received = closed.rcvd
                print(json.dumps({
                    "echoed": echoed,
                    "close_code": received.code if received else 1006,
                    "close_reason": received.reason if received else "",
                }))
                return
    except InvalidStatus as refused:
        print(json.dumps({"status": refused.response.status_code}))
        return
    print(json.dumps({"echoed": echoed, "close_code": None, "close_reason": None}))


asyncio.run(main(sys.argv[1], int(sys.argv[2])))
