"""Drives the notes server through `toolauthz mcp-proxy` with the MCP SDK's client: the
proxy runs as a stdio subprocess and starts the upstream as its own stdio subprocess.

    toolauthz serve --bundle examples/mcp_gateway/bundle --listen 127.0.0.1:50071 --data-dir .toolauthz-mcp
    .venv/bin/python -m examples.mcp_gateway.drive    # in a second terminal
"""

from __future__ import annotations

import argparse
import os
import sys

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters

BUNDLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bundle")


def proxy_command(sidecar: str) -> StdioServerParameters:
    args = ["-m", "toolauthz.cli", "mcp-proxy", "--bundle", BUNDLE, "--sidecar", sidecar,
            "--tenant", "acme", "--principal", "User::alice",
            "--", sys.executable, "-m", "examples.mcp_gateway.upstream"]
    return StdioServerParameters(command=sys.executable, args=args, env=dict(os.environ))


def shown(result: types.CallToolResult) -> str:
    text = " ".join(b.text for b in result.content if isinstance(b, types.TextContent))
    return f"{'error' if result.is_error else 'ok'}: {text}"


async def main(sidecar: str) -> None:
    async with Client(proxy_command(sidecar), cache=None) as client:
        tools = await client.list_tools()
        print("tools:", ", ".join(sorted(t.name for t in tools.tools)))  # export_all_notes is not there
        print("read n1:", shown(await client.call_tool("read_note", {"note_id": "n1"})))
        print("read a1:", shown(await client.call_tool("read_note", {"note_id": "a1"})))
        print("read ../x:", shown(await client.call_tool("read_note", {"note_id": "../x"})))
        print("export:", shown(await client.call_tool("export_all_notes", {})))
        print("delete n2:", shown(await client.call_tool("delete_note", {"note_id": "n2"})))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sidecar", default=os.environ.get("TOOLAUTHZ_SERVER", "127.0.0.1:50071"))
    anyio.run(main, parser.parse_args().sidecar)
