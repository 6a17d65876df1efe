"""An upstream MCP server that exits while it runs a call: the notes tools, where
`read_note` of note `n9` ends the process (status 3) after the request arrived and before
it answers, as a crash mid-call would; the system closes its connections.

    python tests/mcp_dying_upstream.py                      # stdio
    python tests/mcp_dying_upstream.py --http 127.0.0.1:0   # prints `listening on URL`
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from examples.mcp_gateway.upstream import TOOLS, main, main_http


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    note_id = (params.arguments or {}).get("note_id")
    if note_id == "n9":
        os._exit(3)  # the request was received: the gateway cannot know whether it took effect
    value = {"note_id": note_id, "text": "buy milk"}
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(value))], structured_content=value)


if __name__ == "__main__":
    server: Server[Any] = Server("dying", on_list_tools=list_tools, on_call_tool=call_tool)
    if sys.argv[1:2] == ["--http"]:
        anyio.run(main_http, sys.argv[2], server)
    else:
        anyio.run(main, server)
