"""The gateway's upstream MCP servers, each kept connected.

An `UpstreamLink` owns one MCP client of one upstream (stdio, Streamable HTTP, or an
in-process server), in whichever protocol era the upstream speaks (the SDK's `auto`
mode, unless the configuration pins `legacy`). When its session or connection is lost
(the upstream restarted: `Session not found`; the process exited; the connection was
refused or timed out) the link drops the client and connects again in the background,
with exponential backoff. Until it is back, every request to it fails at once with
`UpstreamUnavailable`: nothing waits for an upstream that is down. The proxy re-lists
the upstream's tools (and so re-checks every pin) before each call, so the first call
after a reconnect is checked against the pins of the new session.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError

from toolauthz.display.escape import display

__all__ = ["UpstreamSpec", "UpstreamLink", "UpstreamUnavailable", "UpstreamLost", "UPSTREAM_UNAVAILABLE"]

log = logging.getLogger("toolauthz.mcp_proxy")
UPSTREAM_UNAVAILABLE = "upstream_unavailable"
_LIST_PAGES = 100
_LIST_CHANGED = {"notifications/tools/list_changed", "notifications/resources/list_changed",
                 "notifications/prompts/list_changed"}


class UpstreamUnavailable(Exception):
    """The upstream is not connected right now (it is being reconnected): a request
    that fails so never reached it."""


class UpstreamLost(Exception):
    """The upstream was lost (`lost`) or did not answer in time (`timeout`) after a call
    was sent: the call may have run."""

    def __init__(self, upstream: str, why: str):
        super().__init__(upstream, why)
        self.why = why


@dataclass(frozen=True)
class UpstreamSpec:
    """One upstream of the gateway's configuration."""

    name: str  # the configuration's key; tool files name it in `mcp.upstream`
    target: Any  # a URL, StdioServerParameters, or an in-process server
    prefix: str = ""  # the catalog names of its tools start with it (`crm__`)
    mode: str = "auto"  # "auto" (either era) or "legacy" (2025-11-25 only)
    execution_timeout: float | None = None  # seconds a call may take; None: the gateway's
    tool_timeouts: Mapping[str, float] = field(default_factory=dict)  # by upstream tool name

    def timeout_of(self, upstream_tool: str) -> float | None:
        return self.tool_timeouts.get(upstream_tool, self.execution_timeout)


@dataclass(frozen=True)
class Backoff:
    first: float = 0.2
    most: float = 30.0


