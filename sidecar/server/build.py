"""Wiring: one explicit set of components (bundle, stores, keys, authorizer), handed to
the gRPC handlers. No globals, so tests build as many sidecars as they like."""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import _async as aio_health
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sidecar.approvals import ApprovalDesk
from sidecar.audit.retention import load_retention_key
from sidecar.authorizer import Authorizer
from sidecar.bundle import Bundle, BundleHolder
from sidecar.clock import Clock, SystemClock
from sidecar.console import Console, ConsoleDeps
from sidecar.console.session import Sessions, load_or_create_secret
from sidecar.console.signin import Authenticator, DevSignIn, OidcSignIn, ProxySignIn
from sidecar.errors import KeyFileError, StoreUnavailable, ToolAuthzError
from sidecar.notify import Notifier
from sidecar.proto.toolauthz.v1 import approvals_pb2 as apb
from sidecar.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from sidecar.proto.toolauthz.v1 import audit_pb2 as aupb
from sidecar.proto.toolauthz.v1 import audit_pb2_grpc as aupb_grpc
from sidecar.proto.toolauthz.v1 import authorizer_pb2 as pb
from sidecar.proto.toolauthz.v1 import authorizer_pb2_grpc as pb_grpc
from sidecar.retainer import Retainer
from sidecar.server.config import SERVICES, ListenerSettings, Settings
from sidecar.server.listeners import (
    TcpAddress,
    bind_http_socket,
    check_listener,
    http_ssl_context,
    open_listener,
    parse_address,
    planned_http_listeners,
    port_of,
    split_listen,
    transport_of,
)
from sidecar.server.notifications import dead_letters_of, notifier_of
from sidecar.server.pump import DecisionPump
from sidecar.server.reload import BundleReloader, load_bundle_snapshot
from sidecar.server.roles import id_token_verifier, role_policy
from sidecar.server.worker_status import StatusBoard
from sidecar.service.access import CallerResolver, Gate
from sidecar.service.approvals import ApprovalsService
from sidecar.service.audit import AuditService
from sidecar.service.authorizer import ToolAuthorizerService
from sidecar.service.callers import TransportRegistration, caller_of
from sidecar.service.common import TolerantRegistration
from sidecar.service.http_api import HttpApi, HttpListener, any_host, host_rule
from sidecar.service.loopback import is_loopback_host
from sidecar.service.running import AioServer
from sidecar.service.status import PolicyStatus, PumpStatus, SidecarStatus, WorkerStatus, aggregate
from sidecar.service.watching import WatchLimits
from sidecar.store import Store
from sidecar.store.audit_writer import AuditWriter, Checkpointer
from sidecar.store.open import open_store
from sidecar.store.retained import RetainedInputs
from sidecar.store.rules import Approvals, AuditLogOf, Ledger
from sidecar.telemetry import metrics
from sidecar.tokens import TokenIssuer, TokenVerifier
from sidecar.tokens.keyring import MANIFEST, KeyRing, load_keyring
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
    watches: WatchLimits
    gate: Gate  # every handler's check of its caller's roles and tenants
    notifier: Notifier | None = None  # approval notifications (`notifications:`), started by the server
    closed: bool = False
    started_at: float = field(default_factory=time.time)
    worker_index: int = 0
    # With several workers: every worker's status, through the run directory.
    board: StatusBoard | None = None
    _sampler: threading.Thread | None = None
    _sampling_stop: threading.Event = field(default_factory=threading.Event)

    def worker_status(self) -> WorkerStatus:
        bundle = self.bundles.current
        policy = PolicyStatus(version=bundle.version, loaded_at=bundle.loaded_at, bundle_dir=str(bundle.directory),
                              reloads=self.reloader.reloads, last_reload_error=self.reloader.last_error,
                              shadow_effects=self.authorizer.shadow_effects())
        pump = PumpStatus(answered=self.pump.answered, batches=self.pump.batches, waiting=self.pump.waiting)
        return WorkerStatus(self.worker_index, os.getpid(), policy, pump)

    def status(self) -> SidecarStatus:
        workers = self.board.read_all() if self.board is not None else [self.worker_status()]
        return aggregate(workers, answered_by=os.getpid())

    def share_status(self, directory: pathlib.Path, index: int) -> None:
        """Publish this worker's status in `directory` and answer GetStatus for every
        worker that does (sidecar/server/worker_status.py)."""
        self.worker_index = index
        self.board = StatusBoard(directory, self.worker_status).start()
        self.pump.after_batch = self.board.changed
        self.reloader.after_attempt = self.board.changed

    def sample_metrics(self, interval: float = 5.0) -> None:
        """Keep the gauges the store knows (approvals pending) current for the scrapes."""
        def run() -> None:
            while True:
                try:
                    metrics.APPROVALS_PENDING.set(self.approval_store.count_pending(time.time()))
                except StoreUnavailable as exc:
                    log.warning("cannot count pending approvals: %s", exc)
                if self._sampling_stop.wait(interval):
                    return

        self._sampler = threading.Thread(target=run, name="metrics-sampler", daemon=True)
        self._sampler.start()

    def close(self) -> None:
        """Drains the audit writer, signs a final checkpoint and closes the stores; a
        second call does nothing."""
        if self.closed:
            return
        self.closed = True
        self._sampling_stop.set()
        if self._sampler is not None:
            self._sampler.join()
        self.reloader.close()
        if self.notifier is not None:
            self.notifier.close()
        self.pump.close()
        if self.board is not None:
            self.board.close()
        self.gate.refusals.close()  # the refusals still counted, written before the writer drains
        self.audit_writer.close()
        if self.authorizer.retainer is not None:
            self.authorizer.retainer.store.close()
        self.checkpointer.close()  # signs a final checkpoint of everything written
        self.store.close()


