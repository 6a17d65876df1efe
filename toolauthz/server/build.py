"""Wiring: one explicit set of components (bundle, stores, keys, authorizer), handed to
the gRPC handlers. No globals, so tests build as many sidecars as they like."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import shlex
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from grpc_health.v1 import _async as aio_health
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from toolauthz.approvals import ApprovalDesk
from toolauthz.audit.retention import load_retention_key
from toolauthz.authorizer import Authorizer
from toolauthz.authorizer.retainer import Retainer
from toolauthz.bundle import Bundle, BundleHolder
from toolauthz.bundle.signature import SIGNATURE_FILE
from toolauthz.clock import Clock, SystemClock
from toolauthz.errors import BundleError, KeyFileError, Problem, StoreUnavailable, ToolAuthzError
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from toolauthz.proto.toolauthz.v1 import audit_pb2 as aupb
from toolauthz.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from toolauthz.server.activation import BUNDLE_LOADED, BUNDLE_REFUSED, floor_revision, hold_to_floor, record_bundle
from toolauthz.server.config import SERVICES, ListenerSettings, Settings
from toolauthz.server.config_changes import config_changes
from toolauthz.server.listeners import (
    check_listener,
    open_listener,
    planned_http_listeners,
    port_of,
    transport_of,
)
from toolauthz.server.probes import BoundedRead
from toolauthz.server.pump import DecisionPump
from toolauthz.server.reload import BundleReloader, load_bundle_snapshot
from toolauthz.server.roles import id_token_verifier, role_policy
from toolauthz.server.sidecar import Sidecar
from toolauthz.service.access import CallerResolver, Gate
from toolauthz.service.approvals import ApprovalsService
from toolauthz.service.audit import AuditService
from toolauthz.service.authorizer import ToolAuthorizerService
from toolauthz.service.callers import TransportRegistration, caller_of
from toolauthz.service.common import TolerantRegistration
from toolauthz.service.refusals import shed_recorder
from toolauthz.service.running import AioServer
from toolauthz.service.watching import WatchLimits
from toolauthz.store.audit_writer import AuditWriter, Checkpointer
from toolauthz.store.open import open_store
from toolauthz.store.retained import RetainedInputs
from toolauthz.store.rules import Store
from toolauthz.telemetry import metrics
from toolauthz.tokens import TokenIssuer, TokenVerifier
from toolauthz.tokens.keyring import MANIFEST, load_keyring
from toolauthz.tokens.keys import SigningKey, generate_key_file, load_private_key_file

if TYPE_CHECKING:  # imported when configured: a bundle server brings the HTTP client
    from toolauthz.server.remote_reload import RemoteBundleReloader
    from toolauthz.server.remote_start import RemoteStart

log = logging.getLogger("toolauthz.server")


def build_sidecar(settings: Settings, *, clock: Clock | None = None, callers: CallerResolver = caller_of) -> Sidecar:
    """Loads everything or raises (BundleError, KeyFileError, StoreUnavailable): a
    sidecar that cannot do its job refuses to start. `callers` resolves who is calling
    from an RPC's context (tests inject their own)."""
    clock = clock or SystemClock()
    bundle_keys = settings.bundle_verification.public_keys() if settings.bundle_verification else None
    first = _first_remote_bundle(settings, bundle_keys) if settings.bundle_server is not None else None
    bundle = first.bundle if first is not None else load_bundle_snapshot(settings.bundle, bundle_keys)
    data = pathlib.Path(settings.data_dir)
    data.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not settings.store:
        _refuse_old_layout(data, settings.database_path)
    _require_keys(settings)
    keyring = load_keyring(settings.keys_dir, grace_seconds=settings.key_grace_seconds(), clock=clock,
                           create_if_missing=settings.generate_missing_keys)
    if keyring.created_key is not None:
        log.warning("generated a development token signing key in %s (kid %s)", settings.keys_dir,
                    keyring.created_key.kid)
    audit_key = _audit_key(settings)
    if keyring.verification_key(audit_key.kid, clock.now()) is not None:
        raise KeyFileError("the audit key must differ from every token key")
    store = open_store(settings.store_url, pool_size=settings.store_pool_size, migrate=settings.store_migrate,
                       chains=settings.audit_chains, timeout=settings.store_hang_seconds,
                       hang_seconds=settings.store_hang_seconds)
    audit_log, approval_store, ledger = store.audit_log, store.approvals, store.ledger
    writer = AuditWriter(audit_log)
    try:
        bundle = _activate(bundle, bundle_keys, store, writer, clock, first)
    except BaseException:
        store.close()
        raise
    checkpointer = Checkpointer(audit_log, audit_key.key, audit_key.kid, clock,
                                interval=settings.audit.checkpoint_interval_seconds)
    t = settings.tokens
    bundles = BundleHolder(bundle)
    issuer = TokenIssuer(keyring, issuer=t.issuer, audience=t.audience, lifetime_seconds=t.lifetime_seconds,
                         clock=clock)
    desk = ApprovalDesk(bundles, approval_store, issuer, writer, clock, settings.approvals.ttl_seconds,
                        id_tokens=id_token_verifier(settings, clock), calls=ledger)
    # Decisions made by other replicas wake this one's watchers (PostgreSQL: LISTEN/NOTIFY).
    store.listen_for_approvals(lambda _approval_id: desk.poke())
    authorizer = Authorizer(
        bundles=bundles, ledger=ledger, issuer=issuer,
        verifier=TokenVerifier(keyring, issuer=t.issuer, audience=t.audience, leeway_seconds=t.leeway_seconds,
                               clock=clock),
        audit=writer, clock=clock, approvals=desk, reissue_window=t.reissue_window_seconds,
        retainer=_retainer(settings, bundle, clock))
    reloader: BundleReloader | RemoteBundleReloader
    if first is not None and settings.bundle_server is not None and bundle_keys is not None:
        from toolauthz.server.remote_reload import PollSchedule, RemoteBundleReloader
        from toolauthz.server.remote_start import CACHE_FILE

        server = settings.bundle_server
        first.keep(settings.data_dir / CACHE_FILE)
        reloader = RemoteBundleReloader(
            bundles, first.fetcher, first.fetched, keys=bundle_keys, audit=writer, clock=clock,
            floor=store.bundle_floor, retaining=authorizer.retainer is not None,
            settings_changes=lambda: config_changes(settings),
            schedule=PollSchedule(server.poll_seconds, server.jitter, server.max_backoff_seconds,
                                  server.revalidate_every),
            limits=server.archive_limits(), cache=settings.data_dir / CACHE_FILE,
            start_problem=first.problem, start_unreachable=first.unreachable).start()
    else:
        reloader = BundleReloader(bundles, poll_seconds=settings.reload_poll_seconds, keys=bundle_keys,
                                  audit=writer, clock=clock, floor=store.bundle_floor,
                                  retaining=authorizer.retainer is not None,
                                  settings_changes=lambda: config_changes(settings)).start()
    watches = WatchLimits(per_caller=settings.approvals.max_watches_per_caller, total=settings.approvals.max_watches)
    metrics.serving_version(bundle.version)
    gate = Gate(role_policy(settings), writer, clock, callers)
    gate.refusals.start()  # a minute's counts are written once it ends, refused again or not
    notifier = None
    if settings.notifications is not None:  # the sinks' modules are loaded only by a sidecar that sends
        from toolauthz.server.notifications import notifier_of

        notifier = notifier_of(settings.notifications, store, bundles, clock)
    pump = DecisionPump(authorizer, max_queue_seconds=settings.max_queue_seconds or None)
    pump.on_shed = shed_recorder(gate.refusals)
    return Sidecar(settings, bundles, store, ledger, audit_log, writer, checkpointer, keyring, audit_key, authorizer,
                   desk, approval_store, pump, reloader, watches, gate, notifier)


