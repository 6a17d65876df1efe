"""Settings: one YAML file plus TOOLAUTHZ_* environment overrides, validated at load.

With no file at all, the defaults are the development setup: the example bundle, data in
`.toolauthz/`, and keys generated on first start. A config file must opt in to key
generation explicitly, so a production sidecar refuses to start without its keys.
"""

from __future__ import annotations

import os
import pathlib
import urllib.parse
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from toolauthz.audit.records import DEFAULT_CHAINS, MAX_CHAINS
from toolauthz.batch import DEFAULT_MAX_BYTES, DEFAULT_MAX_CALLS, BatchLimits
from toolauthz.errors import ToolAuthzError
from toolauthz.server.bundle_server_settings import BundleServerSettings
from toolauthz.store.open import parse_store_url


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenSettings(_Strict):
    issuer: str = "toolauthz"
    audience: str = "toolauthz-runtime"
    lifetime_seconds: int = Field(60, ge=1, le=600)
    leeway_seconds: int = Field(5, ge=0, le=5)
    # How long after a decision (or an approval) a replayed call may get a fresh token.
    reissue_window_seconds: float = Field(300.0, ge=0, le=3600)


class AuditSettings(_Strict):
    checkpoint_interval_seconds: float = Field(60.0, gt=0)


class ApprovalSettings(_Strict):
    ttl_seconds: float = Field(900.0, gt=0, le=7 * 24 * 3600)
    # Open WatchApproval streams, per caller identity and in the whole process; one over
    # either limit is RESOURCE_EXHAUSTED. Every unauthenticated caller counts as one.
    # A watch takes one of the `max_concurrent_rpcs` places while open, so `max_watches`
    # must leave some of those to the other calls.
    max_watches_per_caller: int = Field(64, ge=1)
    max_watches: int = Field(128, ge=1)


class BatchSettings(_Strict):
    # AuthorizeBatch: the most calls in one batch, and the most bytes their arguments and
    # entities may hold together; beyond either, the batch is INVALID_ARGUMENT. At most 256,
    # the most plans the decision pump runs together: a batch always commits in one transaction.
    max_calls: int = Field(DEFAULT_MAX_CALLS, ge=1, le=256)
    max_bytes: int = Field(DEFAULT_MAX_BYTES, ge=1024)

    def limits(self) -> BatchLimits:
        return BatchLimits(self.max_calls, self.max_bytes)


Service = Literal["authorizer", "approvals", "audit"]
SERVICES: tuple[Service, ...] = ("authorizer", "approvals", "audit")


class TlsSettings(_Strict):
    cert: pathlib.Path
    key: pathlib.Path
    # With a CA: clients must present a certificate it signed (mTLS); the caller's
    # identity is then the certificate's URI SAN, or else `cn:` and its subject CN.
    client_ca: pathlib.Path | None = None


class ListenerSettings(_Strict):
    """One address the sidecar serves: `HOST:PORT` or `unix:///path`."""

    address: str
    services: tuple[Service, ...] = SERVICES
    tls: TlsSettings | None = None
    # A TCP listener off loopback without TLS refuses to start unless this says so.
    insecure: bool = False
    # Unix sockets: the file's mode, and the caller identity of whoever connects.
    mode: int = Field(0o660, ge=0, le=0o777)
    identity: str = ""


class TracingSettings(_Strict):
    # `otlp` exports spans over OTLP/gRPC (opentelemetry-exporter-otlp-proto-grpc; its
    # OTEL_EXPORTER_OTLP_* variables apply); `none` records no spans.
    exporter: Literal["none", "otlp"] = "none"
    endpoint: str = ""  # empty: the exporter's default (or OTEL_EXPORTER_OTLP_ENDPOINT)


class DecisionLogSettings(_Strict):
    """One INFO line per Authorize decision (toolauthz/telemetry/decision_log.py)."""

    enabled: bool = False
    # Tool name -> the top-level argument names whose values a line may hold; none else.
    arguments: dict[str, tuple[str, ...]] = {}


Role = Literal["runtime", "approver", "auditor"]
_TENANT = r"^(\*|[A-Za-z0-9][A-Za-z0-9._-]{0,127})$"


class CallerSettings(_Strict):
    """A caller identity (as its listener proves it) and what it may do: its roles, in
    its tenants ("*": every tenant). See README "Callers and roles"."""

    id: str = Field(min_length=1, max_length=1024)
    roles: tuple[Role, ...] = Field(min_length=1)
    tenants: tuple[Annotated[str, Field(pattern=_TENANT)], ...] = Field(min_length=1)


