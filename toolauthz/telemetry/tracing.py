"""OpenTelemetry spans of each RPC and its steps, off unless a tracer provider is given.

Off (the default), `rpc_span` and `step` cost one attribute read: no span, no context
object. On (`use_tracer_provider`, called by the server with the configured exporter or
by a test with an in-memory one), an RPC span continues the W3C `traceparent` the client
sent in the gRPC metadata, and each step (validate, evaluate, sign, store) is a child of
it. The steps run on the decision pump's thread (a lone call's on the event loop, in a
callback of its own), so a request's context travels with its plan (`current`) and each
step names its parent explicitly.

Attributes: the decision id, the tool (a catalogued name or `unknown`), the result and
the verify code. Never an argument value, a principal, a tenant or a call id.

OpenTelemetry's API is imported once a provider is given: a sidecar that does not trace
never loads it (`python -m bench.memory --by-library`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry import context as otel_context
    from opentelemetry import trace

TRACEPARENT = "traceparent"


class _State:
    tracer: trace.Tracer | None = None
    propagator: Any = None  # the W3C propagator, made with the tracer


def use_tracer_provider(provider: trace.TracerProvider | None) -> None:
    """Trace with `provider` from now on (None: stop tracing)."""
    if provider is not None and _State.propagator is None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        _State.propagator = TraceContextTextMapPropagator()
    _State.tracer = provider.get_tracer("toolauthz") if provider is not None else None


def enabled() -> bool:
    return _State.tracer is not None


def _carrier(metadata: Iterable[tuple[str, Any]] | None) -> dict[str, str]:
    """The W3C headers among gRPC metadata (keys arrive lower-case); anything else, and
    any binary value, is ignored."""
    found: dict[str, str] = {}
    for key, value in metadata or ():
        if key in (TRACEPARENT, "tracestate") and isinstance(value, str) and len(value) <= 512:
            found[key] = value
    return found


@contextmanager
def rpc_span(name: str, metadata: Callable[[], Iterable[tuple[str, Any]] | None]) -> Iterator[trace.Span | None]:
    """The span of one RPC, current while the handler runs; None when tracing is off.
    `metadata`: the call's gRPC metadata, read only when tracing is on. A malformed
    `traceparent` starts a new trace (the propagator ignores it)."""
    tracer = _State.tracer
    if tracer is None:
        yield None
        return
    from opentelemetry.trace import SpanKind  # loaded by use_tracer_provider already

    parent = _State.propagator.extract(_carrier(metadata()))
    with tracer.start_as_current_span(f"toolauthz.{name}", context=parent, kind=SpanKind.SERVER) as span:
        yield span


def current() -> otel_context.Context | None:
    """The context a step started later (on another thread) should be a child of."""
    if _State.tracer is None:
        return None
    from opentelemetry import context as otel_context  # loaded by use_tracer_provider already

    return otel_context.get_current()


def step(name: str, parent: otel_context.Context | None,
         attributes: Mapping[str, str | int] | None = None) -> Any:
    """A child span of `parent` around one step; nothing when tracing is off or the
    request carries no context."""
    tracer = _State.tracer
    if tracer is None or parent is None:
        return nullcontext()
    return tracer.start_as_current_span(name, context=parent, attributes=dict(attributes or {}))


@contextmanager
def attached(parent: otel_context.Context | None) -> Iterator[None]:
    """`parent` as the current context while the block runs (where the plan is made)."""
    if parent is None:
        yield
        return
    from opentelemetry import context as otel_context  # a parent exists only while tracing

    token = otel_context.attach(parent)
    try:
        yield
    finally:
        otel_context.detach(token)


def annotate(span: trace.Span | None, **attributes: str | int | bool) -> None:
    if span is not None:
        span.set_attributes({f"toolauthz.{key}": value for key, value in attributes.items() if value != ""})
