"""What the sidecar tells its operator: spans and the decision log."""

from __future__ import annotations

from typing import Literal

from toolauthz.server.config.base import StrictModel


class TracingSettings(StrictModel):
    """OpenTelemetry spans of each RPC."""

    exporter: Literal["none", "otlp"] = "none"
    """`otlp` exports spans over OTLP/gRPC (opentelemetry-exporter-otlp-proto-grpc; its OTEL_EXPORTER_OTLP_*
    variables apply); `none` records no spans."""
    endpoint: str = ""
    """empty: the exporter's default (or OTEL_EXPORTER_OTLP_ENDPOINT)"""


class DecisionLogSettings(StrictModel):
    """One INFO line per Authorize decision (toolauthz/telemetry/decision_log.py)."""

    enabled: bool = False
    """Log one line per decision on standard output."""
    arguments: dict[str, tuple[str, ...]] = {}
    """Tool name -> the top-level argument names whose values a line may hold; none else."""
