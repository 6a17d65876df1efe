"""What the gateway exposes: the bundle's pinned tools, each bound to one upstream, and
whether that upstream still advertises it as pinned.

A tool file belongs to the upstream named by its `mcp.upstream` (optional when the
gateway has one upstream), and its catalog name must start with that upstream's prefix
(`crm__lookup_customer`): tools of different upstreams cannot collide and a policy sees
which server a tool is on. A tool file that names no configured upstream, or lacks the
prefix, is never exposed (and logged). `tools/list` is the union over the upstreams;
an upstream that is down or whose tool drifted hides only its own tools.
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types

from toolauthz.client import ToolError, ToolSet
from toolauthz.display.escape import display
from toolauthz.mcp_proxy.governed import implementation_of
from toolauthz.mcp_proxy.passthrough import progress_relay
from toolauthz.mcp_proxy.pins import PinnedTool, advertised_sha256, catalog_signature, drift, load_pins
from toolauthz.mcp_proxy.upstreams import UPSTREAM_UNAVAILABLE, UpstreamLink, UpstreamSpec, UpstreamUnavailable

__all__ = ["Catalog", "Drift"]

log = logging.getLogger("toolauthz.mcp_proxy")


@dataclass(frozen=True)
class Drift:
    """A catalogued tool whose upstream advertisement broke its pin: `pin` is the pin it
    broke, `changed` what differs, `advertised` the digest of what the upstream showed."""

    pin: str
    changed: str
    advertised: str

    def detail(self) -> str:
        """For the sidecar's audit record: digests and a field name, never upstream text."""
        return f"changed={self.changed} pinned={self.pin} advertised={self.advertised or '-'}"


class Catalog:
    def __init__(self, bundle: pathlib.Path, upstreams: Sequence[UpstreamSpec],
                 on_tools: Callable[[ToolSet], None], *, request_timeout: float = 10.0):
        names = [spec.name for spec in upstreams]
        if not names or len(set(names)) != len(names):
            raise ValueError("the gateway needs one or more upstreams with distinct names")
        self.bundle = bundle
        self.links = {spec.name: UpstreamLink(spec, self._refresh_logged, request_timeout=request_timeout)
                      for spec in upstreams}
        self.pins: dict[str, PinnedTool] = {}
        self.drifted: dict[str, Drift] = {}  # catalog name -> the pin that the upstream broke
        self._bound: dict[str, UpstreamLink] = {}  # catalog name -> its upstream
        self._on_tools = on_tools
        # Called after an upstream said its tools, resources or prompts changed (list_watch.py).
        self.on_lists_changed: Callable[[], Awaitable[None]] | None = None
        self._signature: tuple[tuple[str, int, int], ...] | None = None
        self._lock = anyio.Lock()

    @asynccontextmanager
    async def connected(self) -> AsyncIterator[Catalog]:
        """Keeps every upstream connected while in use; starts once each upstream made
        its first attempt (an upstream that is down is retried in the background)."""
        async with anyio.create_task_group() as tg:
            for link in self.links.values():
                await tg.start(link.supervise)
            try:
                await self.refresh()
                yield self
            finally:
                tg.cancel_scope.cancel()

    async def _refresh_logged(self) -> None:
        try:
            await self.refresh()
            if self.on_lists_changed is not None:
                await self.on_lists_changed()
        except Exception:  # logged; a failed eager re-list is retried by the next call
            log.exception("re-listing the upstream tools failed")

    def upstream_of(self, name: str) -> UpstreamLink | None:
        return self._bound.get(name)

    async def refresh(self) -> dict[str, types.Tool]:
        """Re-reads the catalog (when a tool file changed) and every upstream's tools; the
        catalogued tools whose upstream is up and advertises them as pinned."""
        async with self._lock:
            self._reload()
            exposed: dict[str, types.Tool] = {}
            for link in self.links.values():
                try:
                    advertised = await link.list_tools()
                except UpstreamUnavailable:
                    continue  # hides its own tools only
                for name, pinned in self.pins.items():
                    if pinned.kind != "tool":
                        continue  # resources and prompts: mcp_proxy/governed.py
                    if self._bound.get(name) is link and self._still_pinned(name, pinned, advertised):
                        exposed[name] = advertised[pinned.upstream_name]
            return exposed

    def _still_pinned(self, name: str, pinned: PinnedTool, advertised: dict[str, types.Tool]) -> bool:
        tool = advertised.get(pinned.upstream_name)
        if tool is None:
            return False
        broken = self.drifted.get(name)
        if broken is not None and broken.pin == pinned.pin:
            return False  # refused until the catalog is updated, even if the upstream reverted
        why = drift(pinned, tool.description, tool.input_schema)
        if why is not None:
            self.drifted[name] = Drift(pinned.pin, why, advertised_sha256(tool.name, tool.description,
                                                                          tool.input_schema))
            log.warning("tool_changed: upstream tool %s changed its %s since the catalog pinned it; calls are "
                        "refused until tools/%s is updated", display(pinned.upstream_name), why, display(name))
            return False
        self.drifted.pop(name, None)
        return True

    def _reload(self) -> None:
        signature = catalog_signature(self.bundle)
        if signature == self._signature:
            return
        pins = load_pins(self.bundle)
        bound: dict[str, UpstreamLink] = {}
        tools = ToolSet()
        for pinned in pins.values():
            link = self._binding(pinned)
            if link is None:
                continue
            bound[pinned.name] = link
            run = implementation_of(link, pinned) or _upstream_call(link, pinned)
            tools.register(pinned.name, run, output_schema=pinned.output_schema)
        self.pins, self._bound, self._signature = pins, bound, signature
        self._on_tools(tools)

    def _binding(self, pinned: PinnedTool) -> UpstreamLink | None:
        if pinned.upstream is not None:
            link = self.links.get(pinned.upstream)
        else:
            link = next(iter(self.links.values())) if len(self.links) == 1 else None
        if link is None:
            log.warning("tools/%s names no configured upstream (mcp.upstream: %s); it is not exposed",
                        display(pinned.name), display(pinned.upstream or "-"))
        elif not pinned.name.startswith(link.spec.prefix):
            log.warning("tools/%s does not start with the prefix %s of its upstream %s; it is not exposed",
                        display(pinned.name), display(link.spec.prefix), display(link.spec.name))
            link = None
        return link


def _upstream_call(link: UpstreamLink, pinned: PinnedTool) -> Callable[[Any, Any], Awaitable[Any]]:
    async def call(args: Any, invocation: Any) -> Any:
        try:
            result = await link.call_tool(pinned.upstream_name, args, progress_callback=progress_relay())
        except UpstreamUnavailable:
            raise ToolError(UPSTREAM_UNAVAILABLE, "The tool's server could not be reached.") from None
        if result.is_error:
            text = " ".join(b.text for b in result.content if isinstance(b, types.TextContent))
            raise ToolError("upstream_error", text or "The tool failed.")
        if pinned.output_schema is not None:
            return result.structured_content
        return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]

    return call
