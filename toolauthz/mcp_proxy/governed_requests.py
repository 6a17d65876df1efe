"""The downstream handlers of resources, prompts, completions and logging.

`resources/read` and `prompts/get` go through the proxy's Guard like a `tools/call`:
Authorize in the caller's tenant (the entry's action `tool:<name>`, see governed.py),
approval, Verify, the upstream request, the ToolSet's output bound, ReportOutcome. A
refusal is a JSON-RPC error (these methods have no error result) that names the
status and code in `data`, and the upstream is never asked.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from toolauthz.client.results import COMPLETED, CallResult
from toolauthz.mcp_proxy.catalog import Drift
from toolauthz.mcp_proxy.governed import Governed
from toolauthz.mcp_proxy.passthrough import complete, set_level_everywhere
from toolauthz.mcp_proxy.pins import PinnedTool
from toolauthz.mcp_proxy.runs import RUN_META_KEY, Run, call_id

__all__ = ["GovernedRequests", "RESOURCE_NOT_FOUND"]

RESOURCE_NOT_FOUND = -32002  # MCP's code for a resource the server does not have
_MAX_SUBSCRIPTIONS = 1024  # per gateway: a template's URIs are endless


class GovernedRequests:
    """Handlers bound to one McpProxy (`proxy.guarded` runs an entry through its Guard)."""

    def __init__(self, proxy: Any, governed: Governed):
        self.proxy = proxy
        self.governed = governed

    def handlers(self) -> dict[str, Any]:
        """The `on_*` keyword arguments of the SDK's Server."""
        return {"on_list_resources": self.list_resources, "on_list_resource_templates": self.list_templates,
                "on_read_resource": self.read_resource, "on_list_prompts": self.list_prompts,
                "on_get_prompt": self.get_prompt, "on_completion": self.complete,
                "on_subscribe_resource": self.subscribe, "on_unsubscribe_resource": self.unsubscribe}

    async def list_resources(self, ctx: Any, params: Any) -> types.ListResourcesResult:
        self.proxy.note_session(ctx)
        await self.proxy.refresh()
        listed = await self.governed.resources()
        return types.ListResourcesResult(resources=[listed[name] for name in await self.proxy.visible(ctx, listed)])

    async def list_templates(self, ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        self.proxy.note_session(ctx)
        await self.proxy.refresh()
        listed = await self.governed.templates()
        return types.ListResourceTemplatesResult(resource_templates=[listed[name]
                                                                     for name in await self.proxy.visible(ctx, listed)])

    async def list_prompts(self, ctx: Any, params: Any) -> types.ListPromptsResult:
        self.proxy.note_session(ctx)
        await self.proxy.refresh()
        listed = await self.governed.prompts()
        return types.ListPromptsResult(prompts=[listed[name] for name in await self.proxy.visible(ctx, listed)])

    async def read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        run = self.proxy.run_of(ctx)
        uri = str(params.uri)
        await self.proxy.refresh()
        entry = await self.governed.entry_for_uri(uri)
        if entry is None:
            await self._refuse_if_drifted(ctx, run, self.governed.drifted_for("resource|resource_template", uri))
            raise MCPError(RESOURCE_NOT_FOUND, "the resource is not available here", data={"uri": uri[:256]})
        result = await self._guarded(ctx, run, entry.name, {"uri": uri})
        try:
            contents = [_content(block) for block in result.output]
        except (ValidationError, TypeError) as exc:
            raise MCPError(types.INTERNAL_ERROR, "the server's contents are not MCP resource contents") from exc
        return types.ReadResourceResult(contents=contents, meta={RUN_META_KEY: run.name})

    async def get_prompt(self, ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        run = self.proxy.run_of(ctx)
        await self.proxy.refresh()
        offered = await self.governed.prompts()
        if params.name not in offered:
            await self._refuse_if_drifted(ctx, run, self.governed.drifted_for("prompt", params.name))
            raise MCPError(types.INVALID_PARAMS, f"no prompt named `{params.name[:64]}` is available here")
        result = await self._guarded(ctx, run, params.name, dict(params.arguments or {}))
        try:
            got = types.GetPromptResult.model_validate(result.output)
        except ValidationError as exc:
            raise MCPError(types.INTERNAL_ERROR, "the server's answer is not an MCP prompt") from exc
        got.meta = {**(got.meta or {}), RUN_META_KEY: run.name}
        return got

    async def _refuse_if_drifted(self, ctx: Any, run: Run, pinned: PinnedTool | None) -> None:
        """A drifted entry's refusal, audited like a drifted tool's (`tool_changed`)."""
        if pinned is None:
            return
        _pin, changed = self.governed.drifted.get(pinned.name, ("", "-"))
        await self.proxy.audit_refusal(run, call_id(run, ctx.request_id), pinned.name, Drift(pinned.pin, changed, ""))
        raise MCPError(types.INVALID_REQUEST, f"`{pinned.name}` changed on its server since it was reviewed; it is "
                                              "refused until its catalog entry is updated",
                       data={"io.toolauthz/code": "tool_changed"})

    async def _guarded(self, ctx: Any, run: Run, name: str, arguments: dict[str, Any]) -> CallResult:
        input_json = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        result: CallResult = await self.proxy.guarded(ctx, run, name, input_json)
        if result.status != COMPLETED:
            data = {"io.toolauthz/status": result.status, "io.toolauthz/code": result.code}
            if result.approval_id:
                data["io.toolauthz/approval_id"] = result.approval_id
            raise MCPError(types.INVALID_REQUEST, result.content, data=data)
        return result

    async def complete(self, ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
        self.proxy.note_session(ctx)
        prompts, templates = await self.governed.prompts(), await self.governed.templates()
        visible = set(await self.proxy.visible(ctx, [*prompts, *templates]))  # no hints about what is not listed
        return await complete(self.proxy.catalog, {n: p for n, p in prompts.items() if n in visible},
                              {n: t for n, t in templates.items() if n in visible}, params)

    async def set_level(self, ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
        self.proxy.note_session(ctx)
        await set_level_everywhere(self.proxy.catalog.links, params.level)
        return types.EmptyResult()

    async def subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        """Subscribes the gateway upstream, for a catalogued URI only; updates reach the
        stdio client (one upstream connection serves every HTTP user)."""
        self.proxy.note_session(ctx)
        entry = await self.governed.entry_for_uri(str(params.uri))
        link = self.proxy.catalog.upstream_of(entry.name) if entry is not None else None
        if link is None or entry is None or not await self.proxy.visible(ctx, [entry.name]):
            raise MCPError(RESOURCE_NOT_FOUND, "the resource is not available here")
        if len(self.proxy.logs.subscribed) >= _MAX_SUBSCRIPTIONS:
            raise MCPError(types.INVALID_REQUEST, f"at most {_MAX_SUBSCRIPTIONS} subscriptions")
        with warnings.catch_warnings():  # deprecated as of 2026-07-28, still the 2025-11-25 method
            warnings.simplefilter("ignore")
            await link.client.session.subscribe_resource(str(params.uri))
        self.proxy.logs.subscribed.add(str(params.uri))
        return types.EmptyResult()

    async def unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
        entry = await self.governed.entry_for_uri(str(params.uri))
        link = self.proxy.catalog.upstream_of(entry.name) if entry is not None else None
        if link is not None:
            with warnings.catch_warnings():  # as subscribe
                warnings.simplefilter("ignore")
                await link.client.session.unsubscribe_resource(str(params.uri))
        self.proxy.logs.subscribed.discard(str(params.uri))
        return types.EmptyResult()


def _content(block: Any) -> types.TextResourceContents | types.BlobResourceContents:
    if isinstance(block, dict) and "blob" in block:
        return types.BlobResourceContents.model_validate(block)
    return types.TextResourceContents.model_validate(block)