def _activate(bundle: Bundle, keys: Mapping[str, Ed25519PublicKey] | None, store: Store, audit: AuditWriter,
              clock: Clock, first: RemoteStart | None) -> Bundle:
    """The bundle this process starts with, held to the store's revision floor (a restart,
    a new replica or a fresh pod never serves an older signed revision, whether it reads a
    directory or a bundle server), recorded in the audit trail as a reload is: one record
    for the start, which also says when a bundle server's kept archive serves instead of
    the server's (`first`). A bundle below the floor refuses the start, recorded too."""
    detail: dict[str, object] = {"at": "start"}
    if first is not None:
        detail["source"] = first.fetcher.url
        if first.problem:
            detail.update({"kept_archive": True, "reason": first.problem[:2000],
                           "server_unreachable": first.unreachable})
    if keys is not None:
        try:
            floor = floor_revision(store.bundle_floor, None)
            if floor is not None and bundle.revision is not None and bundle.revision < floor:
                raise BundleError([Problem(SIGNATURE_FILE, f"refused: the bundle's revision {bundle.revision} is "
                                                           f"below the floor, {floor}: a rollback is refused "
                                                           "(toolauthz bundle allow-rollback)")])
            hold_to_floor(bundle, store.bundle_floor, clock.now())
        except BundleError as exc:
            record_bundle(audit, clock, BUNDLE_REFUSED, bundle, ("bundle_signature",),
                          {**detail, "reason": str(exc)[:2000]})
            metrics.BUNDLE_SIGNATURE_REFUSALS.inc()
            raise
    record_bundle(audit, clock, BUNDLE_LOADED, bundle, (), detail)
    return bundle


