"""How a client reaches the sidecar: a target (`HOST:PORT` or `unix:///abs/path`) and,
for a TLS listener, `ClientTls` (the CA that signed the sidecar's certificate, and the
client certificate and key an mTLS listener requires)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import grpc

__all__ = ["ClientTls", "open_channel", "open_aio_channel"]

PathLike = str | os.PathLike[str]
ChannelOptions = list[tuple[str, object]]


@dataclass(frozen=True)
class ClientTls:
    """TLS to the sidecar. `ca`: PEM file of the CA that signed the sidecar's certificate
    (None: the system's roots). `cert` and `key`: PEM files of this client's certificate
    and key, for a listener that requires one (both or neither). `server_name`: the name
    to expect in the sidecar's certificate when it differs from the target's host."""

    ca: PathLike | None = None
    cert: PathLike | None = None
    key: PathLike | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")

    def credentials(self) -> grpc.ChannelCredentials:
        """Reads the files now (OSError if one cannot be read)."""
        return grpc.ssl_channel_credentials(root_certificates=_read(self.ca), private_key=_read(self.key),
                                            certificate_chain=_read(self.cert))

    def options(self) -> ChannelOptions:
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []


def _read(path: PathLike | None) -> bytes | None:
    if path is None:
        return None
    with open(path, "rb") as f:
        return f.read()


def open_channel(target: str, tls: ClientTls | None, options: ChannelOptions | None) -> grpc.Channel:
    if tls is None:
        return grpc.insecure_channel(target, options=options or [])
    return grpc.secure_channel(target, tls.credentials(), options=[*(options or []), *tls.options()])


def open_aio_channel(target: str, tls: ClientTls | None, options: ChannelOptions | None) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(target, options=options or [])
    return grpc.aio.secure_channel(target, tls.credentials(), options=[*(options or []), *tls.options()])
