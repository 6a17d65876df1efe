"""What the gateway exposes: the bundle's pinned tools, each bound to one upstream, and
whether that upstream still advertises it as pinned.

A tool file belongs to the upstream named by its `mcp.upstream` (optional when the
gateway has one upstream), and its catalog name must start with that upstream's prefix
(`crm__lookup_customer`): tools of different upstreams cannot collide and a policy sees
which server a tool is on. A tool file that names no configured upstream, or lacks the
prefix, is never exposed (and logged). `tools/list` is the union over the upstreams;
an upstream that is down or whose tool drifted hides only its own tools.

The tool files come from the sidecar (`GetCatalog`, `sidecar_catalog`): the bytes of the
bundle it verified and enforces, never the bundle directory, so the gateway can never
route by a file the sidecar refused (a pin edited on disk, two pins swapped). Each
refresh asks whether the serving bundle's digest moved (a small answer when it did
not) and re-reads the pins when it did; when the sidecar cannot be asked, the pins held
keep routing, and every call still needs the sidecar's Authorize.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import grpc
import mcp_types as types

from toolauthz.client import AsyncAuthzClient, ToolError, ToolInvocation, ToolOutcomeUnknown, ToolSet
from toolauthz.client.results import MESSAGES
from toolauthz.client.tools import DEFAULT_MAX_OUTPUT_BYTES
from toolauthz.display.escape import display
from toolauthz.errors import InputError
from toolauthz.mcp_proxy.governed import implementation_of
from toolauthz.mcp_proxy.passthrough import progress_relay
from toolauthz.mcp_proxy.pins import PinnedTool, advertised_sha256, drift, load_pins
from toolauthz.mcp_proxy.runs import BoundedMap
from toolauthz.mcp_proxy.upstreams import (
    UPSTREAM_UNAVAILABLE,
    UpstreamLink,
    UpstreamLost,
    UpstreamSpec,
    UpstreamUnavailable,
)
from toolauthz.strict_json import parse_strict_json

__all__ = ["Catalog", "CatalogFiles", "Drift", "sidecar_catalog"]

log = logging.getLogger("toolauthz.mcp_proxy")
_MAX_ANSWERS = 1024  # structured answers waiting for the proxy to send them (one per call in flight)
UPSTREAM_LOST = "upstream_lost"  # the outcome_unknown code of a call whose upstream was lost mid-call


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


@dataclass(frozen=True)
class CatalogFiles:
    """The tool files of the bundle the sidecar serves, and which bundle that is."""

    digest: str
    revision: int | None
    files: Mapping[str, bytes]  # `tools/<file>` -> bytes


# Given the digest held (""), the sidecar's catalog, or None when it is still that one.
CatalogSource = Callable[[str], Awaitable["CatalogFiles | None"]]


def sidecar_catalog(authz: AsyncAuthzClient) -> CatalogSource:
    """The catalog as the sidecar serves it (GetCatalog, role runtime)."""

    async def fetch(known: str) -> CatalogFiles | None:
        response = await authz.get_catalog(known)
        if response.unchanged:
            return None
        return CatalogFiles(response.bundle_digest, response.revision if response.HasField("revision") else None,
                            {f.name: f.content for f in response.files})

    return fetch


class Catalog:
    def __init__(self, source: CatalogSource, upstreams: Sequence[UpstreamSpec],
                 on_tools: Callable[[ToolSet], None], *, request_timeout: float = 10.0):
        names = [spec.name for spec in upstreams]
        if not names or len(set(names)) != len(names):
            raise ValueError("the gateway needs one or more upstreams with distinct names")
        self._source = source
        self.links = {spec.name: UpstreamLink(spec, self._refresh_logged, request_timeout=request_timeout)
                      for spec in upstreams}
        self.pins: dict[str, PinnedTool] = {}
        self.drifted: dict[str, Drift] = {}  # catalog name -> the pin that the upstream broke
        self._bound: dict[str, UpstreamLink] = {}  # catalog name -> its upstream
        self._on_tools = on_tools
        self.digest = ""  # the sidecar's bundle the pins were read from
        self.revision: int | None = None
        # Called after an upstream said its tools, resources or prompts changed (list_watch.py).
        self.on_lists_changed: Callable[[], Awaitable[None]] | None = None
        self._lock = anyio.Lock()
        # call id -> the upstream's content blocks of a structured result, as it sent them:
        # the proxy answers with them (byte for byte) once the Guard accepted the output.
        self.answered: BoundedMap[str, list[types.ContentBlock]] = BoundedMap(_MAX_ANSWERS)

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
        """Re-reads the catalog (when the sidecar's bundle changed) and every upstream's
        tools; the catalogued tools whose upstream is up and advertises them as pinned."""
        async with self._lock:
            await self._reload()
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

    async def _reload(self) -> None:
        try:
            fetched = await self._source(self.digest)
        except grpc.RpcError as exc:
            if not self.digest:
                raise  # no catalog yet: nothing to route by
            log.warning("the sidecar's catalog could not be read (%s); the pins of bundle %s keep routing",
                        display(exc.code().name), self.digest[:16])
            return
        if fetched is None:
            return
        pins = load_pins(fetched.files)
        bound: dict[str, UpstreamLink] = {}
        tools = ToolSet()
        for pinned in pins.values():
            link = self._binding(pinned)
            if link is None:
                continue
            bound[pinned.name] = link
            run = implementation_of(link, pinned) or _upstream_call(link, pinned, self.answered)
            tools.register(pinned.name, run, output_schema=pinned.output_schema,
                           timeout=link.spec.timeout_of(pinned.upstream_name))
        self.pins, self._bound = pins, bound
        self.digest, self.revision = fetched.digest, fetched.revision
        log.info("catalog of the sidecar's bundle %s (revision %s): %d pinned entries", fetched.digest[:16],
                 fetched.revision if fetched.revision is not None else "unsigned", len(pins))
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


def _upstream_call(link: UpstreamLink, pinned: PinnedTool,
                   answered: BoundedMap[str, list[types.ContentBlock]]) -> Callable[[Any, Any], Awaitable[Any]]:
    async def call(args: Any, invocation: ToolInvocation) -> Any:
        try:
            result = await link.call_tool(pinned.upstream_name, args, timeout=invocation.remaining(),
                                          progress_callback=progress_relay())
        except UpstreamUnavailable:
            raise ToolError(UPSTREAM_UNAVAILABLE, "The tool's server could not be reached; the call was not "
                                                  "executed.") from None
        except UpstreamLost as lost:
            if lost.why == "timeout":
                raise ToolOutcomeUnknown("timeout", MESSAGES["timeout"]) from None
            raise ToolOutcomeUnknown(UPSTREAM_LOST, "The connection to the tool's server was lost during the call; "
                                                    "whether it took effect is unknown. Do not retry it; it will be "
                                                    "reconciled.") from None
        if result.is_error:
            text = " ".join(b.text for b in result.content if isinstance(b, types.TextContent))
            raise ToolError("upstream_error", text or "The tool failed.")
        if pinned.output_schema is not None:
            if _serializes(result.content, result.structured_content):
                answered.set(invocation.call_id, list(result.content))
            return result.structured_content
        return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]

    return call


def _serializes(content: list[types.ContentBlock], structured: Any) -> bool:
    """Whether the upstream's content is one text block holding the structured result's
    own JSON (what MCP asks a tool to send beside it): then the proxy may send that text as
    it came, since the Guard checks the structured result. Anything else (other blocks,
    text that says something else, or a padded text over the output bound) is replaced
    by the proxy's serialization of the checked result."""
    if len(content) != 1 or not isinstance(content[0], types.TextContent) or structured is None:
        return False
    try:
        parsed = parse_strict_json(content[0].text.encode("utf-8", "surrogatepass"), max_bytes=DEFAULT_MAX_OUTPUT_BYTES)
    except (InputError, ValueError, UnicodeError):
        return False
    return bool(parsed == structured) and _same_types(parsed, structured)


def _same_types(a: Any, b: Any) -> bool:
    """`==` with types: `1 == 1.0 == True` in Python, not in what a model reads."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_types(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_types(x, y) for x, y in zip(a, b, strict=True))
    return True
