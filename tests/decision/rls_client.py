"""Envoy's own generated rate limit client, driven by the decision tests.

    python3 rls_client.py HOST:PORT < calls.json > answers.json

Reads a JSON list of calls and answers each, in order, with the stub Envoy's API
defines (envoy.service.ratelimit.v3.rls_pb2_grpc.RateLimitServiceStub, from the
`xds-protos` package, over `grpcio`). A call is
    {"domain": "messaging", "hits_addend": 0,
     "descriptors": [{"entries": [["key", "value"]], "hits_addend": 2,
                      "limit": {"requests_per_unit": 5, "unit": "MINUTE"},
                      "negative": true}],
     "metadata": [["sluice-token", "t"]]}
("method": another gRPC method to send the request to, as a client that names the
wrong service would)
("negative": is_negative_hits, field 4 of the descriptor in Envoy's v3 API, which
this xds-protos release predates: sent as that field's bytes, kept by protobuf as an
unknown field) or {"raw": "<hex>"}: these bytes sent as the request message as they
are. An answer is
    {"grpc": "OK", "overall_code": "OVER_LIMIT",
     "statuses": [{"code": "OK", "current_limit": {"name": "", "requests_per_unit": 5,
                   "unit": "MINUTE"} | null, "limit_remaining": 4,
                   "duration_until_reset": 59.5 | null}],
     "headers": [["ratelimit", "..."]]}
or {"grpc": "INVALID_ARGUMENT", "details": "..."} when the call fails.
"""

import json
import sys

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"


def request_of(call):
    request = rls_pb2.RateLimitRequest(domain=call.get("domain", ""))
    request.hits_addend = call.get("hits_addend", 0)
    for d in call.get("descriptors", []):
        descriptor = request.descriptors.add()
        for key, value in d["entries"]:
            descriptor.entries.add(key=key, value=value)
        if d.get("hits_addend") is not None:
            descriptor.hits_addend.value = d["hits_addend"]
        if d.get("limit") is not None:
            limit = d["limit"]
            descriptor.limit.requests_per_unit = limit["requests_per_unit"]
            descriptor.limit.unit = rls_pb2.RateLimitResponse.RateLimit.Unit.Value(limit["unit"])
        if d.get("negative"):
            # Field 4 (varint) = 1: is_negative_hits = true.
            descriptor.MergeFromString(b"\x20\x01")
    return request


def answer_of(response):
    code_name = rls_pb2.RateLimitResponse.Code.Name
    unit_name = rls_pb2.RateLimitResponse.RateLimit.Unit.Name
    statuses = []
    for status in response.statuses:
        limit = None
        if status.HasField("current_limit"):
            limit = {
                "name": status.current_limit.name,
                "requests_per_unit": status.current_limit.requests_per_unit,
                "unit": unit_name(status.current_limit.unit),
            }
        reset = None
        if status.HasField("duration_until_reset"):
            d = status.duration_until_reset
            reset = d.seconds + d.nanos / 1e9
        statuses.append({
            "code": code_name(status.code),
            "current_limit": limit,
            "limit_remaining": status.limit_remaining,
            "duration_until_reset": reset,
        })
    return {
        "grpc": "OK",
        "overall_code": code_name(response.overall_code),
        "statuses": statuses,
        "headers": [[h.key, h.value] for h in response.response_headers_to_add],
    }


def main():
    calls = json.load(sys.stdin)
    channel = grpc.insecure_channel(sys.argv[1])
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    raw = channel.unary_unary(METHOD)
    answers = []
    for call in calls:
        metadata = [tuple(pair) for pair in call.get("metadata", [])]
        try:
            if "method" in call:
                send = channel.unary_unary(call["method"])
                send(request_of(call).SerializeToString(), metadata=metadata, timeout=10)
                answers.append({"grpc": "OK"})
            elif "raw" in call:
                data = raw(bytes.fromhex(call["raw"]), metadata=metadata, timeout=10)
                answers.append(answer_of(rls_pb2.RateLimitResponse.FromString(data)))
            else:
                response = stub.ShouldRateLimit(request_of(call), metadata=metadata, timeout=10)
                answers.append(answer_of(response))
        except grpc.RpcError as err:
            answers.append({"grpc": err.code().name, "details": err.details()})
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    # The descriptor type is imported for its registration in the pool.
    assert ratelimit_pb2.RateLimitDescriptor
    main()