def _first_remote_bundle(settings: Settings, keys: Mapping[str, Ed25519PublicKey] | None) -> RemoteStart:
    """The bundle server's bundle to start with, or the kept last good one."""
    from toolauthz.bundle.remote import BundleFetcher
    from toolauthz.server.remote_start import CACHE_FILE, first_bundle

    if settings.bundle_server is None or keys is None:  # the settings require both together
        raise ToolAuthzError("a bundle server needs `bundle_verification`")
    fetcher = BundleFetcher(settings.bundle_server.fetch_options())
    settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return first_bundle(fetcher, keys, settings.bundle_server.archive_limits(), settings.data_dir / CACHE_FILE)


def _retainer(settings: Settings, bundle: Bundle, clock: Clock) -> Retainer | None:
    """Where retained inputs go (`audit.retain_input`), with the retention key: made in
    development, required in production once a tool retains. Without a key file and
    with no tool retaining, nothing is retained (a later bundle that asks is logged)."""
    path = settings.retention_key_file
    retaining = any(s.tool.retain_input_seconds for s in bundle.tools.values())
    if not path.exists():
        if retaining and not settings.generate_missing_keys:
            raise KeyFileError(f"a tool retains its inputs (audit.retain_input): the retention key `{path}` is "
                               "missing (a file of 32 random bytes, mode 0600)")
        if not retaining:
            return None
    key = load_retention_key(path, create=settings.generate_missing_keys)
    return Retainer(RetainedInputs(settings.store_url, timeout=5.0), key, clock)


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


def _require_keys(settings: Settings) -> None:
    """A sidecar that may not generate its keys names the command that creates them."""
    if settings.generate_missing_keys:
        return
    data_dir = shlex.quote(str(settings.data_dir))
    if not os.path.lexists(settings.keys_dir / MANIFEST):
        raise KeyFileError(f"no token signing keys in `{settings.keys_dir}` (no `{MANIFEST}`): create them with "
                           f"`toolauthz keys generate --data-dir {data_dir}`, which creates the audit key too")
    if not os.path.lexists(settings.audit_key_file):
        raise KeyFileError(f"no audit checkpoint key at `{settings.audit_key_file}`: create it with "
                           f"`toolauthz keys generate --audit --data-dir {data_dir}`")


def _audit_key(settings: Settings) -> SigningKey:
    path = settings.audit_key_file
    if not os.path.exists(path) and settings.generate_missing_keys:
        kid = generate_key_file(path)
        log.warning("generated a development audit signing key at %s (kid %s)", path, kid)
    return load_private_key_file(path)


def create_server(sidecar: Sidecar, address: str | None = None, *, approvals_address: str | None = None,
                  reuse_port: bool = False) -> tuple[AioServer, int]:
    """Builds and starts a gRPC server; returns it with the bound port (use port 0 in tests;
    0 for a Unix socket).

    With `approvals_address` (or `approvals_listen` in the settings) the Approvals service
    listens there instead, on a server of its own (see `create_approvals_server`).
    `reuse_port` lets worker processes share the address (see toolauthz/server/workers.py)."""
    settings = sidecar.settings
    approvals_apart = bool(approvals_address or settings.approvals_listen)
    services = tuple(s for s in SERVICES if s != "approvals" or not approvals_apart)
    server, bound = create_listener_server(sidecar, ListenerSettings(address=address or settings.listen,
                                                                     services=services), reuse_port=reuse_port)
    try:
        start_web(sidecar, server, reuse_port)
    except BaseException:
        server.stop(None)
        raise
    return server, port_of(bound)


def start_web(sidecar: Sidecar, server: AioServer, reuse_port: bool) -> tuple[tuple[str, ...], str]:
    """The HTTP/JSON API's listeners and the console, when configured, on `server`'s loop
    (`toolauthz/server/web.py`); returns their addresses as served. Their libraries
    (Starlette, uvicorn, Jinja2) are loaded only by a sidecar that serves them."""
    listeners = planned_http_listeners(sidecar.settings)
    if not listeners and not sidecar.settings.console_listen:
        return (), ""
    from toolauthz.server import web

    return web.start_http(sidecar, server, listeners, reuse_port), web.start_console(sidecar, server, reuse_port)


