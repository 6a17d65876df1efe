"""Wiring: one explicit set of components (bundle, stores, keys, authorizer), handed to
the gRPC handlers. No globals, so tests build as many sidecars as they like."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import _async as aio_health
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sidecar.approvals import ApprovalDesk
from sidecar.authorizer import Authorizer
from sidecar.bundle import BundleHolder, load_bundle
from sidecar.clock import Clock, SystemClock
from sidecar.errors import KeyFileError, StoreUnavailable
from sidecar.proto.toolauthz.v1 import approvals_pb2 as apb
from sidecar.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from sidecar.proto.toolauthz.v1 import audit_pb2 as aupb
from sidecar.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from sidecar.proto.toolauthz.v1 import authorizer_pb2 as pb
from sidecar.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from sidecar.server.config import Settings
from sidecar.server.pump import DecisionPump
from sidecar.server.reload import BundleReloader
from sidecar.service.approvals import ApprovalsService
from sidecar.service.audit import AuditService
from sidecar.service.authorizer import ToolAuthorizerService
from sidecar.service.common import TolerantRegistration
from sidecar.service.running import AioServer
from sidecar.service.status import PolicyStatus, PumpStatus, SidecarStatus
from sidecar.store import Store
from sidecar.store.audit_writer import AuditWriter, Checkpointer
from sidecar.store.open import open_store
from sidecar.store.rules import Approvals, AuditLogOf, Ledger
from sidecar.tokens import TokenIssuer, TokenVerifier
from sidecar.tokens.keyring import KeyRing, load_keyring
from sidecar.tokens.keys import SigningKey, generate_key_file, load_private_key_file

log = logging.getLogger("toolauthz.server")


@dataclass
class Sidecar:
    settings: Settings
    bundles: BundleHolder
    store: Store
    ledger: Ledger
    audit_log: AuditLogOf
    audit_writer: AuditWriter
    checkpointer: Checkpointer
    keyring: KeyRing
    audit_key: SigningKey
    authorizer: Authorizer
    approvals: ApprovalDesk
    approval_store: Approvals
    pump: DecisionPump
    reloader: BundleReloader
    closed: bool = False
    started_at: float = field(default_factory=time.time)

    def status(self) -> SidecarStatus:
        bundle = self.bundles.current
        policy = PolicyStatus(version=bundle.version, loaded_at=bundle.loaded_at, bundle_dir=str(bundle.directory),
                              reloads=self.reloader.reloads, last_reload_error=self.reloader.last_error,
                              shadow_effects=self.authorizer.shadow_effects())
        pump = PumpStatus(answered=self.pump.answered, batches=self.pump.batches, waiting=self.pump.waiting)
        return SidecarStatus(policy, pump)

    def close(self) -> None:
        """Drains the audit writer, signs a final checkpoint and closes the stores; a
        second call does nothing."""
        if self.closed:
            return
        self.closed = True
        self.reloader.close()
        self.pump.close()
        self.audit_writer.close()
        self.checkpointer.close()  # signs a final checkpoint of everything written
        self.store.close()


def build_sidecar(settings: Settings, *, clock: Clock | None = None) -> Sidecar:
    """Loads everything or raises (BundleError, KeyFileError, StoreUnavailable): a
    sidecar that cannot do its job refuses to start."""
    clock = clock or SystemClock()
    bundle = load_bundle(settings.bundle)
    data = pathlib.Path(settings.data_dir)
    data.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not settings.store:
        _refuse_old_layout(data, settings.database_path)
    keyring = load_keyring(settings.keys_dir, grace_seconds=settings.key_grace_seconds(), clock=clock,
                           create_if_missing=settings.generate_missing_keys)
    if keyring.created_key is not None:
        log.warning("generated a development token signing key in %s (kid %s)", settings.keys_dir,
                    keyring.created_key.kid)
    audit_key = _audit_key(settings)
    if keyring.verification_key(audit_key.kid, clock.now()) is not None:
        raise KeyFileError("the audit key must differ from every token key")
    store = open_store(settings.store_url, pool_size=settings.store_pool_size, migrate=settings.store_migrate)
    audit_log, approval_store, ledger = store.audit_log, store.approvals, store.ledger
    writer = AuditWriter(audit_log)
    checkpointer = Checkpointer(audit_log, audit_key.key, audit_key.kid, clock,
                                interval=settings.audit.checkpoint_interval_seconds)
    t = settings.tokens
    bundles = BundleHolder(bundle)
    issuer = TokenIssuer(keyring, issuer=t.issuer, audience=t.audience, lifetime_seconds=t.lifetime_seconds,
                         clock=clock)
    desk = ApprovalDesk(bundles, approval_store, issuer, writer, clock, settings.approvals.ttl_seconds)
    # Decisions made by other replicas wake this one's watchers (PostgreSQL: LISTEN/NOTIFY).
    store.listen_for_approvals(lambda _approval_id: desk.poke())
    authorizer = Authorizer(
        bundles=bundles, ledger=ledger, issuer=issuer,
        verifier=TokenVerifier(keyring, issuer=t.issuer, audience=t.audience, leeway_seconds=t.leeway_seconds,
                               clock=clock),
        audit=writer, clock=clock, approvals=desk, reissue_window=t.reissue_window_seconds)
    reloader = BundleReloader(bundles, poll_seconds=settings.reload_poll_seconds).start()
    return Sidecar(settings, bundles, store, ledger, audit_log, writer, checkpointer, keyring, audit_key, authorizer,
                   desk, approval_store, DecisionPump(authorizer), reloader)


def _refuse_old_layout(data: pathlib.Path, database: pathlib.Path) -> None:
    """Data directories written before the ledger and the audit trail shared one file
    hold `ledger.db` and `audit.db`. Starting on a fresh database beside them would
    forget which tokens were spent and start a second audit chain, so refuse instead."""
    old = [name for name in ("ledger.db", "audit.db") if (data / name).exists()]
    if old and not database.exists():
        raise StoreUnavailable(
            f"`{data}` holds {' and '.join(old)} from an earlier version, which kept the ledger and the audit "
            f"trail apart; this version keeps both in `{database.name}`. Keep the old files for the record "
            f"(`toolauthz audit verify` of that version checks them), move them out of the data directory, "
            f"and start again")


def _audit_key(settings: Settings) -> SigningKey:
    path = settings.audit_key_file
    if not os.path.exists(path) and settings.generate_missing_keys:
        kid = generate_key_file(path)
        log.warning("generated a development audit signing key at %s (kid %s)", path, kid)
    return load_private_key_file(path)


def create_server(sidecar: Sidecar, address: str | None = None, *, approvals_address: str | None = None,
                  reuse_port: bool = False) -> tuple[AioServer, int]:
    """Builds and starts a gRPC server; returns it with the bound port (use port 0 in tests).

    With `approvals_address` (or `approvals_listen` in the settings) the Approvals service
    listens there instead, on a server of its own (see `create_approvals_server`).
    `reuse_port` lets worker processes share the address (see sidecar/server/workers.py)."""
    settings = sidecar.settings
    names = [pb.DESCRIPTOR.services_by_name["ToolAuthorizer"].full_name,
             aupb.DESCRIPTOR.services_by_name["Audit"].full_name]
    with_approvals = not (approvals_address or settings.approvals_listen)
    if with_approvals:
        names.append(apb.DESCRIPTOR.services_by_name["Approvals"].full_name)

    def build(server: grpc.aio.Server) -> None:
        ours = TolerantRegistration(server)
        pb_grpc.add_ToolAuthorizerServicer_to_server(ToolAuthorizerService(
            sidecar.authorizer, sidecar.pump, sidecar.keyring, sidecar.status), ours)
        aupb_grpc.add_AuditServicer_to_server(AuditService(sidecar.audit_log), ours)
        if with_approvals:
            apb_grpc.add_ApprovalsServicer_to_server(ApprovalsService(sidecar.approvals), ours)

    return _start(settings, build, names, address or settings.listen, reuse_port, healthy=sidecar.store.available)


def create_approvals_server(sidecar: Sidecar, address: str | None = None) -> tuple[AioServer, int]:
    """The Approvals service alone, for deployments that expose it to an approval tool."""
    return _start(sidecar.settings,
                  lambda server: apb_grpc.add_ApprovalsServicer_to_server(ApprovalsService(sidecar.approvals),
                                                                          TolerantRegistration(server)),
                  [apb.DESCRIPTOR.services_by_name["Approvals"].full_name],
                  address or sidecar.settings.approvals_listen)


def _start(settings: Settings, build, names: list[str], address: str,
           reuse_port: bool = False, healthy: Callable[[], bool] | None = None) -> tuple[AioServer, int]:
    options = [("grpc.max_receive_message_length", settings.max_message_bytes),
               ("grpc.max_send_message_length", settings.max_message_bytes),
               # Off unless asked: two sidecars must not silently share a port.
               ("grpc.so_reuseport", 1 if reuse_port else 0)]
    health_servicer = aio_health.HealthServicer()

    def build_all(server) -> None:
        build(server)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)

    server = AioServer(build_all, options=options, max_concurrent_rpcs=settings.max_concurrent_rpcs,
                       thread_pool_size=min(32, settings.max_concurrent_rpcs))
    try:
        port = server.add_insecure_port(address)
        server.start()
        server.run(lambda: _serving(health_servicer, names, healthy))
    except BaseException:
        server.stop(None)
        raise
    return server, port


async def _serving(health_servicer, names: list[str], healthy: Callable[[], bool] | None = None) -> None:
    for name in ("", *names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    if healthy is not None:
        # Runs until the server's loop closes (its tasks are cancelled then).
        asyncio.get_running_loop().create_task(_follow_the_store(health_servicer, names, healthy))


STORE_CHECK_SECONDS = 1.0


async def _follow_the_store(health_servicer, names: list[str], healthy: Callable[[], bool]) -> None:
    """NOT_SERVING while the store cannot be read (every answer would be UNAVAILABLE),
    SERVING again once it can: a load balancer sends requests to replicas that can
    answer them, and nothing needs a restart."""
    loop = asyncio.get_running_loop()
    serving = True
    while True:
        await asyncio.sleep(STORE_CHECK_SECONDS)
        now = await loop.run_in_executor(None, healthy)
        if now != serving:
            serving = now
            log.warning("the store is %s", "reachable again: serving" if now else "unreachable: NOT_SERVING")
            status = health_pb2.HealthCheckResponse.SERVING if now else health_pb2.HealthCheckResponse.NOT_SERVING
            for name in ("", *names):
                await health_servicer.set(name, status)
