"""A small upstream MCP server: notes, with a read-only tool, a destructive tool and one
tool the gateway's catalog does not know (so the gateway never shows it).

    python -m examples.mcp_gateway.upstream                  # stdio
    python -m examples.mcp_gateway.upstream --http 127.0.0.1:0   # Streamable HTTP at /mcp

Over HTTP it prints its URL (`listening on http://127.0.0.1:PORT/mcp`) once it accepts
connections; port 0 picks a free port.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

NOTE_ID = {"type": "string", "pattern": "^[an][0-9]{1,6}$"}


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": sorted(properties),
            "additionalProperties": False}


# What the server advertises: the gateway exposes a tool only while its name, description
# and input schema equal what examples/mcp_gateway/bundle/tools/ pinned.
TOOLS = [
    types.Tool(name="read_note", description="Read one note by its id.", input_schema=_object({"note_id": NOTE_ID}),
               output_schema=_object({"note_id": {"type": "string"}, "text": {"type": "string"}}),
               annotations=types.ToolAnnotations(read_only_hint=True)),
    types.Tool(name="delete_note", description="Delete one note for good.",
               input_schema=_object({"note_id": NOTE_ID}), output_schema=_object({"deleted": {"type": "string"}}),
               annotations=types.ToolAnnotations(destructive_hint=True, idempotent_hint=True)),
    types.Tool(name="export_all_notes", description="Dump every note.", input_schema=_object({}),
               annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=True)),
]


def build_server(notes: dict[str, str] | None = None) -> Server[Any]:
    store = dict(notes if notes is not None else {"n1": "buy milk", "n2": "call Ada", "a1": "old plans"})

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        if params.name == "read_note":
            note_id = str(args.get("note_id"))
            if note_id not in store:
                return _error(f"no note {note_id}")
            return _structured({"note_id": note_id, "text": store[note_id]})
        if params.name == "delete_note":
            note_id = str(args.get("note_id"))
            if store.pop(note_id, None) is None:
                return _error(f"no note {note_id}")
            return _structured({"deleted": note_id})
        if params.name == "export_all_notes":
            return _structured(store)
        return _error(f"unknown tool {params.name}")

    return Server("notes", on_list_tools=list_tools, on_call_tool=call_tool)


def _structured(value: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=json.dumps(value))], structured_content=value)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


async def main(server: Server[Any] | None = None) -> None:
    server = server or build_server()
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


async def main_http(address: str, server: Server[Any] | None = None) -> None:
    import socket

    import uvicorn

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(f"listening on http://{host}:{sock.getsockname()[1]}/mcp", flush=True)

    host, _, port = address.rpartition(":")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.bind((host.strip("[]"), int(port)))
    app = (server or build_server()).streamable_http_app(host=host)
    await AnnouncingServer(uvicorn.Config(app, log_level="warning")).serve(sockets=[sock])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--http", metavar="HOST:PORT", help="serve Streamable HTTP instead of stdio")
    chosen = parser.parse_args().http
    if chosen:
        anyio.run(main_http, chosen)
    else:
        anyio.run(main)
