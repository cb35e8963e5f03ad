"""Who may call the control plane: bearer tokens checked by a gRPC server interceptor.

Every call carries its credential as metadata `authorization: Bearer TOKEN`. Two tokens exist:

- the run's secret, made by the launcher (256 random bits, `secrets.token_hex`) and handed to the
  scheduler and the workers in their stdin specs (never argv, never the environment). Every call between
  scheduler and workers needs it (Register, Report, Enqueue, the worker's Shutdown), and so does the
  client port's Shutdown unless the api key is given;
- the api key (`sangam live --api-key`, or `SANGAM_API_KEY`): with one set, every call on the client port
  needs it (Submit, Poll, Stream, Watch, Status, Results, Shutdown).

The standard grpc.health.v1 service stays open on every port, so that orchestrators can probe without a
credential. A refused call gets UNAUTHENTICATED, its payload is never decoded, and one line is logged.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import grpc

from executor.proto import sangam_pb2 as pb

HEADER = "authorization"
SCHEME = "Bearer "

log = logging.getLogger("sangam.auth")


def metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that presents `token` (none for None)."""
    return () if token is None else ((HEADER, SCHEME + token),)


def methods(service: str) -> list[str]:
    """The full gRPC method names (`/package.Service/Method`) of one service of sangam.proto."""
    descriptor = pb.DESCRIPTOR.services_by_name[service]
    return [f"/{descriptor.full_name}/{m.name}" for m in descriptor.methods]


def method(service: str, name: str) -> str:
    """The full gRPC name of one method of sangam.proto (KeyError for an unknown one)."""
    descriptor = pb.DESCRIPTOR.services_by_name[service]
    return f"/{descriptor.full_name}/{descriptor.methods_by_name[name].name}"


def client_port_rules(api_key: str | None, secret: str) -> dict[str, tuple[str, ...]]:
    """The scheduler's client port: the api key for everything when one is set; Shutdown also takes the
    run's secret (the launcher's own stop)."""
    rules: dict[str, tuple[str, ...]] = {m: (api_key,) for m in methods("Scheduler")} if api_key else {}
    rules[method("Scheduler", "Shutdown")] = (secret, api_key) if api_key else (secret,)
    return rules


def internal_rules(service: str, secret: str) -> dict[str, tuple[str, ...]]:
    """A service between the run's own processes (`Control`, `Worker`): the secret for every method."""
    return {m: (secret,) for m in methods(service)}


def presented(invocation_metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The bearer token a call carries, or None."""
    for key, value in invocation_metadata or ():
        if key == HEADER and isinstance(value, str) and value.startswith(SCHEME):
            return value[len(SCHEME) :]
    return None


def matches(token: str | None, accepted: Collection[str]) -> bool:
    """Whether `token` is one of `accepted`, compared in constant time."""
    if token is None:
        return False
    given = token.encode()
    return any(hmac.compare_digest(given, a.encode()) for a in accepted)


class Guard(grpc.ServerInterceptor):
    """Refuses a call to a guarded method unless it presents one of the method's accepted tokens; methods
    absent from `rules` are open."""

    def __init__(self, rules: Mapping[str, Collection[str]], role: str) -> None:
        if any(not token for accepted in rules.values() for token in accepted):
            raise ValueError("an empty token would let every caller in")
        self.rules = dict(rules)
        self.role = role  # names the server in the log line

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        method: str = handler_call_details.method
        accepted = self.rules.get(method)
        if handler is None or accepted is None:
            return handler
        token = presented(handler_call_details.invocation_metadata)
        if matches(token, accepted):
            return handler
        why = "no credential" if token is None else "a wrong credential"
        return self._refusal(handler, method, why)

    def _refusal(self, handler: grpc.RpcMethodHandler, method: str, why: str) -> grpc.RpcMethodHandler:
        """A handler of `handler`'s kind that logs one line and aborts, without decoding the request."""

        def refuse(request: object, context: grpc.ServicerContext) -> Any:
            log.warning("%s refused %s from %s: %s", self.role, method, context.peer(), why)
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"{method} needs metadata '{HEADER}: {SCHEME}<token>' with a valid token",
            )

        def ignore(data: bytes) -> bytes:  # not decoded; gRPC takes None for a failed decode
            return data

        serialize = handler.response_serializer
        if handler.request_streaming:
            return grpc.stream_stream_rpc_method_handler(refuse, ignore, serialize)
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse, ignore, serialize)
        return grpc.unary_unary_rpc_method_handler(refuse, ignore, serialize)
