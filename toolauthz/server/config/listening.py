"""Where the sidecar listens: addresses, the services each serves, and their TLS."""

from __future__ import annotations

import pathlib
from typing import Literal

from pydantic import Field

from toolauthz.server.config.base import StrictModel

Service = Literal["authorizer", "approvals", "audit"]
SERVICES: tuple[Service, ...] = ("authorizer", "approvals", "audit")


class TlsSettings(StrictModel):
    cert: pathlib.Path
    """PEM file of the listener's certificate chain."""
    key: pathlib.Path
    """PEM file of the listener's private key."""
    client_ca: pathlib.Path | None = None
    """With a CA: clients must present a certificate it signed (mTLS); the caller's identity is then the
    certificate's URI SAN, or else `cn:` and its subject CN."""


class ListenerSettings(StrictModel):
    """One address the sidecar serves: `HOST:PORT` or `unix:///path`."""

    address: str
    """`HOST:PORT` or `unix:///path`."""
    services: tuple[Service, ...] = SERVICES
    """The services served on this address."""
    tls: TlsSettings | None = None
    """The listener's certificate and key, and the CA of its clients; none: plaintext."""
    insecure: bool = False
    """A TCP listener off loopback without TLS refuses to start unless this says so."""
    mode: int = Field(0o660, ge=0, le=0o777)
    """Unix sockets: the file's mode, and the caller identity of whoever connects."""
    identity: str = ""
    """Unix sockets: the caller identity of whoever connects (matched against `callers`)."""