def build_sidecar(settings: Settings, *, clock: Clock | None = None, callers: CallerResolver = caller_of) -> Sidecar:
    """Loads everything or raises (BundleError, KeyFileError, StoreUnavailable): a
    sidecar that cannot do its job refuses to start. `callers` resolves who is calling
    from an RPC's context (tests inject their own)."""
    clock = clock or SystemClock()
    bundle_keys = settings.bundle_verification.public_keys() if settings.bundle_verification else None
    bundle = load_bundle_snapshot(settings.bundle, bundle_keys)
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
                       chains=settings.audit_chains)
    audit_log, approval_store, ledger = store.audit_log, store.approvals, store.ledger
    writer = AuditWriter(audit_log)
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
    reloader = BundleReloader(bundles, poll_seconds=settings.reload_poll_seconds, keys=bundle_keys, audit=writer,
                              clock=clock).start()
    watches = WatchLimits(per_caller=settings.approvals.max_watches_per_caller, total=settings.approvals.max_watches)
    metrics.serving_version(bundle.version)
    gate = Gate(role_policy(settings), writer, clock, callers)
    gate.refusals.start()  # a minute's counts are written once it ends, refused again or not
    notifier = notifier_of(settings.notifications, store, bundles, clock)
    pump = DecisionPump(authorizer, max_queue_seconds=settings.max_queue_seconds or None)
    return Sidecar(settings, bundles, store, ledger, audit_log, writer, checkpointer, keyring, audit_key, authorizer,
                   desk, approval_store, pump, reloader, watches, gate, notifier)


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
    `reuse_port` lets worker processes share the address (see sidecar/server/workers.py)."""
    settings = sidecar.settings
    approvals_apart = bool(approvals_address or settings.approvals_listen)
    services = tuple(s for s in SERVICES if s != "approvals" or not approvals_apart)
    server, bound = create_listener_server(sidecar, ListenerSettings(address=address or settings.listen,
                                                                     services=services), reuse_port=reuse_port)
    try:
        start_http(sidecar, server, planned_http_listeners(settings), reuse_port)
        start_console(sidecar, server, reuse_port)
    except BaseException:
        server.stop(None)
        raise
    return server, port_of(bound)


def start_http(sidecar: Sidecar, server: AioServer, listeners: tuple[ListenerSettings, ...],
               reuse_port: bool) -> tuple[str, ...]:
    """The HTTP/JSON API on each of `listeners`, on a gRPC server's loop, handing its work
    to the same pump; they stop with that server (Unix socket files removed then). Returns
    the addresses served (port 0 resolved); the first TCP one's port is `server.http_port`."""
    if not listeners:
        return ()
    settings = sidecar.settings
    api = HttpApi(sidecar.authorizer, sidecar.pump, sidecar.keyring, gate=sidecar.gate,
                  max_body_bytes=settings.max_message_bytes, max_concurrent=settings.max_concurrent_rpcs,
                  batch_limits=settings.batch.limits())
    served = tuple(_serve_http(server, api, listener, reuse_port) for listener in listeners)
    server.http_port = next((port_of(address) for address in served if port_of(address)), None)
    return served


