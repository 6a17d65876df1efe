"""`bundle_server:`: where a sidecar polls for its bundle archive, and how.

    bundle_server:
      url: https://bundles.example.com/support/bundle.tar.gz
      poll_seconds: 30
      bearer_token_file: /var/run/secrets/bundles/token   # and/or client_cert_file + client_key_file
      ca_file: /etc/toolauthz/bundle-server-ca.pem

A bundle server's bundles must be signed: the settings refuse `bundle_server` without
`bundle_verification` (settings.py).
"""

from __future__ import annotations

import pathlib
import urllib.parse
from typing import TYPE_CHECKING

from pydantic import Field, field_validator, model_validator

from toolauthz.server.config.base import StrictModel

if TYPE_CHECKING:  # imported when used: reading a config loads no HTTP client
    from toolauthz.bundle.archive import ArchiveLimits
    from toolauthz.bundle.remote import FetchOptions


class BundleServerSettings(StrictModel):
    url: str
    """The bundle archive's https:// URL (`toolauthz bundle build` writes the archive)."""
    poll_seconds: float = Field(30.0, gt=0, le=86_400)
    """Seconds between polls, each spread by +-`jitter` so a fleet is not in step."""
    jitter: float = Field(0.1, ge=0, le=0.5)
    """The fraction of `poll_seconds` a poll's wait is moved by at random."""
    max_backoff_seconds: float = Field(300.0, gt=0, le=86_400)
    """While polls fail, the wait doubles up to this."""
    timeout_seconds: float = Field(30.0, gt=0, le=600)
    """One fetch, connect to last byte."""
    revalidate_every: int = Field(10, ge=1, le=10_000)
    """Every this many polls, a full fetch without If-None-Match (a 304 is not believed for ever)."""
    max_archive_bytes: int = Field(16 << 20, ge=1024, le=1 << 30)
    """The largest archive (compressed) a fetch reads."""
    max_uncompressed_bytes: int = Field(64 << 20, ge=1024, le=4 << 30)
    """The most bytes the archive may inflate to."""
    max_files: int = Field(5_000, ge=1, le=20_000)
    """The most members an archive may hold."""
    ca_file: pathlib.Path | None = None
    """The CA certificates the server's certificate must chain to; empty: the system's CAs."""
    client_cert_file: pathlib.Path | None = None
    """A client certificate for mTLS (with `client_key_file`)."""
    client_key_file: pathlib.Path | None = None
    """The client certificate's private key."""
    bearer_token_file: pathlib.Path | None = None
    """A file holding a bearer token sent as `Authorization: Bearer` (read at each fetch)."""

    @field_validator("url")
    @classmethod
    def _https_url(cls, value: str) -> str:
        parts = urllib.parse.urlsplit(value)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError("`bundle_server.url` must be an https:// URL")
        if parts.username is not None or parts.password is not None or parts.fragment:
            raise ValueError("`bundle_server.url` may hold no user, password or fragment "
                             "(credentials go in `bearer_token_file` or a client certificate)")
        return value

    @model_validator(mode="after")
    def _certificate_and_key(self) -> BundleServerSettings:
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise ValueError("`bundle_server.client_cert_file` and `client_key_file` go together")
        return self

    def fetch_options(self) -> FetchOptions:
        from toolauthz.bundle.remote import FetchOptions

        def text(path: pathlib.Path | None) -> str | None:
            return str(path) if path is not None else None

        return FetchOptions(url=self.url, timeout_seconds=self.timeout_seconds, max_bytes=self.max_archive_bytes,
                            ca_file=text(self.ca_file), client_cert_file=text(self.client_cert_file),
                            client_key_file=text(self.client_key_file), bearer_token_file=text(self.bearer_token_file))

    def archive_limits(self) -> ArchiveLimits:
        from toolauthz.bundle.archive import ArchiveLimits

        return ArchiveLimits(max_compressed_bytes=self.max_archive_bytes,
                             max_uncompressed_bytes=self.max_uncompressed_bytes, max_files=self.max_files)