class OidcApproverSettings(_Strict):
    """The identity provider whose ID tokens prove who decides an approval, and the
    tenants it is trusted for (README "Callers and roles")."""

    issuer: str = Field(min_length=1)
    audience: str = Field(min_length=1)
    # The tenants whose approvers it proves; `*` (any tenant) only with a tenant claim.
    tenants: tuple[Annotated[str, Field(pattern=_TENANT)], ...] = Field(min_length=1)
    tenant_claim: str = ""  # when set, the ID token's claim must name the approval's tenant
    # Its keys: exactly one of a file, a URL, or OpenID discovery from the issuer.
    jwks_file: pathlib.Path | None = None
    jwks_uri: str = ""
    discovery: bool = False
    ca_file: pathlib.Path | None = None  # the CA that alone is trusted for fetching keys (default: the system's)
    refresh_interval_seconds: int = Field(60, ge=1, le=3600)
    max_key_age_seconds: int = Field(3600, ge=60, le=7 * 24 * 3600)
    fetch_timeout_seconds: float = Field(5.0, gt=0, le=60)
    max_jwks_bytes: int = Field(256 * 1024, ge=1024, le=4 * 1024 * 1024)
    principal_claim: str = Field("sub", min_length=1)
    groups_claim: str = Field("groups", min_length=1)
    principal_type: str = Field("User", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    algorithms: tuple[Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512",
                              "EdDSA"], ...] = Field(("RS256", "ES256", "EdDSA"), min_length=1)
    leeway_seconds: int = Field(30, ge=0, le=60)
    max_lifetime_seconds: int = Field(3600, ge=60, le=7 * 24 * 3600)  # the largest `exp - iat` accepted

    @model_validator(mode="after")
    def _one_key_source(self) -> OidcApproverSettings:
        given = [bool(self.jwks_file), bool(self.jwks_uri), self.discovery]
        if sum(given) != 1:
            raise ValueError("approvers.oidc needs exactly one of `jwks_file`, `jwks_uri` and `discovery: true`")
        for name, url in (("jwks_uri", self.jwks_uri), ("issuer", self.issuer if self.discovery else "")):
            if url and not url.startswith("https://"):
                raise ValueError(f"approvers.oidc.{name} must be an https:// URL: keys are fetched over HTTPS only")
        if self.refresh_interval_seconds > self.max_key_age_seconds:
            raise ValueError("approvers.oidc.refresh_interval_seconds must not exceed max_key_age_seconds")
        if "*" in self.tenants and not self.tenant_claim:
            raise ValueError("approvers.oidc.tenants `*` (every tenant) needs a `tenant_claim` naming the "
                             "person's tenant in each ID token")
        return self

    def binds(self, tenant: str) -> bool:
        return tenant in self.tenants or "*" in self.tenants


class ApproverSettings(_Strict):
    oidc: OidcApproverSettings | None = None


_HEADER = r"^[A-Za-z0-9-]{1,64}$"


class ConsoleProxySettings(_Strict):
    """Sign-in by a reverse proxy's headers, believed only from `trusted` addresses."""

    trusted: tuple[str, ...] = Field(min_length=1)  # CIDRs of the proxies, e.g. 10.0.0.5/32
    user_header: str = Field("X-Forwarded-User", pattern=_HEADER)
    groups_header: str = Field("X-Forwarded-Groups", pattern=_HEADER)  # comma-separated
    tenant_header: str = Field("X-Forwarded-Tenant", pattern=_HEADER)
    principal_type: str = Field("User", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # The tenant of everyone this proxy signs in (one console per tenant), for a proxy that
    # cannot send a tenant header (oauth2-proxy's flags): the header is then not read.
    tenant: str = Field("", pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]{0,127})?$")

    @field_validator("trusted")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        import ipaddress

        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"`{cidr}` is not an address or CIDR") from None
        return value


class ConsoleOidcSettings(_Strict):
    """Sign-in with an ID token of `approvers.oidc`'s identity provider; the token proves
    the person and their groups, the console's configuration their tenant."""

    tenant: str = Field(pattern=_TENANT.replace(r"\*|", ""))