class UpstreamLink:
    """`tg.start(link.supervise)` connects it (or gives up for now) and keeps it so."""

    def __init__(self, spec: UpstreamSpec, on_tools_changed: Callable[[], Awaitable[None]] | None = None, *,
                 backoff: Backoff = Backoff(), request_timeout: float = 10.0):
        self.spec = spec
        self.backoff = backoff
        self.request_timeout = request_timeout
        self.sessions = 0  # how many times it connected: a test awaits a reconnect with it
        self._client: Client | None = None
        self._lost = anyio.Event()
        self._on_tools_changed = on_tools_changed
        self._reconnected = anyio.Event()
        self._background: set[asyncio.Future[Any]] = set()
        self._in_flight: set[anyio.CancelScope] = set()  # the calls waiting for an answer
        # More of the SDK Client's options (logging_callback...): mcp_proxy/passthrough.py sets them.
        self.client_options: dict[str, Any] = {}
        # Called with the URI of each `notifications/resources/updated` (mcp_proxy/passthrough.py).
        self.on_resource_updated: Callable[[str], Awaitable[None]] | None = None

    @property
    def client(self) -> Client:
        """The connected client; UpstreamUnavailable while it is being reconnected."""
        return self._require()

    @property
    def connected(self) -> bool:
        return self._client is not None

    async def supervise(self, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        """Connects, waits until the link is lost, and connects again, forever. Reports
        started after the first attempt, whether it connected or not."""
        delay = self.backoff.first
        started = False
        while True:
            self._lost = anyio.Event()
            try:
                async with Client(self.spec.target, mode=self.spec.mode, cache=None,
                                  message_handler=self._on_message, **self.client_options) as client:
                    self._client = client
                    self.sessions += 1
                    self._reconnected.set()
                    self._reconnected = anyio.Event()
                    delay = self.backoff.first
                    log.info("upstream %s connected (session %d)", display(self.spec.name), self.sessions)
                    if not started:
                        started = True
                        task_status.started()
                    await self._lost.wait()
            except Exception as exc:  # logged; the link is retried below
                log.warning("upstream %s is unavailable (%s); retrying in %.1f s", display(self.spec.name),
                            type(exc).__name__, delay, exc_info=True)
            finally:
                self._client = None
            if not started:
                started = True
                task_status.started()
            await anyio.sleep(delay)
            delay = min(delay * 2, self.backoff.most)

    async def wait_reconnected(self) -> None:
        """Returns once the link has connected again (for tests and start-up)."""
        await self._reconnected.wait()

    def lose(self, why: str) -> None:
        """Drops the client: the supervisor closes it and reconnects."""
        if self._client is not None:
            log.warning("upstream %s lost its session or connection (%s); reconnecting", display(self.spec.name),
                        why)
        self._client = None
        self._lost.set()
        for scope in list(self._in_flight):
            scope.cancel()

    def _require(self) -> Client:
        if self._client is None:
            raise UpstreamUnavailable(self.spec.name)
        return self._client

    async def list_tools(self) -> dict[str, types.Tool]:
        """Every tool the upstream advertises, by upstream name (the first of a name wins)."""
        client = self._require()
        tools: dict[str, types.Tool] = {}
        try:
            with anyio.fail_after(self.request_timeout):
                cursor: str | None = None
                for _ in range(_LIST_PAGES):
                    page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                    for tool in page.tools:
                        tools.setdefault(tool.name, tool)
                    cursor = page.next_cursor
                    if cursor is None:
                        break
        except Exception as exc:  # any failure to list: the link is not usable as it is
            self.lose(type(exc).__name__)
            raise UpstreamUnavailable(self.spec.name) from exc
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any], *,
                        timeout: float | None = None, progress_callback: Any = None) -> types.CallToolResult:
        """The upstream's answer, or why there is none:

        - UpstreamUnavailable: the request never reached the upstream (the link was down,
          the connection was refused, or the upstream answered that it does not know the
          session): nothing ran;
        - UpstreamLost: the link was lost or `timeout` passed after the request was handed
          to the transport: it may have run;
        - MCPError: the upstream's protocol error for the call.

        A link lost by any request cancels every call in flight on it at once, so that no
        call waits for an answer that cannot come."""
        client = self._require()
        scope = anyio.CancelScope()
        self._in_flight.add(scope)
        try:
            with scope:
                return await client.call_tool(name, arguments, read_timeout_seconds=timeout,
                                              progress_callback=progress_callback)
            raise UpstreamLost(self.spec.name, "lost")  # reached only when lose() cancelled the scope
        except MCPError as exc:
            if _session_lost(exc):
                self.lose("session lost")
                raise UpstreamUnavailable(self.spec.name) from exc
            if exc.error.code == types.REQUEST_TIMEOUT:
                raise UpstreamLost(self.spec.name, "timeout") from exc
            if exc.error.code != types.CONNECTION_CLOSED:
                raise
            self.lose("connection closed")
            raise UpstreamLost(self.spec.name, "lost") from exc
        except (UpstreamLost, UpstreamUnavailable):
            raise
        except Exception as exc:  # the transport failed: refused before sending, else reset or closed
            self.lose(type(exc).__name__)
            if _never_connected(exc):
                raise UpstreamUnavailable(self.spec.name) from exc
            raise UpstreamLost(self.spec.name, "lost") from exc
        finally:
            self._in_flight.discard(scope)

    async def _on_message(self, message: Any) -> None:
        method = getattr(getattr(message, "root", message), "method", None)
        if method == "notifications/resources/updated" and self.on_resource_updated is not None:
            uri = getattr(getattr(getattr(message, "root", message), "params", None), "uri", None)
            if uri is not None:
                self._later(self.on_resource_updated(str(uri)))
        if method in _LIST_CHANGED and self._on_tools_changed is not None:
            # Not awaited here: the upstream's answer to the re-list arrives through this same receive loop.
            self._later(self._on_tools_changed())

    def _later(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _session_lost(exc: MCPError) -> bool:
    """The MCP spelling of a session the upstream no longer knows (it restarted)."""
    return exc.error.code == types.INVALID_REQUEST and "session" in exc.error.message.lower()


def _never_connected(exc: BaseException) -> bool:
    """A connection that was refused (or whose name did not resolve) carried no request."""
    import httpx2 as httpx

    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return isinstance(exc, (httpx.ConnectError, ConnectionRefusedError))
