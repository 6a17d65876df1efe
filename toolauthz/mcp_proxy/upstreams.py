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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError

from toolauthz.display.escape import display

__all__ = ["UpstreamSpec", "UpstreamLink", "UpstreamUnavailable", "UPSTREAM_UNAVAILABLE"]

log = logging.getLogger("toolauthz.mcp_proxy")
UPSTREAM_UNAVAILABLE = "upstream_unavailable"
_LIST_PAGES = 100
_LIST_CHANGED = {"notifications/tools/list_changed", "notifications/resources/list_changed",
                 "notifications/prompts/list_changed"}


class UpstreamUnavailable(Exception):
    """The upstream is not connected right now (it is being reconnected)."""


@dataclass(frozen=True)
class UpstreamSpec:
    """One upstream of the gateway's configuration."""

    name: str  # the configuration's key; tool files name it in `mcp.upstream`
    target: Any  # a URL, StdioServerParameters, or an in-process server
    prefix: str = ""  # the catalog names of its tools start with it (`crm__`)
    mode: str = "auto"  # "auto" (either era) or "legacy" (2025-11-25 only)


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

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        progress_callback: Any = None) -> types.CallToolResult:
        """The upstream's answer; UpstreamUnavailable when the session or connection is
        lost (before or during the call); MCPError for a protocol error of the call."""
        client = self._require()
        try:
            return await client.call_tool(name, arguments, progress_callback=progress_callback)
        except MCPError as exc:
            if not _session_lost(exc):
                raise
            self.lose("session lost")
            raise UpstreamUnavailable(self.spec.name) from exc
        except Exception as exc:  # the transport failed: connection refused, reset, stream closed
            self.lose(type(exc).__name__)
            raise UpstreamUnavailable(self.spec.name) from exc

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
