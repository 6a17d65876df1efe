"""What the gateway answers an MCP client: a catalogued tool as it is advertised, and a
call's result in MCP's shape, with `_meta` saying what the Guard made of it."""

from __future__ import annotations

import json

import mcp_types as types

from toolauthz.client.results import COMPLETED, CallResult
from toolauthz.mcp_proxy.passthrough import annotations_of
from toolauthz.mcp_proxy.pins import PinnedTool

__all__ = ["APPROVAL_META_KEY", "CODE_META_KEY", "STATUS_META_KEY", "advertised", "error_result", "to_mcp"]

STATUS_META_KEY = "io.toolauthz/status"  # a result's CallResult.status, when not completed
CODE_META_KEY = "io.toolauthz/code"
APPROVAL_META_KEY = "io.toolauthz/approval_id"


def advertised(pinned: PinnedTool, upstream: types.Tool | None = None) -> types.Tool:
    """The tool as the catalog pinned it, with the upstream's annotations (never less careful
    than the catalog's `side_effect`)."""
    return types.Tool(name=pinned.name, description=pinned.description, input_schema=dict(pinned.input_schema),
                      output_schema=dict(pinned.output_schema) if pinned.output_schema is not None else None,
                      annotations=annotations_of(pinned, upstream))


def to_mcp(result: CallResult, pinned: PinnedTool,
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


def error_result(text: str) -> types.CallToolResult:
    """A refusal the model reads: `isError: true`, the text alone."""
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