class ConsoleSettings(_Strict):
    """The browser console (toolauthz/console/, docs/console.md), served on `console_listen`."""

    sign_in: Literal["dev", "proxy", "oidc"] = "dev"
    proxy: ConsoleProxySettings | None = None
    oidc: ConsoleOidcSettings | None = None
    # Members of any of these groups may use the audit explorer and the policy status.
    auditor_groups: tuple[str, ...] = ("auditors",)
    session_seconds: int = Field(8 * 3600, ge=60, le=7 * 24 * 3600)


class NotificationSinkSettings(_Strict):
    """One place approval events go (toolauthz/notify/sinks.py)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")
    kind: Literal["webhook", "slack"]
    url: str = Field(min_length=1, max_length=2048)
    # webhook: the Standard Webhooks secret (`whsec_<base64>`), in a file only its owner reads
    secret_file: pathlib.Path | None = None
    ca_file: pathlib.Path | None = None  # trust for the sink's TLS, when not the system's
    timeout_seconds: float = Field(5.0, gt=0, le=60)

    @model_validator(mode="after")
    def _webhook_needs_a_secret(self) -> NotificationSinkSettings:
        if self.kind == "webhook" and self.secret_file is None:
            raise ValueError(f"sink `{self.name}`: a webhook sink needs `secret_file`")
        return self


class NotificationSettings(_Strict):
    """Approval events (created, expiring, decided) sent to `sinks`, off the decision path."""

    sinks: tuple[NotificationSinkSettings, ...] = Field(min_length=1)
    # The console's public address, for the deep link to an approval; empty: no link.
    console_url: str = ""
    expiry_warning_seconds: float = Field(120.0, ge=0)
    poll_seconds: float = Field(1.0, gt=0, le=60)
    max_attempts: int = Field(8, ge=1, le=100)
    keep_dead: int = Field(100, ge=1, le=100_000)


class BundleKeySettings(_Strict):
    """One public key a bundle's signature may name: its key id and an Ed25519 PEM file."""

    kid: str = Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$")
    file: pathlib.Path


