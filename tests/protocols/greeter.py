"""A gRPC greeter for sluice's tests, on grpcio with raw-bytes messages (no
generated code): service greet.Greeter with one method of each kind.

    SayHello  unary                 b"hello " + request; trailer x-tokens: 7
    Count     server streaming      request b"N": N messages b"0" .. b"N-1"
    Sum       client streaming      the total length of the messages, as text
    Chat      bidirectional         each message back, upper-cased
    Slow      unary                 answers after 5 s

Prints "listening PORT" once it serves on 127.0.0.1 (an ephemeral port), then each
call's method and its metadata as one line "call METHOD key=value ...".
"""

import sys
import time
from concurrent import futures

import grpc


def log_call(name, context):
    pairs = " ".join(f"{k}={v}" for k, v in context.invocation_metadata())
    print(f"call {name} {pairs}", flush=True)


def say_hello(request, context):
    log_call("SayHello", context)
    context.set_trailing_metadata((("x-tokens", "7"),))
    return b"hello " + request


def count(request, context):
    log_call("Count", context)
    for i in range(int(request)):
        yield str(i).encode()


def total(requests, context):
    log_call("Sum", context)
    return str(sum(len(r) for r in requests)).encode()


def chat(requests, context):
    log_call("Chat", context)
    for r in requests:
        yield r.upper()


def slow(request, context):
    log_call("Slow", context)
    time.sleep(5)
    return request


def main():
    handlers = {
        "SayHello": grpc.unary_unary_rpc_method_handler(say_hello),
        "Count": grpc.unary_stream_rpc_method_handler(count),
        "Sum": grpc.stream_unary_rpc_method_handler(total),
        "Chat": grpc.stream_stream_rpc_method_handler(chat),
        "Slow": grpc.unary_unary_rpc_method_handler(slow),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("greet.Greeter", handlers),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening {port}", flush=True)
    try:
        sys.stdin.read()
    finally:
        server.stop(0)


if __name__ == "__main__":
    main()
