"""The metadata of the sidecar's calls: W3C trace context, when the runtime uses
OpenTelemetry, and the transport label a client may declare.

The client stays light: opentelemetry is imported the first time a call is made, and
only if it is installed; without it, or without a current span, calls carry no trace
metadata. The runtime's configured propagator writes the headers, so a runtime that
propagates differently keeps doing so; only `traceparent` and `tracestate` are sent.
"""

from __future__ import annotations

from typing import Any

_SENT = ("traceparent", "tracestate")
# A client that fronts another protocol (the MCP gateway) says so, and the sidecar labels
# its calls' metrics `transport="mcp"` (toolauthz/service/observe.py keeps the same list).
# A label only: the sidecar never reads it for authorization.
TRANSPORT_METADATA = "toolauthz-transport"
DECLARABLE_TRANSPORTS = ("mcp",)
Metadata = tuple[tuple[str, str], ...]
_inject: Any = None  # opentelemetry.propagate.inject, False when opentelemetry is absent


def transport_metadata(label: str | None) -> Metadata:
    """The metadata declaring `label` (None: none); ValueError off the list."""
    if label is None:
        return ()
    if label not in DECLARABLE_TRANSPORTS:
        raise ValueError(f"transport_label must be one of {', '.join(DECLARABLE_TRANSPORTS)}, or None")
    return ((TRANSPORT_METADATA, label),)


def call_metadata(declared: Metadata) -> Metadata | None:
    """A call's metadata: `declared` (transport_metadata) and the current trace context."""
    found = (*declared, *(trace_metadata() or ()))
    return found or None


def trace_metadata() -> Metadata | None:
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
