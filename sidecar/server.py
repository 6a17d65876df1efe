"""Wiring: one explicit set of components (bundle, stores, keys, authorizer), handed to
the gRPC handlers. No globals, so tests build as many sidecars as they like."""

from __future__ import annotations

import logging
import os
import pathlib
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sidecar.audit.sqlite import SqliteAuditLog
from sidecar.audit.writer import AuditWriter, Checkpointer
from sidecar.authorizer import Authorizer, BundleHolder
from sidecar.bundle import load_bundle
from sidecar.clock import Clock, SystemClock
from sidecar.config import Settings
from sidecar.errors import KeyFileError
from sidecar.keys import KeyRing, SigningKey, generate_key_file, load_keyring, load_private_key_file
from sidecar.proto.toolauthz.v1 import authorizer_pb2 as pb
from sidecar.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from sidecar.service import ToolAuthorizerService
from sidecar.store import SqliteLedger
from sidecar.tokens import TokenIssuer, TokenVerifier

log = logging.getLogger("toolauthz.server")


@dataclass
class Sidecar:
    settings: Settings
    bundles: BundleHolder
    ledger: SqliteLedger
    audit_log: SqliteAuditLog
    audit_writer: AuditWriter
    checkpointer: Checkpointer
    keyring: KeyRing
    audit_key: SigningKey
    authorizer: Authorizer
    last_reload_error: str = ""
    started_at: float = field(default_factory=time.time)

    def status(self) -> tuple[str, float, str, str]:
        bundle = self.bundles.current
        return bundle.version, bundle.loaded_at, self.last_reload_error, str(bundle.directory)

    def close(self) -> None:
        self.audit_writer.close()
        self.checkpointer.close()  # signs a final checkpoint of everything written
        self.audit_log.close()
        self.ledger.close()


def build_sidecar(settings: Settings, *, clock: Clock | None = None) -> Sidecar:
    """Loads everything or raises (BundleError, KeyFileError, StoreUnavailable): a
    sidecar that cannot do its job refuses to start."""
    clock = clock or SystemClock()
    bundle = load_bundle(settings.bundle)
    data = pathlib.Path(settings.data_dir)
    data.mkdir(parents=True, exist_ok=True, mode=0o700)
    keyring = load_keyring(settings.keys_dir, grace_seconds=settings.key_grace_seconds(), clock=clock,
                           create_if_missing=settings.generate_missing_keys)
    if getattr(keyring, "created_key", None) is not None:
        log.warning("generated a development token signing key in %s (kid %s)", settings.keys_dir,
                    keyring.created_key.kid)
    audit_key = _audit_key(settings)
    if keyring.verification_key(audit_key.kid, clock.now()) is not None:
        raise KeyFileError("the audit key must differ from every token key")
    ledger = SqliteLedger(str(settings.ledger_path))
    audit_log = SqliteAuditLog(str(settings.audit_path))
    writer = AuditWriter(audit_log)
    checkpointer = Checkpointer(audit_log, audit_key.key, audit_key.kid, clock,
                                interval=settings.audit.checkpoint_interval_seconds)
    t = settings.tokens
    authorizer = Authorizer(
        bundles=BundleHolder(bundle), ledger=ledger,
        issuer=TokenIssuer(keyring, issuer=t.issuer, audience=t.audience, lifetime_seconds=t.lifetime_seconds, clock=clock),
        verifier=TokenVerifier(keyring, issuer=t.issuer, audience=t.audience, leeway_seconds=t.leeway_seconds, clock=clock),
        audit=writer, clock=clock)
    return Sidecar(settings, authorizer.bundles, ledger, audit_log, writer, checkpointer, keyring, audit_key, authorizer)


def _audit_key(settings: Settings) -> SigningKey:
    path = settings.audit_key_file
    if not os.path.exists(path) and settings.generate_missing_keys:
        kid = generate_key_file(path)
        log.warning("generated a development audit signing key at %s (kid %s)", path, kid)
    return load_private_key_file(path)


def create_server(sidecar: Sidecar, address: str | None = None) -> tuple[grpc.Server, int]:
    """Builds and starts a gRPC server; returns it with the bound port (use port 0 in tests)."""
    settings = sidecar.settings
    options = [("grpc.max_receive_message_length", settings.max_message_bytes),
               ("grpc.max_send_message_length", settings.max_message_bytes),
               ("grpc.so_reuseport", 0)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=min(32, settings.max_concurrent_rpcs)),
                         options=options, maximum_concurrent_rpcs=settings.max_concurrent_rpcs)
    pb_grpc.add_ToolAuthorizerServicer_to_server(
        ToolAuthorizerService(sidecar.authorizer, sidecar.keyring, sidecar.status), server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    services = [pb.DESCRIPTOR.services_by_name["ToolAuthorizer"].full_name, health.SERVICE_NAME,
                reflection.SERVICE_NAME]
    reflection.enable_server_reflection(services, server)
    port = server.add_insecure_port(address or settings.listen)
    if port == 0:
        raise OSError(f"cannot listen on {address or settings.listen}")
    server.start()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(services[0], health_pb2.HealthCheckResponse.SERVING)
    return server, port
