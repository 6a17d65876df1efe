"""The MCP proxy: one downstream MCP server in front of the upstream MCP servers.

Identity never comes from the MCP client: the tenant and principal are the proxy's
configuration. Runs and call ids (the sidecar's `request_id`, replay, approval
resumption) in both protocol eras are defined in toolauthz.mcp_proxy.runs.

Each `tools/call`: re-list the upstream tools (drift check) → Authorize → (approval
wait, with MCP progress notifications) → Verify → the upstream `tools/call` → output
checked against the catalog's `output_schema` → ReportOutcome; the AsyncGuard does all
but the drift check, with the upstream call as the tool's implementation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import warnings
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast

import anyio
import mcp_types as types
from mcp.server import NotificationOptions, Server
from mcp.server.auth.settings import AuthSettings
from mcp.server.models import InitializationOptions
from mcp.shared.exceptions import MCPError
from ulid import ULID

from toolauthz import __version__
from toolauthz.client import AsyncAuthzClient, AsyncGuard, GuardEvent, Principal, ToolSet, TrustedContext
from toolauthz.client.results import APPROVAL_PENDING, COMPLETED, CallResult
from toolauthz.clock import Clock, SystemClock
from toolauthz.display.escape import display
from toolauthz.errors import RequestError
from toolauthz.mcp_proxy.auth import AccessTokenVerifier, ResourceServer, caller_of
from toolauthz.mcp_proxy.catalog import Catalog, Drift, sidecar_catalog
from toolauthz.mcp_proxy.client_requests import ClientRequests
from toolauthz.mcp_proxy.governed import Governed
from toolauthz.mcp_proxy.governed_requests import GovernedRequests
from toolauthz.mcp_proxy.hosts import transport_security
from toolauthz.mcp_proxy.list_watch import ListWatch
from toolauthz.mcp_proxy.passthrough import LogRelay, annotations_of, instructions_of, relaying_progress
from toolauthz.mcp_proxy.pins import PinnedTool
from toolauthz.mcp_proxy.refusal_tally import RefusalTally, Report
from toolauthz.mcp_proxy.runs import (
    RUN_META_KEY,
    BoundedMap,
    Caller,
    Run,
    call_id,
    is_modern,
    run_of,
    session_header,
)
from toolauthz.mcp_proxy.upstreams import UPSTREAM_UNAVAILABLE, UpstreamSpec

__all__ = ["ProxySettings", "McpProxy", "TOOL_CHANGED"]

log = logging.getLogger("toolauthz.mcp_proxy")
TOOL_CHANGED = "tool_changed"
STATUS_META_KEY = "io.toolauthz/status"  # a result's CallResult.status, when not completed
CODE_META_KEY = "io.toolauthz/code"
APPROVAL_META_KEY = "io.toolauthz/approval_id"
REFUSAL_FLUSH_SECONDS = 5.0  # how often the counts of ended minutes are written (refusal_tally.py)
_MAX_RUNS = 4096  # Guards (and pending approvals) kept for replay answers; the sidecar's single use covers the rest


class _GatewayServer(Server[Any]):
    """The SDK's Server announcing `listChanged` for tools, resources and prompts on the
    2025-11-25 handshake (both transports ask it for their initialization options)."""

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      *args: Any, **kwargs: Any) -> InitializationOptions:
        changes = notification_options or NotificationOptions(prompts_changed=True, resources_changed=True,
                                                               tools_changed=True)
        return super().create_initialization_options(changes, *args, **kwargs)


@dataclass(frozen=True)
class ProxySettings:
    # Not read for the catalog: the pins come from the sidecar (catalog.py sidecar_catalog).
    bundle: pathlib.Path
    tenant: str | None  # the configured identity: stdio, and HTTP without `oauth`
    principal: Principal | None
    approval_wait_seconds: float = 0.0  # 0: answer at once with an isError result naming the approval
    execution_timeout: float = 30.0
    rpc_timeout: float | None = 10.0
    downstream: str = "stdio"  # "stdio" or "http": where the session id comes from
    oauth: ResourceServer | None = None  # HTTP: every caller proves who they are with a bearer token
    allowed_hosts: tuple[str, ...] = ()  # HTTP: Host names answered besides the listen address (hosts.py)
    list_watch_seconds: float = 5.0  # how often the bundle is checked for changed lists (0: never; list_watch.py)

    def configured_caller(self) -> Caller | None:
        if self.downstream == "http" and self.oauth is not None:
            return None
        if not self.tenant or self.principal is None:
            raise RequestError("the proxy needs --tenant and --principal (every call acts for them), "
                               "or `oauth` to take them from each caller's bearer token (HTTP)")
        TrustedContext(self.tenant, self.principal, "check")  # fails fast on a bad identity
        return Caller(self.tenant, self.principal)


@dataclass
class _Call:
    """A tools/call in flight whose client asked for progress notifications."""

    ctx: Any
    token: str | int


class McpProxy:
    """`async with proxy.connected(upstream):` then serve `proxy.server`."""

    def __init__(self, settings: ProxySettings, authz: AsyncAuthzClient, *, clock: Clock | None = None):
        self._configured = settings.configured_caller()
        self.settings = settings
        self.authz = authz
        self.connection_id = str(ULID())  # the stdio connection's session
        self.governed = Governed(self, settings.rpc_timeout or 10.0)
        self.logs = LogRelay(forward=settings.downstream == "stdio")
        self.client_requests = ClientRequests()
        # The 2025-11-25 HTTP sessions that sent a request, by Mcp-Session-Id: told when lists change.
        self._http_sessions: BoundedMap[str, Any] = BoundedMap(_MAX_RUNS)
        self.list_watch = ListWatch(authz, self._sessions_to_tell, rpc_timeout=settings.rpc_timeout)
        self.requests = GovernedRequests(self, self.governed)
        with warnings.catch_warnings():  # logging/setLevel: deprecated as of 2026-07-28, served for 2025-11-25
            warnings.simplefilter("ignore")
            self.server: Server[Any] = _GatewayServer(
                "toolauthz-mcp-proxy", version=__version__, on_list_tools=self._list_tools,
                on_call_tool=self._call_tool, on_set_logging_level=self.requests.set_level,
                **self.requests.handlers())
        self.observers: list[Callable[[GuardEvent], None]] = []
        self.catalog: Catalog
        self._tools = ToolSet()
        self._guards: BoundedMap[tuple[str, str, str], AsyncGuard] = BoundedMap(_MAX_RUNS)
        self._progress: dict[str, _Call] = {}
        # (run, tool, arguments) -> the call id whose approval is pending: the same call resumes it
        self._pending_approvals: BoundedMap[tuple[tuple[str, str, str], str, str], str] = BoundedMap(_MAX_RUNS)
        self._background: set[asyncio.Task[Any]] = set()
        self._unavailable = RefusalTally(clock or SystemClock())  # upstream_unavailable, audited in aggregate

    # -- the upstreams ----------------------------------------------------------------

    @asynccontextmanager
    async def connected(self, *upstreams: Any) -> AsyncIterator[McpProxy]:
        """Keeps the upstreams connected: UpstreamSpecs, or one target (a URL,
        StdioServerParameters, or an in-process server) without a prefix."""
        specs = [u if isinstance(u, UpstreamSpec) else UpstreamSpec("default", u) for u in upstreams]
        self.catalog = Catalog(sidecar_catalog(self.authz), specs, self._use_tools,
                               request_timeout=self.settings.rpc_timeout or 10.0)
        for name, link in self.catalog.links.items():
            link.client_options["logging_callback"] = self.logs.callback_for(name)
            link.client_options.update(self.client_requests.callbacks_for(name))
            link.on_resource_updated = self.logs.resource_updated
        self.catalog.on_lists_changed = self.list_watch.announce
        async with self.catalog.connected(), anyio.create_task_group() as tg:
            tg.start_soon(self._flush_refusals)
            self.server.instructions = instructions_of(self.catalog.links)
            if self.settings.list_watch_seconds > 0:  # its first check is at once, off the start-up path
                tg.start_soon(self.list_watch.run, self.settings.list_watch_seconds)
            try:
                yield self
            finally:
                tg.cancel_scope.cancel()
                # The counts not yet written, within one RPC timeout in all: a sidecar that is
                # gone must not hold the gateway's shutdown.
                with anyio.CancelScope(shield=True):
                    with anyio.move_on_after(self.settings.rpc_timeout or 10.0) as bounded:
                        await self._report_refusals(self._unavailable.flush())
                    if bounded.cancelled_caught:
                        log.warning("the last upstream_unavailable counts were not recorded: the sidecar did not "
                                    "take them in time")

    def _use_tools(self, tools: ToolSet) -> None:
        self._tools = tools
        for guard in self._guards.values():
            guard.tools = tools

    async def refresh(self) -> dict[str, types.Tool]:
        return await self.catalog.refresh()

    # The catalog's resources and prompts (governed.py) share the tools' pins, links and drift.
    @property
    def pins(self) -> Any:
        return self.catalog.pins

    @property
    def links(self) -> Any:
        return self.catalog.links

    def upstream_of(self, name: str) -> Any:
        return self.catalog.upstream_of(name)

    def note_session(self, ctx: Any) -> None:
        """Remembers the stdio client's session (where upstream log messages go) and each
        2025-11-25 HTTP session (told when the lists change)."""
        session = getattr(ctx, "session", None)
        if self.settings.downstream == "stdio":
            self.logs.session = session
            return
        header = session_header(ctx)
        if header is not None and session is not None and not is_modern(ctx):
            self._http_sessions.set(header, session)

    def _sessions_to_tell(self) -> list[Any]:
        stdio = [self.logs.session] if self.logs.session is not None else []
        return stdio + self._http_sessions.values()

    def run_of(self, ctx: Any) -> Run:
        self.note_session(ctx)
        return run_of(ctx, self._caller(ctx), self.connection_id if self.settings.downstream == "stdio" else None)

    async def visible(self, ctx: Any, names: Iterable[str]) -> list[str]:
        """The names, among `names` (sorted), that some call by the request's caller could
        be allowed: the sidecar decides with its bundle (ListVisible). Fail closed: when it
        cannot answer, the list is an error, never everything."""
        run = self.run_of(ctx)
        context = TrustedContext(run.caller.tenant, run.caller.principal, run.request_id)
        try:
            answer = await self.authz.list_visible(context, sorted(names), timeout=self.settings.rpc_timeout)
        except Exception as exc:  # logged; nothing is listed without the sidecar's answer
            log.warning("the sidecar could not say which tools %s may see (%s)", display(str(run.caller.principal)),
                        type(exc).__name__, exc_info=True)
            raise MCPError(types.INTERNAL_ERROR, "the list is unavailable right now; try again later") from None
        return list(answer.visible)

    async def guarded(self, ctx: Any, run: Run, name: str, input_json: str) -> CallResult:
        """One catalog entry (a tool call, a resource read, a prompt get) through the run's
        Guard, with progress for the client; the same entry and input in the same run
        resumes a pending approval."""
        pending_key = (run.key, name, input_json)
        pending = self._pending_approvals.get(pending_key)
        this_call = pending if pending is not None else call_id(run, ctx.request_id)
        guard = self._guards.setdefault_with(run.key, lambda: self._new_guard(run))
        token = (ctx.meta or {}).get("progress_token")
        if token is not None:
            self._progress[this_call] = _Call(ctx, token)
        try:
            with relaying_progress(ctx, token), self.client_requests.calling(self._upstream_name(name), ctx):
                result = await self._run_guarded(guard, this_call, name, input_json)
        finally:
            self._progress.pop(this_call, None)
        if result.status == APPROVAL_PENDING:
            self._pending_approvals.set(pending_key, result.call_id)
        else:
            self._pending_approvals.pop(pending_key)
        return result

    def _upstream_name(self, name: str) -> str | None:
        link = self.catalog.upstream_of(name)
        return link.spec.name if link is not None else None

    # -- the downstream ----------------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        self.note_session(ctx)
        exposed = await self.refresh()
        return types.ListToolsResult(tools=[self._advertised(self.catalog.pins[name], exposed[name])
                                            for name in await self.visible(ctx, exposed)])

    @staticmethod
    def _advertised(pinned: PinnedTool, upstream: types.Tool | None = None) -> types.Tool:
        return types.Tool(name=pinned.name, description=pinned.description, input_schema=dict(pinned.input_schema),
                          output_schema=dict(pinned.output_schema) if pinned.output_schema is not None else None,
                          annotations=annotations_of(pinned, upstream))

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        run = self.run_of(ctx)
        result = await self._call_in_run(ctx, run, params)
        result.meta = {**(result.meta or {}), RUN_META_KEY: run.name}
        return result

    async def _call_in_run(self, ctx: Any, run: Run, params: types.CallToolRequestParams) -> types.CallToolResult:
        exposed = await self.refresh()
        name = params.name
        broken = self.catalog.drifted.get(name)
        if broken is not None and name in self.catalog.pins:
            log.warning("tool_changed: refused a call of %s in run %s", display(name), run.name)
            await self.audit_refusal(run, call_id(run, ctx.request_id), name, broken)
            return _error(f"The tool `{name}` changed on its server since it was reviewed; calls to it are "
                          "refused until its catalog entry is updated. The call was not executed.")
        if name not in exposed:
            upstream = self.catalog.upstream_of(name)
            if upstream is not None and not upstream.connected:
                await self._audit_unavailable(run, call_id(run, ctx.request_id), name)
                return _error(f"The tool's server is unavailable right now ({UPSTREAM_UNAVAILABLE}); the call was "
                              "not executed. Try again later.")
            return _error("The tool is not available here; the call was not executed.")
        try:
            input_json = json.dumps(params.arguments or {}, ensure_ascii=False, separators=(",", ":"),
                                    allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            return _error("The arguments are not valid JSON; the call was not executed.")
        result = await self.guarded(ctx, run, name, input_json)
        return self._to_mcp(result, self.catalog.pins[name], self.catalog.answered.pop(result.call_id))

    def _caller(self, ctx: Any) -> Caller:
        """Who the request acts for: the configured identity, or the one the request's
        verified bearer token proved (fail closed: no caller, no call)."""
        if self._configured is not None:
            return self._configured
        caller = caller_of(ctx)
        if caller is None:
            raise MCPError(types.INVALID_REQUEST, "The request is not authenticated.")
        return caller

    def http_app(self, host: str) -> Any:
        """The Streamable HTTP app (both protocol eras) at `/mcp`, behind the OAuth resource
        server when `oauth` is configured; Host checked on every address (hosts.py)."""
        oauth = self.settings.oauth
        security = transport_security(host, self.settings.allowed_hosts, oauth.resource if oauth else None)
        if oauth is None:
            return self.server.streamable_http_app(host=host, transport_security=security)
        # Validated by AuthSettings itself, which keeps a path-less issuer without a trailing slash
        # (RFC 8414 compares issuers as strings). The verifier checks the audience itself.
        auth = AuthSettings.model_validate({"issuer_url": oauth.issuer, "resource_server_url": oauth.resource,
                                            "required_scopes": list(oauth.scopes_supported) or None,
                                            "validate_token_resource": False})
        return self.server.streamable_http_app(host=host, auth=auth, token_verifier=AccessTokenVerifier(oauth),
                                               transport_security=security)

    async def audit_refusal(self, run: Run, refused_call: str, name: str, broken: Drift) -> None:
        """Records the refusal in the sidecar's audit trail. The refusal stands whether or
        not that succeeds (fail closed); a failure is logged."""
        context = TrustedContext(run.caller.tenant, run.caller.principal, run.request_id)
        try:
            await self.authz.report_refusal(context, refused_call, name, TOOL_CHANGED, broken.detail(),
                                            timeout=self.settings.rpc_timeout)
        except Exception:  # logged; the call is refused either way
            log.exception("could not record the tool_changed refusal of %s in the sidecar's audit trail",
                          display(name))

    async def _audit_unavailable(self, run: Run, refused_call: str, name: str) -> None:
        """Counts an `upstream_unavailable` refusal; the sidecar records it in aggregate
        (refusal_tally.py). The refusal stands whatever the report does."""
        await self._report_refusals(self._unavailable.count(run.caller.tag, name, UPSTREAM_UNAVAILABLE,
                                                            (run, refused_call)))

    async def _flush_refusals(self) -> None:
        while True:
            await anyio.sleep(REFUSAL_FLUSH_SECONDS)
            await self._report_refusals(self._unavailable.due())

    async def _report_refusals(self, reports: list[Report]) -> None:
        for report in reports:
            run, refused_call = cast(tuple[Run, str], report.what)  # what _audit_unavailable counted
            context = TrustedContext(run.caller.tenant, run.caller.principal, run.request_id)
            try:
                await self.authz.report_refusal(context, refused_call, report.tool, report.code, report.detail(),
                                                timeout=self.settings.rpc_timeout)
            except Exception:  # logged; the calls were refused either way
                log.exception("could not record %d %s refusal(s) of %s in the sidecar's audit trail",
                              report.count, report.code, display(report.tool))

    async def _run_guarded(self, guard: AsyncGuard, call_id: str, name: str, input_json: str) -> CallResult:
        """The Guard runs in its own task: when the MCP client cancels the request, the
        task is cancelled once and the outcome (cancelled or outcome_unknown) is reported
        before this handler gives up."""
        task = asyncio.ensure_future(guard.run(call_id, name, input_json,
                                               approval_wait=self.settings.approval_wait_seconds))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait([task])
            raise

    def _new_guard(self, run: Run) -> AsyncGuard:
        context = TrustedContext(run.caller.tenant, run.caller.principal, run.request_id)
        return AsyncGuard(self.authz, context, self._tools, execution_timeout=self.settings.execution_timeout,
                          rpc_timeout=self.settings.rpc_timeout, observer=self._observe)

    def _observe(self, event: GuardEvent) -> None:
        for observer in self.observers:
            observer(event)
        call = self._progress.get(event.call_id)
        if call is None or event.kind not in ("approval_wait", "approval"):
            return
        message = ("waiting for a person to approve the call" if event.kind == "approval_wait"
                   else f"approval {str(event.data.get('status', '')).lower()}")
        task = asyncio.ensure_future(self._send_progress(call, message))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @staticmethod
    async def _send_progress(call: _Call, message: str) -> None:
        try:
            await call.ctx.session.send_progress_notification(call.token, 0, message=message,
                                                              related_request_id=call.ctx.request_id)
        except Exception:  # logged; progress is a courtesy, the call goes on without it
            log.debug("could not send a progress notification", exc_info=True)

    @staticmethod
    def _to_mcp(result: CallResult, pinned: PinnedTool,
                upstream_content: list[types.ContentBlock] | None = None) -> types.CallToolResult:
        """A completed call is the tool's output; anything else (a pending approval too) is
        `isError: true` with the Guard's model-safe text, and `_meta` says which it is:
        the same shape as CallResult.to_tool_result. A structured result keeps the
        upstream's own content blocks (its text as sent), when this call fetched them."""
        if result.status != COMPLETED:
            meta = {STATUS_META_KEY: result.status, CODE_META_KEY: result.code}
            if result.approval_id:
                meta[APPROVAL_META_KEY] = result.approval_id
            return types.CallToolResult(content=[types.TextContent(text=result.content)], is_error=True, meta=meta)
        if pinned.output_schema is not None:
            content = upstream_content or [types.TextContent(text=json.dumps(result.output, ensure_ascii=False))]
            return types.CallToolResult(content=content, structured_content=result.output)
        return types.CallToolResult.model_validate({"content": result.output})


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)

