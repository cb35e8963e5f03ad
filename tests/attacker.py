"""A second process that calls a Sangam control plane as an outsider would (tests/test_control_plane.py).

    python tests/attacker.py calls     # stdin: JSON list of calls; stdout: one JSON list of outcomes
    python tests/attacker.py streams   # stdin: one JSON line; holds the streams open until stdin closes

A call is {"address", "method" (/package.Service/Method), "payload" (hex bytes, sent as they are),
"token" (presented as `authorization: Bearer token`, or null), "stream" (a server-streaming method)}. Its
outcome is {"code": "OK" or the status code's name, "details"}. Raw bytes go through a generic channel
call, so undecodable payloads and forged messages reach the server exactly as given.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from typing import Any

import grpc

TIMEOUT_S = 10.0


def _metadata(token: str | None) -> list[tuple[str, str]]:
    return [] if token is None else [("authorization", f"Bearer {token}")]


def call(channel: grpc.Channel, spec: dict[str, Any]) -> dict[str, str]:
    payload = bytes.fromhex(spec["payload"])
    try:
        if spec.get("stream"):
            method = channel.unary_stream(spec["method"])
            for _ in method(payload, timeout=TIMEOUT_S, metadata=_metadata(spec.get("token"))):
                pass
        else:
            channel.unary_unary(spec["method"])(
                payload, timeout=TIMEOUT_S, metadata=_metadata(spec.get("token"))
            )
    except grpc.RpcError as err:
        return {"code": err.code().name, "details": err.details() or ""}
    return {"code": "OK", "details": ""}


def run_calls(specs: list[dict[str, Any]]) -> list[dict[str, str]]:
    channels: dict[str, grpc.Channel] = {}
    out = []
    for spec in specs:
        address = spec["address"]
        if address not in channels:
            channels[address] = grpc.insecure_channel(address)
        out.append(call(channels[address], spec))
    return out


def hold_streams(spec: dict[str, Any]) -> None:
    """Open `count` streams over `connections` connections; print how many the server ended at once (by
    status code), then keep the rest open until stdin closes."""
    payload = bytes.fromhex(spec["payload"])
    own_connection = [("grpc.use_local_subchannel_pool", 1)]  # channels would share one connection
    channels = [
        grpc.insecure_channel(spec["address"], options=own_connection) for _ in range(spec["connections"])
    ]
    ended: Counter[str] = Counter()
    lock = threading.Lock()
    calls = []

    def on_done(call: Any) -> None:
        with lock:
            ended[call.code().name] += 1

    for i in range(spec["count"]):
        method = channels[i % len(channels)].unary_stream(spec["method"])
        stream = method(payload, timeout=120.0, metadata=_metadata(spec.get("token")))
        stream.add_done_callback(on_done)
        calls.append(stream)
    time.sleep(spec.get("settle_s", 3.0))
    with lock:
        print(json.dumps({"ended": dict(ended), "open": len(calls) - sum(ended.values())}), flush=True)
    sys.stdin.read()
    for stream in calls:
        stream.cancel()


def main() -> int:
    mode = sys.argv[1]
    if mode == "calls":
        print(json.dumps(run_calls(json.loads(sys.stdin.read()))), flush=True)
    else:
        hold_streams(json.loads(sys.stdin.readline()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
