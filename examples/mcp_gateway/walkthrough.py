"""The whole example in one process tree, as examples/mcp_gateway/README.md runs it step by
step: a sidecar on the example's bundle, the gateway of `gateway.yaml` over Streamable
HTTP, and the official MCP client (default mode) calling through it.

    .venv/bin/python -m examples.mcp_gateway.walkthrough

It runs the same commands the README's three terminals do, with two differences that let
it run anywhere: free ports (the `--listen ...:0` of each command; the README's are fixed)
and a fresh data directory. Both processes are stopped at the end.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import mcp_types as types
from mcp import Client

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TOOLAUTHZ = str(pathlib.Path(sys.executable).parent / "toolauthz")  # this interpreter's console script


@contextmanager
def started(argv: list[str], banner: re.Pattern[str], stream: str) -> Iterator[str]:
    """Runs a command from the repository root until the block ends; yields the first
    match of `banner` in its `stream` (stdout or stderr), the address it serves on."""
    pipes = {stream: subprocess.PIPE, "stdout" if stream == "stderr" else "stderr": subprocess.DEVNULL}
    proc = subprocess.Popen(argv, cwd=ROOT, text=True, stdin=subprocess.DEVNULL, **pipes)  # type: ignore[call-overload]
    output = getattr(proc, stream)
    try:
        for line in output:
            found = banner.search(line)
            if found:
                break
        else:
            raise SystemExit(f"{argv[1]} did not start (exit {proc.wait()})")
        yield found.group(1)
    finally:
        proc.terminate()
        proc.wait(60)
        output.close()


def shown(result: types.CallToolResult) -> str:
    text = " ".join(b.text for b in result.content if isinstance(b, types.TextContent))
    return f"{'error' if result.is_error else 'ok'}: {text}"


async def drive(url: str) -> None:
    async with Client(url, cache=None) as client:  # the official client, default mode
        tools = await client.list_tools()
        print("tools:", ", ".join(sorted(t.name for t in tools.tools)))  # export_all_notes is not there
        print("read n1:", shown(await client.call_tool("read_note", {"note_id": "n1"})))
        print("read a1:", shown(await client.call_tool("read_note", {"note_id": "a1"})))  # archived: denied
        print("delete n2:", shown(await client.call_tool("delete_note", {"note_id": "n2"})))  # needs an editor


def main() -> None:
    data = tempfile.mkdtemp(prefix="toolauthz-mcp-")
    serve = [TOOLAUTHZ, "serve", "--bundle", "examples/mcp_gateway/bundle", "--data-dir", data,
             "--listen", "127.0.0.1:0", "--workers", "1"]
    with started(serve, re.compile(r"toolauthz serving bundle .* on (\S+?),"), "stdout") as sidecar:
        gateway = [TOOLAUTHZ, "mcp-proxy", "--config", "examples/mcp_gateway/gateway.yaml", "--sidecar", sidecar,
                   "--listen", "http://127.0.0.1:0"]
        with started(gateway, re.compile(r"listening on (http://\S+/mcp)"), "stderr") as url:
            print("gateway:", url)
            anyio.run(drive, url)


if __name__ == "__main__":
    main()
