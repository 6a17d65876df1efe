"""What GetStatus reports: the values the server hands to the ToolAuthorizer handler.

The handler defines the shape and the server (sidecar/server/build.py, `Sidecar.status`)
fills it, so the service layer never reaches up into the server's wiring."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PolicyStatus:
    """The loaded bundle and how its reloads went."""

    version: str
    loaded_at: float  # seconds since the epoch
    bundle_dir: str
    reloads: int
    last_reload_error: str  # empty when the last reload succeeded
    shadow_effects: Mapping[str, int]  # @shadow policy id -> calls it would have changed


@dataclass(frozen=True, slots=True)
class PumpStatus:
    """The answering process's decision pump."""

    answered: int
    batches: int
    waiting: int


@dataclass(frozen=True, slots=True)
class SidecarStatus:
    policy: PolicyStatus
    pump: PumpStatus
