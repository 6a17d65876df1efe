"""Resources and prompts governed like tools: catalogued, pinned, authorized, audited.

A bundle catalogues an upstream resource or prompt with a tool file whose `mcp.kind`
says what it pins, so the sidecar decides a read or a get on the existing Authorize path
(its own Cedar action `tool:<name>`, its own input schema, limits and audit):

* `kind: resource`, `uri: note://readme`: one resource by its exact URI;
* `kind: resource_template`, `uri_template: note://{id}`: every resource of the
  upstream's URI template;
* `kind: prompt`, `name: summarize` (the upstream's prompt name; default the file's
  `name`): one prompt.

A resource entry's input is `{"uri": "<the URI read>"}`: its input schema pins the URI
(`const` for one resource, a `pattern` for a template), and `resource: {type: ..., id:
/uri}` makes the URI the Cedar resource. A prompt entry's input is the prompt's
arguments (all strings). The pins: a resource's URI (template) and description, a
prompt's upstream name, description and argument names (which are required). What no
entry catalogues is never listed, and what drifted is hidden and refused (`tool_changed`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError

from toolauthz.client import ToolError
from toolauthz.display.escape import display
from toolauthz.mcp_proxy.pins import PinnedTool
from toolauthz.mcp_proxy.upstreams import UPSTREAM_UNAVAILABLE, UpstreamLink, UpstreamUnavailable

__all__ = ["Governed", "implementation_of", "uri_template_regex"]

log = logging.getLogger("toolauthz.mcp_proxy")
_PAGES = 100
_VARIABLE = re.compile(r"\{([+#./;?&]?)[A-Za-z0-9_.,*%]+\}")


def uri_template_regex(template: str) -> re.Pattern[str]:
    """The URIs an RFC 6570 template can expand to, for routing a read to its entry:
    a simple `{var}` is one path segment, a reserved one (`{+var}`) anything. The
    sidecar checks the URI against the entry's own `pattern` before any read."""
    parts, at = [], 0
    for match in _VARIABLE.finditer(template):
        parts.append(re.escape(template[at:match.start()]))
        parts.append(".+" if match.group(1) in ("+", "#") else "[^/?#]+")
        at = match.end()
    parts.append(re.escape(template[at:]))
    return re.compile("".join(parts) + r"\Z", re.DOTALL)


async def _ask(link: UpstreamLink, send: Callable[[Any], Awaitable[Any]], timeout: float | None) -> Any:
    """One request to an upstream; UpstreamUnavailable when it is down or its
    connection fails (it is then reconnected); the upstream's MCPError as it is."""
    client = link.client
    try:
        with anyio.fail_after(timeout):
            return await send(client)
    except MCPError:
        raise
    except Exception as exc:  # the transport failed or timed out: the link is not usable as it is
        link.lose(type(exc).__name__)
        raise UpstreamUnavailable(link.spec.name) from exc


async def _listed(link: UpstreamLink, method: str, field: str, timeout: float) -> list[Any]:
    """Every page of one list method of an upstream ([] when it does not offer it)."""
    items: list[Any] = []
    cursor: str | None = None
    for _ in range(_PAGES):
        def send(client: Any, cursor: str | None = cursor) -> Awaitable[Any]:
            return getattr(client, method)(cursor=cursor, cache_mode="refresh")  # type: ignore[no-any-return]

        try:
            page = await _ask(link, send, timeout)
        except MCPError as exc:
            if exc.error.code == types.METHOD_NOT_FOUND:
                return []
            raise UpstreamUnavailable(link.spec.name) from exc
        items.extend(getattr(page, field))
        cursor = page.next_cursor
        if cursor is None:
            break
    return items


def _prompt_drift(pinned: PinnedTool, prompt: types.Prompt) -> str | None:
    if (prompt.description or "") != pinned.description:
        return "description"
    schema = dict(pinned.input_schema)
    properties, required = schema.get("properties"), schema.get("required")
    properties = properties if isinstance(properties, dict) else {}
    required = required if isinstance(required, list) else []  # the sidecar refuses a bundle with either wrong
    advertised = {(a.name, bool(a.required)) for a in prompt.arguments or []}
    catalogued = {(name, name in required) for name in properties}
    return None if advertised == catalogued else "arguments"


