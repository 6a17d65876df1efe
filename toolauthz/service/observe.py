"""One instrumentation point per request, whatever the transport.

gRPC, the HTTP API and the console record the same metrics and the same span tree
through here: `observed` opens the `toolauthz.<Rpc>` span (continuing the caller's W3C
`traceparent`, from gRPC metadata or HTTP headers alike), hands the plan its tracing
context so that the authorizer's steps (`validate`, `evaluate`, `sign`, `store`) are its
children, and records the RPC's latency; `decided`, `verified` and `approval_decided`
count the answers. Every metric carries a `transport` label from a fixed vocabulary:

    grpc      a gRPC call (the default)
    mcp       a gRPC call whose client declared `toolauthz-transport: mcp` (the MCP gateway)
    http      the HTTP/JSON API
    console   the browser console

A client's declaration names a label and nothing else: it is never read for
authorization, and a value off the allow-list counts as `grpc`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, TypeVar, cast

from toolauthz.authorizer import AuthorizeResult, VerifyResult
from toolauthz.model import ProposedCall, TrustedContext
from toolauthz.telemetry import decision_log as decisions
from toolauthz.telemetry import metrics, tracing

__all__ = ["DECLARABLE_TRANSPORTS", "TRANSPORT_METADATA", "Observation", "TransportLabel", "approval_decided",
           "grpc_transport", "observed"]

TransportLabel = Literal["grpc", "mcp", "http", "console"]
TRANSPORT_METADATA = "toolauthz-transport"
# What a gRPC client may declare; the listener itself says `http` and `console`.
DECLARABLE_TRANSPORTS: frozenset[str] = frozenset({"mcp"})

# One line per answer at DEBUG, its fields as `extra` for the JSON log format
# (toolauthz/server/logs.py): ids and the result, never an argument value.
decision_log = logging.getLogger("toolauthz.decision")

Headers = Callable[[], Iterable[tuple[str, Any]] | None]
Planned = TypeVar("Planned")


def grpc_transport(metadata: Iterable[tuple[str, Any]] | None) -> TransportLabel:
    """The label of a gRPC call: `mcp` when its metadata declares it, else `grpc`."""
    for key, value in metadata or ():
        if key == TRANSPORT_METADATA and value in DECLARABLE_TRANSPORTS:
            return cast(TransportLabel, value)
    return "grpc"


class Observation:
    """One request being observed: its span (None when tracing is off) and transport."""

    def __init__(self, rpc: str, transport: TransportLabel, span: Any, trace: Any, started: float = 0.0):
        self.rpc = rpc
        self.transport = transport
        self.span = span
        self._trace = trace
        self.started = started or time.perf_counter()

    def plan(self, make: Callable[[], Planned]) -> Callable[[], Planned]:
        """`make` (which plans on the pump's thread) with this request's span as the parent
        of the steps it records."""
        trace = self._trace

        def planned() -> Planned:
            with tracing.attached(trace):
                return make()

        return planned

    def decided(self, tools: Collection[str], ctx: TrustedContext, call: ProposedCall,
                result: AuthorizeResult, *, caller: str = "") -> tuple[str, str]:
        """One Authorize answer (one per call of a batch): its metric and its line in the
        decision log (toolauthz/telemetry/decision_log.py, when on); returns its tool label
        and result."""
        tool = metrics.tool_label(call.name, tools)
        outcome = result.decision.value.lower()
        metrics.DECISIONS.labels(tool=tool, result=outcome, transport=self.transport).inc()
        decisions.record(decision_id=result.decision_id, tenant=ctx.tenant, principal=str(ctx.principal),
                         request_id=ctx.request_id, call_id=call.call_id, tool=call.name, result=outcome,
                         reasons=result.reasons, errors=[e.code for e in result.errors],
                         policy_version=result.policy_version, seconds=time.perf_counter() - self.started,
                         caller=caller, transport=self.transport, replayed=result.replayed,
                         input_json=call.input_json)
        return tool, outcome

    def verified(self, tools: Collection[str], ctx: TrustedContext, call: ProposedCall,
                 result: VerifyResult) -> None:
        tool = metrics.tool_label(call.name, tools)
        metrics.VERIFICATIONS.labels(code=result.code, transport=self.transport).inc()
        tracing.annotate(self.span, decision_id=result.decision_id, tool=tool, result=result.code)
        _log_answer("verify", result.code, ctx, call, tool, result.decision_id)

    def annotate(self, **attributes: str | int | bool) -> None:
        tracing.annotate(self.span, **attributes)


def _log_answer(rpc: str, result: str, ctx: TrustedContext, call: ProposedCall, tool: str, decision_id: str) -> None:
    if decision_log.isEnabledFor(logging.DEBUG):
        decision_log.debug("%s %s", rpc, result, extra={
            "decision_id": decision_id, "request_id": ctx.request_id, "call_id": call.call_id,
            "tool": tool, "result": result})


@contextmanager
def observed(rpc: str, transport: TransportLabel, headers: Headers) -> Iterator[Observation]:
    """The span of one request, current while the block runs, and its latency once it
    has answered. `headers`: the gRPC metadata or HTTP headers, read only when tracing is
    on, for the caller's `traceparent`."""
    started = time.perf_counter()
    with tracing.rpc_span(rpc, headers) as span:
        yield Observation(rpc, transport, span, tracing.current(), started)
        metrics.RPC_SECONDS.labels(rpc=rpc, transport=transport).observe(time.perf_counter() - started)


def approval_decided(verdict: str, transport: TransportLabel) -> None:
    """An approval decided (`approved` or `rejected`), wherever it was decided."""
    metrics.APPROVALS_DECIDED.labels(verdict=verdict, transport=transport).inc()
