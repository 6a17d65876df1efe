"""W3C trace context for the sidecar's calls, when the runtime uses OpenTelemetry.

The client stays light: opentelemetry is imported the first time a call is made, and
only if it is installed; without it, or without a current span, calls carry no trace
metadata. The runtime's configured propagator writes the headers, so a runtime that
propagates differently keeps doing so; only `traceparent` and `tracestate` are sent.
"""

from __future__ import annotations

from typing import Any

_SENT = ("traceparent", "tracestate")
_inject: Any = None  # opentelemetry.propagate.inject, False when opentelemetry is absent


def trace_metadata() -> tuple[tuple[str, str], ...] | None:
    """The current trace context as gRPC metadata, or None."""
    global _inject
    if _inject is None:
        try:
            from opentelemetry.propagate import inject
        except ImportError:
            _inject = False
        else:
            _inject = inject
    if _inject is False:
        return None
    carrier: dict[str, str] = {}
    _inject(carrier)
    found = tuple((key, carrier[key]) for key in _SENT if key in carrier)
    return found or None