class Governed:
    """What each upstream offers of the catalogued resources, templates and prompts."""

    def __init__(self, catalog: Any, request_timeout: float):
        self.catalog = catalog  # mcp_proxy.catalog.Catalog
        self.request_timeout = request_timeout
        self.drifted: dict[str, tuple[str, str]] = {}  # catalog name -> (the pin it broke, what changed)

    def _entries(self, kind: str) -> list[tuple[PinnedTool, UpstreamLink]]:
        found = []
        for name, pinned in self.catalog.pins.items():
            link = self.catalog.upstream_of(name)
            if pinned.kind == kind and link is not None:
                found.append((pinned, link))
        return found

    def _pinned(self, pinned: PinnedTool, why: str | None) -> bool:
        """Whether the upstream still offers the entry as pinned; once it drifted, it stays
        refused (even if the upstream reverts) until its tool file changes the pin."""
        held = self.drifted.get(pinned.name)
        if held is not None and held[0] == pinned.pin:
            return False
        if why is None:
            self.drifted.pop(pinned.name, None)
            return True
        log.warning("tool_changed: the upstream %s of %s changed its %s since the catalog pinned it; it is "
                    "hidden and refused until tools/%s is updated", pinned.kind, display(pinned.name), why,
                    display(pinned.name))
        self.drifted[pinned.name] = (pinned.pin, why)
        return False

    async def _offered(self, link: UpstreamLink, method: str, field: str) -> list[Any]:
        try:
            return await _listed(link, method, field, self.request_timeout)
        except UpstreamUnavailable:
            return []  # hides its own entries only

    async def resources(self) -> dict[str, types.Resource]:
        """Catalog name -> the upstream resource, for every exact-URI entry still pinned."""
        out: dict[str, types.Resource] = {}
        for link in self.catalog.links.values():
            entries = [p for p, owner in self._entries("resource") if owner is link]
            if not entries:
                continue
            offered = {r.uri: r for r in await self._offered(link, "list_resources", "resources")}
            for pinned in entries:
                resource = offered.get(str(pinned.uri))
                if resource is not None and self._pinned(
                        pinned, None if (resource.description or "") == pinned.description else "description"):
                    out[pinned.name] = resource.model_copy(update={"description": pinned.description})
        return out

    async def templates(self) -> dict[str, types.ResourceTemplate]:
        out: dict[str, types.ResourceTemplate] = {}
        for link in self.catalog.links.values():
            entries = [p for p, owner in self._entries("resource_template") if owner is link]
            if not entries:
                continue
            offered = {t.uri_template: t for t in await self._offered(link, "list_resource_templates",
                                                                        "resource_templates")}
            for pinned in entries:
                template = offered.get(str(pinned.uri))
                if template is not None and self._pinned(
                        pinned, None if (template.description or "") == pinned.description else "description"):
                    out[pinned.name] = template.model_copy(update={"description": pinned.description})
        return out

    async def prompts(self) -> dict[str, types.Prompt]:
        """Catalog name -> the prompt as the gateway advertises it (the catalog's name)."""
        out: dict[str, types.Prompt] = {}
        for link in self.catalog.links.values():
            entries = [p for p, owner in self._entries("prompt") if owner is link]
            if not entries:
                continue
            offered = {p.name: p for p in await self._offered(link, "list_prompts", "prompts")}
            for pinned in entries:
                prompt = offered.get(pinned.upstream_name)
                if prompt is not None and self._pinned(pinned, _prompt_drift(pinned, prompt)):
                    out[pinned.name] = prompt.model_copy(update={"name": pinned.name,
                                                                 "description": pinned.description})
        return out

    async def entry_for_uri(self, uri: str) -> PinnedTool | None:
        """The one entry a URI reads through: the exact-URI entry that names it, else the
        template entry that claims it. Claims are counted among every catalogued entry,
        drifted ones too, so a drifted entry's URI never falls through to another entry;
        None when the one claimant is not offered as pinned, or two claim it (refused
        rather than guessed)."""
        exact = [p for p, _link in self._entries("resource") if p.uri == uri]
        if exact:
            return exact[0] if len(exact) == 1 and exact[0].name in await self.resources() else None
        claims = [p for p, _link in self._entries("resource_template")
                  if uri_template_regex(str(p.uri)).fullmatch(uri)]
        return claims[0] if len(claims) == 1 and claims[0].name in await self.templates() else None

    def drifted_for(self, kind: str, key: str) -> PinnedTool | None:
        """The catalogued entry a URI or prompt name would use if it had not drifted;
        `kind`: the kinds to look at, `|`-separated."""
        for name in self.drifted:
            pinned: PinnedTool | None = self.catalog.pins.get(name)
            if pinned is None or pinned.kind not in kind.split("|"):
                continue
            if pinned.kind == "prompt" and name == key:
                return pinned
            if pinned.kind == "resource" and pinned.uri == key:
                return pinned
            if pinned.kind == "resource_template" and uri_template_regex(str(pinned.uri)).fullmatch(key):
                return pinned
        return None


def implementation_of(link: UpstreamLink, pinned: PinnedTool) -> Callable[[Any, Any], Awaitable[Any]] | None:
    """What the Guard runs once the sidecar allowed a read or a get: the upstream request.
    Its output (the contents, or the prompt's messages) is bounded by the ToolSet."""

    async def read(args: Any, invocation: Any) -> Any:
        result = await _guarded(lambda c: c.read_resource(args["uri"]))
        return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.contents]

    async def get(args: Any, invocation: Any) -> Any:
        result = await _guarded(lambda c: c.get_prompt(pinned.upstream_name, dict(args)))
        return result.model_dump(mode="json", by_alias=True, exclude_none=True)

    async def _guarded(send: Callable[[Any], Awaitable[Any]]) -> Any:
        try:
            return await _ask(link, send, None)  # the Guard's execution timeout bounds it
        except UpstreamUnavailable:
            raise ToolError(UPSTREAM_UNAVAILABLE, "The server could not be reached.") from None
        except MCPError as exc:
            raise ToolError("upstream_error", exc.error.message or "The server refused the request.") from None

    if pinned.kind in ("resource", "resource_template"):
        return read
    if pinned.kind == "prompt":
        return get
    return None