class BundleVerificationSettings(_Strict):
    """Bundles load only when signed (`toolauthz bundle sign`) with one of these keys;
    several for a rotation."""

    keys: tuple[BundleKeySettings, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_entry_per_kid(self) -> BundleVerificationSettings:
        if len({key.kid for key in self.keys}) != len(self.keys):
            raise ValueError("each key id may be listed once in `bundle_verification.keys`")
        return self

    def public_keys(self) -> dict[str, Any]:
        """kid -> Ed25519 public key, read now (SignatureError when a file is unusable)."""
        from toolauthz.bundle.signature import load_public_key_file

        return {key.kid: load_public_key_file(key.file) for key in self.keys}


DATABASE_FILE = "toolauthz.db"


class Settings(_Strict):
    bundle: pathlib.Path = pathlib.Path("policies")
    # Verify every bundle against its signature before it loads (at start and each reload).
    bundle_verification: BundleVerificationSettings | None = None
    # Poll a bundle server for the bundle archive instead of reading `bundle` (a directory).
    bundle_server: BundleServerSettings | None = None
    listen: str = "127.0.0.1:50051"
    # Serve the Approvals service on its own address instead of `listen` (empty: same server).
    approvals_listen: str = ""
    # Addresses with their services and TLS; empty: `listen` (and `approvals_listen`).
    listeners: tuple[ListenerSettings, ...] = ()
    # The HTTP/JSON API (toolauthz/service/http_api.py) on one plaintext loopback address,
    # e.g. 127.0.0.1:8080; empty: off. Its callers are unauthenticated.
    http_listen: str = ""
    # The HTTP/JSON API's addresses with TLS (mTLS authenticates callers) or as Unix
    # sockets with an identity, checked as `listeners` are; replaces `http_listen`.
    http_listeners: tuple[ListenerSettings, ...] = ()
    # The browser console for approvers and auditors (toolauthz/console/), HOST:PORT; empty: off.
    console_listen: str = ""
    console: ConsoleSettings = ConsoleSettings()
    data_dir: pathlib.Path = pathlib.Path(".toolauthz")
    # Development convenience: create the token and audit keys under data_dir if absent.
    generate_missing_keys: bool = True
    # Seconds between looks at the bundle directory for changes; 0 = reload on SIGHUP only.
    reload_poll_seconds: float = Field(1.0, ge=0)
    max_concurrent_rpcs: int = Field(256, ge=1)
    # A call that would wait longer than this for its decision is refused at once
    # (RESOURCE_EXHAUSTED, no token): the queue is bounded by time (server/pump.py). 0: no bound.
    max_queue_seconds: float = Field(0.5, ge=0, le=60)
    # Calls one client connection may have open at once (HTTP/2 MAX_CONCURRENT_STREAMS),
    # enforced by gRPC's transport before the interpreter sees a call: a client waits to
    # send more, and what it sent over the limit is refused unprocessed (UNAVAILABLE,
    # safe to retry). 0: gRPC's default, no limit. docs/performance.md, "Overload".
    max_streams_per_connection: int = Field(0, ge=0, le=65536)
    max_message_bytes: int = Field(4 << 20, ge=1024)
    tokens: TokenSettings = TokenSettings()
    audit: AuditSettings = AuditSettings()
    approvals: ApprovalSettings = ApprovalSettings()
    batch: BatchSettings = BatchSettings()
    notifications: NotificationSettings | None = None
    # HOST:PORT serving Prometheus text at /metrics (summed over the workers); empty: off.
    metrics_listen: str = ""
    tracing: TracingSettings = TracingSettings()
    # `json`: one JSON object per log line (toolauthz/server/logs.py).
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    decision_log: DecisionLogSettings = DecisionLogSettings()
    # On SIGTERM: calls in flight get this long to finish before they are cancelled.
    drain_grace_seconds: float = Field(10.0, ge=0, le=3600)
    # Who may call which RPC, for which tenants; empty: roles are not enforced.
    callers: tuple[CallerSettings, ...] = ()
    approvers: ApproverSettings = ApproverSettings()

    # Where the ledger, the approvals and the audit trail live: `sqlite:///path` or
    # `postgresql://...` (shared by a fleet); empty: `sqlite:///<data_dir>/toolauthz.db`.
    store: str = ""
    store_pool_size: int = Field(8, ge=1, le=256)  # PostgreSQL connections per process
    # Serving upgrades an older PostgreSQL schema first (else it refuses to start).
    store_migrate: bool = False
    # PostgreSQL: seconds a database operation, a wait for a connection or a health probe
    # may take before it is cut: the call is answered UNAVAILABLE and health turns
    # NOT_SERVING until the database answers again (TCP keepalives, the TCP user timeout
    # and the server's statement_timeout follow it too).
    store_hang_seconds: float = Field(5.0, gt=0, le=300)
    # The audit chains new records are spread over (by tenant and call id): writers of
    # different chains never wait for each other (docs/performance.md, the fleet).
    audit_chains: int = Field(DEFAULT_CHAINS, ge=1, le=MAX_CHAINS)

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
        if self.approvals.max_watches >= self.max_concurrent_rpcs:
            raise ValueError(f"approvals.max_watches ({self.approvals.max_watches}) must be below "
                             f"max_concurrent_rpcs ({self.max_concurrent_rpcs}): open watches take places of "
                             "max_concurrent_rpcs, and Authorize needs some")
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


_ENV = {"TOOLAUTHZ_LOG_LEVEL": "log_level",
        "TOOLAUTHZ_BUNDLE": "bundle", "TOOLAUTHZ_LISTEN": "listen", "TOOLAUTHZ_DATA_DIR": "data_dir",
        "TOOLAUTHZ_HTTP_LISTEN": "http_listen", "TOOLAUTHZ_CONSOLE_LISTEN": "console_listen",
        "TOOLAUTHZ_STORE": "store"}


def load_settings(config_file: str | os.PathLike | None = None, **overrides: Any) -> Settings:
    data: dict[str, Any] = {}
    if config_file is not None:
        try:
            loaded = yaml.safe_load(pathlib.Path(config_file).read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ToolAuthzError(f"cannot read config `{config_file}`: {exc}") from None
        if not isinstance(loaded, dict):
            raise ToolAuthzError(f"config `{config_file}` must hold a mapping")
        data = {"generate_missing_keys": False, **loaded}
    for env, key in _ENV.items():
        if os.environ.get(env):
            data[key] = os.environ[env]
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings(**data)
    except ValidationError as exc:
        problems = "; ".join(f"`{'.'.join(map(str, e['loc']))}`: {e['msg'].lower()}" if e["loc"] else
                             e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise ToolAuthzError(f"invalid config: {problems}") from None
