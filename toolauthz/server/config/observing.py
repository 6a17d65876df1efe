"""What the sidecar tells its operator: spans and the decision log."""

from __future__ import annotations

import pathlib
from typing import Literal

from pydantic import Field, model_validator

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
    http: DecisionLogHttpSettings | None = None
    """Ship the same events, in batches, to an HTTP endpoint (toolauthz/server/decision_shipping.py); none: off."""


class DecisionLogHttpSettings(StrictModel):
    """Decision events POSTed in gzip'd JSON-array batches; never on the decision path's time
    (a bounded buffer; what does not fit is dropped and counted)."""

    url: str = Field(min_length=1, max_length=2048)
    """The receiver: https://, or http:// to a loopback address; never logged."""
    headers_file: pathlib.Path | None = None
    """A file of `Name: value` lines added to each request (they may hold credentials)."""
    bearer_token_file: pathlib.Path | None = None
    """A file holding a token sent as `Authorization: Bearer <token>`."""
    ca_file: pathlib.Path | None = None
    """The CA that alone is trusted for the receiver's certificate (default: the system's)."""
    batch_max_events: int = Field(500, ge=1, le=10_000)
    """The most events in one request."""
    flush_interval_seconds: float = Field(1.0, gt=0, le=60)
    """The longest an event waits for its batch to fill before it is sent."""
    buffer_max_events: int = Field(10_000, ge=1, le=1_000_000)
    """Events waiting to be sent, at most, in each worker process; a new one beyond is dropped and counted."""
    buffer_max_bytes: int = Field(16 << 20, ge=1024, le=1 << 30)
    """Bytes of encoded events waiting to be sent, at most, in each worker process; a new one beyond is dropped
    and counted."""
    timeout_seconds: float = Field(5.0, gt=0, le=60)
    """The deadline of each read and write of one request."""
    max_attempts: int = Field(5, ge=1, le=100)
    """Tries of one batch (network errors, 408, 429, 5xx) before it is dropped and counted."""
    backoff_initial_seconds: float = Field(0.5, gt=0, le=60)
    """The first retry waits up to this long (a random share: full jitter), doubling each time."""
    backoff_max_seconds: float = Field(30.0, gt=0, le=3600)
    """The longest wait between tries."""

    @model_validator(mode="after")
    def _backoff_in_order(self) -> DecisionLogHttpSettings:
        if self.backoff_initial_seconds > self.backoff_max_seconds:
            raise ValueError("decision_log.http.backoff_initial_seconds must not exceed backoff_max_seconds")
        return self


DecisionLogSettings.model_rebuild()