def _serve_http(server: AioServer, api: HttpApi, listener: ListenerSettings, reuse_port: bool) -> str:
    """Serves `api` on `listener`; returns the address served (port 0 resolved)."""
    address = parse_address(listener.address)
    tcp = isinstance(address, TcpAddress)
    tls = http_ssl_context(listener.tls) if listener.tls is not None else None
    sock, remove = bind_http_socket(listener, reuse_port and tcp)
    server.after_stop(remove)
    answers_host = host_rule(plaintext=tcp and tls is None,
                             loopback=isinstance(address, TcpAddress) and address.loopback)
    serving = server.run(lambda: HttpListener.start(api.app, sock, transport=transport_of(listener),
                                                    answers_host=answers_host, tls=tls))
    server.add_companion(serving.stop)
    return f"{address.host}:{serving.port}" if isinstance(address, TcpAddress) else str(address)


def console_of(sidecar: Sidecar) -> Console:
    """The browser console of `console_listen` over this sidecar's desk and audit log,
    with the authenticator `console.sign_in` names."""
    settings = sidecar.settings
    c = settings.console
    loopback = is_loopback_host(split_listen(settings.console_listen)[0].strip("[]"))
    authenticator: Authenticator
    if c.sign_in == "proxy" and c.proxy is not None:
        p = c.proxy
        authenticator = ProxySignIn(p.trusted, user_header=p.user_header, groups_header=p.groups_header,
                                    tenant_header=p.tenant_header, principal_type=p.principal_type, tenant=p.tenant)
    elif c.sign_in == "oidc" and c.oidc is not None and sidecar.approvals.id_tokens is not None:
        authenticator = OidcSignIn(sidecar.approvals.proof.prove_person, c.oidc.tenant)
    elif c.sign_in == "dev":
        authenticator = DevSignIn(loopback=loopback)
    else:
        raise ToolAuthzError(f"console.sign_in `{c.sign_in}` is not configured completely")
    deps = ConsoleDeps(sidecar.approvals, sidecar.audit_log, sidecar.audit_key.public_key, sidecar.status,
                       dead_letters=dead_letters_of(sidecar.store, settings.notifications))
    sessions = Sessions(load_or_create_secret(pathlib.Path(settings.data_dir)), c.session_seconds)
    return Console(deps, authenticator, sessions, auditor_groups=c.auditor_groups, loopback=loopback)


def start_console(sidecar: Sidecar, server: AioServer, reuse_port: bool) -> str:
    """The console on `console_listen`, on a gRPC server's loop (as the HTTP API is), so a
    decision made there pokes the same desk's watchers; stopped with that server. Returns
    the address served (port 0 resolved; `server.console_port`), or "" when it is off."""
    address = sidecar.settings.console_listen
    if not address:
        return ""
    console = console_of(sidecar)
    # Plaintext off loopback is allowed: the console then sits behind the reverse proxy
    # that terminates TLS (and, with `proxy` sign-in, authenticates people).
    listener = ListenerSettings(address=address, insecure=True)
    sock, _remove = bind_http_socket(listener, reuse_port)
    serving = server.run(lambda: HttpListener.start(console.app, sock, transport=transport_of(listener),
                                                    answers_host=any_host))
    server.add_companion(serving.stop)
    server.console_port = serving.port
    return f"{split_listen(address)[0]}:{serving.port}"


def create_approvals_server(sidecar: Sidecar, address: str | None = None) -> tuple[AioServer, int]:
    """The Approvals service alone, for deployments that expose it to an approval tool."""
    server, bound = create_listener_server(sidecar, ListenerSettings(
        address=address or sidecar.settings.approvals_listen, services=("approvals",)))
    return server, port_of(bound)


def create_listener_server(sidecar: Sidecar, listener: ListenerSettings, *,
                           reuse_port: bool = False) -> tuple[AioServer, str]:
    """A started server for one listener, with its services only (health and reflection
    on every listener); returns it with the address it serves (port 0 resolved). Its
    handlers learn the listener's Transport through `caller_of` (sidecar/service/callers.py)."""
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
                  healthy=sidecar.store.available)


def _start(settings: Settings, build, names: list[str], listener: ListenerSettings,
           reuse_port: bool = False, healthy: Callable[[], bool] | None = None) -> tuple[AioServer, str]:
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
