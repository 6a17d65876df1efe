"""The whole configuration: one model whose sections live in the modules beside it."""

from __future__ import annotations

import pathlib
import urllib.parse
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from toolauthz.audit.records import DEFAULT_CHAINS, MAX_CHAINS
from toolauthz.errors import ToolAuthzError
from toolauthz.server.config.base import StrictModel
from toolauthz.server.config.bundle_server import BundleServerSettings
from toolauthz.server.config.listening import ListenerSettings
from toolauthz.server.config.notifications import NotificationSettings
from toolauthz.server.config.observing import DecisionLogSettings, TracingSettings
from toolauthz.server.config.people import ApproverSettings, CallerSettings, ConsoleSettings
from toolauthz.server.config.sections import (
    ApprovalSettings,
    AuditSettings,
    BatchSettings,
    BundleVerificationSettings,
    TokenSettings,
)
from toolauthz.store.open import parse_store_url

DATABASE_FILE = "toolauthz.db"


class Settings(StrictModel):
    # The config file these settings were read from, and what it held: a reload compares
    # the file with them to say what changed that only a restart applies (config_changes.py).
    _config_file: pathlib.Path | None = PrivateAttr(default=None)
    _config_values: dict[str, Any] = PrivateAttr(default_factory=dict)

    bundle: pathlib.Path = pathlib.Path("policies")
    """The bundle directory: the tool catalog, the Cedar policies and the entities (`toolauthz check`
    validates one)."""
    bundle_verification: BundleVerificationSettings | None = None
    """Verify every bundle against its signature before it loads (at start and each reload)."""
    bundle_server: BundleServerSettings | None = None
    """Poll a bundle server for the bundle archive instead of reading `bundle` (a directory);
    docs/bundle-server.md."""
    listen: str = "127.0.0.1:50051"
    """The gRPC address, `HOST:PORT` or `unix:///path`, plaintext; ignored when `listeners` is set."""
    approvals_listen: str = ""
    """Serve the Approvals service on its own address instead of `listen` (empty: same server)."""
    listeners: tuple[ListenerSettings, ...] = ()
    """Addresses with their services and TLS; empty: `listen` (and `approvals_listen`)."""
    http_listen: str = ""
    """The HTTP/JSON API (toolauthz/service/http_api.py) on one plaintext loopback address, e.g.
    127.0.0.1:8080; empty: off. Its callers are unauthenticated."""
    http_listeners: tuple[ListenerSettings, ...] = ()
    """The HTTP/JSON API's addresses with TLS (mTLS authenticates callers) or as Unix sockets with an
    identity, checked as `listeners` are; replaces `http_listen`."""
    console_listen: str = ""
    """The browser console for approvers and auditors (toolauthz/console/), HOST:PORT; empty: off."""
    console: ConsoleSettings = ConsoleSettings()
    data_dir: pathlib.Path = pathlib.Path(".toolauthz")
    """Where the keys (`keys/`, `audit-key.pem`, `retention-key`) and the default SQLite store live."""
    generate_missing_keys: bool = True
    """Development convenience: create the token and audit keys under data_dir if absent."""
    reload_poll_seconds: float = Field(1.0, ge=0)
    """Seconds between looks at the bundle directory for changes; 0 = reload on SIGHUP only."""
    max_concurrent_rpcs: int = Field(1024, ge=1)
    """Unary calls (Authorize, Verify, ...) the server handles at once, over every service; one more is
    RESOURCE_EXHAUSTED once its request was read, before its handler runs (a health Check never is). Streaming
    calls count apart, in `max_streaming_rpcs`. A backstop for memory: under load the decision queue's bound
    in time (`max_queue_seconds`) refuses first, fairly across connections, as long as this stays above the
    calls a worker decides in that time plus its running batch (a quarter of that time's)."""
    max_streaming_rpcs: int = Field(1000, ge=1)
    """Streaming calls open at once (health Watch, reflection, WatchApproval, QueryDecisions), over every service;
    one more is RESOURCE_EXHAUSTED once its request was read. They count apart from `max_concurrent_rpcs`: a
    stream stays open as long as its client wants, and idle streams must not refuse the decisions. Not HTTP/2's
    MAX_CONCURRENT_STREAMS, which is `max_streams_per_connection`."""
    max_queue_seconds: float = Field(0.5, ge=0, le=60)
    """A call that would wait longer than this for its decision, or past its own deadline, is refused at once
    (RESOURCE_EXHAUSTED, no token, safe to retry): the queue is bounded by time and takes the connections' calls
    in turn (server/pump.py). The estimate starts once the event loop has read the call, so under sustained
    overload an admitted call waits up to about twice this in all. 0: no bound, and no refusal by deadline
    either."""
    max_streams_per_connection: int = Field(0, ge=0, le=65536)
    """Calls one client connection may have open at once (HTTP/2 MAX_CONCURRENT_STREAMS), enforced by gRPC's
    transport before the interpreter sees a call: a client waits to send more, and what it sent over the
    limit is refused unprocessed (UNAVAILABLE, safe to retry). 0: gRPC's default, no limit.
    docs/performance.md, "Overload"."""
    max_message_bytes: int = Field(4 << 20, ge=1024)
    """The largest gRPC message received or sent, in bytes."""
    tokens: TokenSettings = TokenSettings()
    audit: AuditSettings = AuditSettings()
    approvals: ApprovalSettings = ApprovalSettings()
    batch: BatchSettings = BatchSettings()
    notifications: NotificationSettings | None = None
    metrics_listen: str = ""
    """HOST:PORT serving Prometheus text at /metrics (summed over the workers); empty: off."""
    tracing: TracingSettings = TracingSettings()
    log_format: Literal["text", "json"] = "text"
    """`json`: one JSON object per log line (toolauthz/server/logs.py)."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """The least severe level logged (`serve --log-level` overrides it)."""
    decision_log: DecisionLogSettings = DecisionLogSettings()
    drain_grace_seconds: float = Field(10.0, ge=0, le=3600)
    """On SIGTERM: calls in flight get this long to finish before they are cancelled."""
    callers: tuple[CallerSettings, ...] = ()
    """Who may call which RPC, for which tenants; empty: roles are not enforced."""
    approvers: ApproverSettings = ApproverSettings()

    store: str = ""
    """Where the ledger, the approvals and the audit trail live: `sqlite:///path` or `postgresql://...`
    (shared by a fleet); empty: `sqlite:///<data_dir>/toolauthz.db`."""
    store_pool_size: int = Field(8, ge=1, le=256)
    """PostgreSQL connections per process"""
    store_migrate: bool = False
    """Serving upgrades an older PostgreSQL schema first (else it refuses to start)."""
    store_hang_seconds: float = Field(5.0, gt=0, le=300)
    """PostgreSQL: seconds a database operation, a wait for a connection or a health probe may take before it is
    cut: the call is answered UNAVAILABLE and health turns NOT_SERVING until the database answers again (TCP
    keepalives, the TCP user timeout and the server's statement_timeout follow it too)."""
    audit_chains: int = Field(DEFAULT_CHAINS, ge=1, le=MAX_CHAINS)
    """The audit chains new records are spread over (by tenant and call id): writers of different chains never
    wait for each other (docs/performance.md, the fleet)."""

    @field_validator("store")
    @classmethod
    def _known_store(cls, value: str) -> str:
        if value:
            try:
                parse_store_url(value)
            except ToolAuthzError as exc:
                raise ValueError(str(exc)) from None
        return value

    @property
    def store_url(self) -> str:
        return self.store or f"sqlite://{self.database_path.absolute()}"

    @property
    def store_shown(self) -> str:
        """The store for a log line: `sqlite:///path`, or `postgresql://user@host:port/db`
        without the password and without the query (which may hold one, `?password=`)."""
        url = self.store_url
        if url.startswith("sqlite://"):
            return url
        parts = urllib.parse.urlsplit(url)
        user = f"{urllib.parse.unquote(parts.username)}@" if parts.username else ""
        try:
            port = f":{parts.port}" if parts.port else ""
        except ValueError:
            port = ""
        return f"{parts.scheme}://{user}{parts.hostname or ''}{port}{parts.path}"

    @model_validator(mode="after")
    def _served_bundles_are_signed(self) -> Settings:
        if self.bundle_server is not None and self.bundle_verification is None:
            raise ValueError("a bundle from `bundle_server` must be signed: set `bundle_verification`")
        if self.bundle_server is not None and "bundle" in self.model_fields_set:
            # One source: a directory named too would be silently ignored.
            raise ValueError("`bundle` (a directory) and `bundle_server` exclude each other: give one")
        return self

    @model_validator(mode="after")
    def _watches_leave_room(self) -> Settings:
        watches = self.approvals.max_watches
        if watches >= self.max_concurrent_rpcs:  # the HTTP API's waits count as its calls
            raise ValueError(f"approvals.max_watches ({watches}) must be below max_concurrent_rpcs "
                             f"({self.max_concurrent_rpcs}): open HTTP approval waits take places of "
                             "max_concurrent_rpcs on the HTTP API, and its decisions need some")
        if watches >= self.max_streaming_rpcs:
            raise ValueError(f"approvals.max_watches ({watches}) must be below max_streaming_rpcs "
                             f"({self.max_streaming_rpcs}): open WatchApproval streams take places of "
                             "max_streaming_rpcs, and health watches need some")
        return self

    @model_validator(mode="after")
    def _one_entry_per_caller(self) -> Settings:
        ids = [caller.id for caller in self.callers]
        if len(ids) != len(set(ids)):
            raise ValueError("each caller id may be listed once in `callers`")
        return self

    @model_validator(mode="after")
    def _console_sign_in(self) -> Settings:
        if not self.console_listen:
            return self
        from toolauthz.service.loopback import is_loopback_host

        host, sep, port = self.console_listen.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"console_listen must be HOST:PORT, not `{self.console_listen}`")
        host = host.strip("[]")
        console = self.console
        if console.sign_in == "dev" and not is_loopback_host(host):
            raise ValueError(f"console.sign_in `dev` lets anyone sign in as anyone: it is allowed only when "
                             f"console_listen is a loopback address, not `{self.console_listen}`")
        if console.sign_in == "proxy" and console.proxy is None:
            raise ValueError("console.sign_in `proxy` needs `console.proxy` (its trusted addresses and headers)")
        if console.sign_in == "oidc" and (console.oidc is None or self.approvers.oidc is None):
            raise ValueError("console.sign_in `oidc` needs `console.oidc` (the tenant) and `approvers.oidc` "
                             "(the identity provider whose ID tokens it verifies)")
        if console.sign_in == "oidc" and console.oidc is not None and self.approvers.oidc is not None \
                and not self.approvers.oidc.binds(console.oidc.tenant):
            raise ValueError(f"console.oidc.tenant `{console.oidc.tenant}` is not among approvers.oidc.tenants: "
                             "no ID token could sign anyone in")
        if self.approvers.oidc is not None and console.sign_in != "oidc":
            raise ValueError("with `approvers.oidc`, deciding an approval needs the approver's ID token: "
                             "console.sign_in must be `oidc`")
        return self

    @property
    def keys_dir(self) -> pathlib.Path:
        return self.data_dir / "keys"

    @property
    def audit_key_file(self) -> pathlib.Path:
        return self.data_dir / "audit-key.pem"

    @property
    def retention_key_file(self) -> pathlib.Path:
        """The AES-256 key that seals retained call inputs (`audit.retain_input`)."""
        return self.data_dir / "retention-key"

    @property
    def database_path(self) -> pathlib.Path:
        """One SQLite file for the call ledger, the approvals and the audit trail, so that
        a decision's ledger row and its audit record (or a token's consumption and its
        Verify record) commit in one transaction."""
        return self.data_dir / DATABASE_FILE

    @field_validator("http_listen")
    @classmethod
    def _http_listen_on_loopback(cls, value: str) -> str:
        if value:
            from toolauthz.service.loopback import loopback_host

            try:
                loopback_host(value)
            except ToolAuthzError as exc:
                raise ValueError(str(exc)) from None
        return value

    def key_grace_seconds(self) -> float:
        """A retired key verifies for the longest token lifetime plus leeway."""
        return float(self.tokens.lifetime_seconds + self.tokens.leeway_seconds)