def create_approvals_server(sidecar: Sidecar, address: str | None = None) -> tuple[AioServer, int]:
    """The Approvals service alone, for deployments that expose it to an approval tool."""
    server, bound = create_listener_server(sidecar, ListenerSettings(
        address=address or sidecar.settings.approvals_listen, services=("approvals",)))
    return server, port_of(bound)


def create_listener_server(sidecar: Sidecar, listener: ListenerSettings, *,
                           reuse_port: bool = False) -> tuple[AioServer, str]:
    """A started server for one listener, with its services only (health and reflection
    on every listener); returns it with the address it serves (port 0 resolved). Its
    handlers learn the listener's Transport through `caller_of` (toolauthz/service/callers.py)."""
    check_listener(listener)
    transport = transport_of(listener)
    names: list[str] = []
    if "authorizer" in listener.services:
        names.append(pb.DESCRIPTOR.services_by_name["ToolAuthorizer"].full_name)
    if "audit" in listener.services:
        names.append(aupb.DESCRIPTOR.services_by_name["Audit"].full_name)
    if "approvals" in listener.services:
        names.append(apb.DESCRIPTOR.services_by_name["Approvals"].full_name)

    def build(server: grpc.aio.Server) -> None:
        ours = TransportRegistration(TolerantRegistration(server), transport)
        if "authorizer" in listener.services:
            pb_grpc.add_ToolAuthorizerServicer_to_server(ToolAuthorizerService(
                sidecar.authorizer, sidecar.pump, sidecar.keyring, sidecar.status, gate=sidecar.gate,
                batch_limits=sidecar.settings.batch.limits()), ours)
        if "audit" in listener.services:
            aupb_grpc.add_AuditServicer_to_server(AuditService(sidecar.audit_log, gate=sidecar.gate), ours)
        if "approvals" in listener.services:
            apb_grpc.add_ApprovalsServicer_to_server(
                ApprovalsService(sidecar.approvals, sidecar.watches, gate=sidecar.gate), ours)

    # SO_REUSEPORT means nothing to a Unix socket, whose path one process binds.
    tcp = not listener.address.startswith("unix:")
    return _start(sidecar.settings, build, names, listener, reuse_port and tcp,
                  healthy=BoundedRead(sidecar.store.available, sidecar.settings.store_hang_seconds).wait)


def _start(settings: Settings, build, names: list[str], listener: ListenerSettings,
           reuse_port: bool = False, healthy: Callable[[], Awaitable[bool]] | None = None) -> tuple[AioServer, str]:
    options = [("grpc.max_receive_message_length", settings.max_message_bytes),
               ("grpc.max_send_message_length", settings.max_message_bytes),
               # Off unless asked: two sidecars must not silently share a port.
               ("grpc.so_reuseport", 1 if reuse_port else 0)]
    if settings.max_streams_per_connection:
        options.append(("grpc.max_concurrent_streams", settings.max_streams_per_connection))
    health_servicer = aio_health.HealthServicer()

    def build_all(server) -> None:
        build(server)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)

    server = AioServer(build_all, options=options, max_concurrent_rpcs=settings.max_concurrent_rpcs,
                       max_streaming_rpcs=settings.max_streaming_rpcs,
                       thread_pool_size=min(32, settings.max_concurrent_rpcs),
                       # Draining: health watchers and probes hear NOT_SERVING first.
                       before_stop=health_servicer.enter_graceful_shutdown)
    try:
        bound = open_listener(server, listener)
        server.start()
        server.run(lambda: _serving(health_servicer, names, healthy))
    except BaseException:
        server.stop(None)
        raise
    return server, bound


async def _serving(health_servicer, names: list[str], healthy: Callable[[], Awaitable[bool]] | None = None) -> None:
    for name in ("", *names):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    if healthy is not None:
        # Runs until the server's loop closes (its tasks are cancelled then).
        asyncio.get_running_loop().create_task(_follow_the_store(health_servicer, names, healthy))


STORE_CHECK_SECONDS = 1.0


async def _follow_the_store(health_servicer, names: list[str], healthy: Callable[[], Awaitable[bool]]) -> None:
    """NOT_SERVING while the store cannot be read (every answer would be UNAVAILABLE),
    SERVING again once it can: a load balancer sends requests to replicas that can
    answer them, and nothing needs a restart."""
    serving = True
    while True:
        await asyncio.sleep(STORE_CHECK_SECONDS)
        now = await healthy()
        if now != serving:
            serving = now
            log.warning("the store is %s", "reachable again: serving" if now else "unreachable: NOT_SERVING")
            status = health_pb2.HealthCheckResponse.SERVING if now else health_pb2.HealthCheckResponse.NOT_SERVING
            for name in ("", *names):
                await health_servicer.set(name, status)
