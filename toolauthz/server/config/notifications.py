"""Approval events sent to webhooks and Slack (toolauthz/notify/)."""

from __future__ import annotations

import pathlib
from typing import Literal

from pydantic import Field, model_validator

from toolauthz.server.config.base import StrictModel


class NotificationSinkSettings(StrictModel):
    """One place approval events go (toolauthz/notify/sinks.py)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    """The sink's name, in metrics and logs."""
    kind: Literal["webhook", "slack"]
    """`webhook` (Standard Webhooks, signed) or `slack` (an incoming webhook)."""
    url: str = Field(min_length=1, max_length=2048)
    """Where events are posted: https://, or http:// to a loopback address; never logged."""
    secret_file: pathlib.Path | None = None
    """webhook: the Standard Webhooks secret (`whsec_<base64>`), in a file only its owner reads"""
    ca_file: pathlib.Path | None = None
    """trust for the sink's TLS, when not the system's"""
    timeout_seconds: float = Field(5.0, gt=0, le=60)
    """The deadline of one delivery."""

    @model_validator(mode="after")
    def _webhook_needs_a_secret(self) -> NotificationSinkSettings:
        if self.kind == "webhook" and self.secret_file is None:
            raise ValueError(f"sink `{self.name}`: a webhook sink needs `secret_file`")
        return self


class NotificationSettings(StrictModel):
    """Approval events (created, expiring, decided) sent to `sinks`, off the decision path."""

    sinks: tuple[NotificationSinkSettings, ...] = Field(min_length=1)
    console_url: str = ""
    """The console's public address, for the deep link to an approval; empty: no link."""
    expiry_warning_seconds: float = Field(120.0, ge=0)
    """How long before an approval expires its `expiring` event is sent."""
    poll_seconds: float = Field(1.0, gt=0, le=60)
    """Seconds between looks at the store for events to send."""
    max_attempts: int = Field(8, ge=1, le=100)
    """Deliveries tried for one event before it is dead."""
    keep_dead: int = Field(100, ge=1, le=100_000)
    """Dead events kept for inspection."""
