"""A gRPC client for sluice's tests: makes calls to greet.Greeter at ADDRESS and
prints one JSON line per call: its status code name, details, messages received
and the initial and trailing metadata.

    grpc_call.py ADDRESS CALL [CALL ...]

A CALL is KIND:METHOD:ARG with KIND unary, server, client or bidi; ARG is the
request (unary, server) or comma-separated requests (client, bidi). Calls are made
one after another on one channel; no call is retried.
"""

import json
import sys

import grpc


def main():
    address, calls = sys.argv[1], sys.argv[2:]
    options = [("grpc.enable_retries", 0)]
    with grpc.insecure_channel(address, options=options) as channel:
        for call in calls:
            kind, method, arg = call.split(":", 2)
            path = f"/greet.Greeter/{method}"
            result = {"call": call}
            try:
                if kind == "unary":
                    stub = channel.unary_unary(path)
                    reply, outcome = stub.with_call(arg.encode(), timeout=20)
                    messages = [reply]
                elif kind == "server":
                    outcome = channel.unary_stream(path)(arg.encode(), timeout=20)
                    messages = list(outcome)
                elif kind == "client":
                    stub = channel.stream_unary(path)
                    parts = iter(a.encode() for a in arg.split(","))
                    reply, outcome = stub.with_call(parts, timeout=20)
                    messages = [reply]
                else:
                    outcome = channel.stream_stream(path)(
                        iter(a.encode() for a in arg.split(",")), timeout=20
                    )
                    messages = list(outcome)
                result["code"] = outcome.code().name
                result["details"] = outcome.details()
                result["initial"] = dict(outcome.initial_metadata() or ())
                result["trailing"] = dict(outcome.trailing_metadata() or ())
                result["messages"] = [m.decode() for m in messages]
            except grpc.RpcError as err:
                result["code"] = err.code().name
                result["details"] = err.details()
                result["initial"] = dict(err.initial_metadata() or ())
                result["trailing"] = dict(err.trailing_metadata() or ())
                result["messages"] = []
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
