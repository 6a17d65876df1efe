"""The MCP gateway routes by the sidecar's verified bundle (issue 37, attack 2): with the
pins of `read_note` and `delete_note` swapped on disk, the sidecar refuses the edited
bundle and the gateway, which takes its catalog from the sidecar (GetCatalog), does not
follow the edit either: "read_note" still runs the upstream's read_note. Against the
real `toolauthz serve` and `toolauthz mcp-proxy` processes."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from collections.abc import Iterator

import anyio
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from mcp import Client, StdioServerParameters

from tests.bundle_support import TOOLAUTHZ, public_key_file, served_processes, sign, write_config
from tests.conftest import ROOT

EXAMPLE = ROOT / "examples" / "mcp_gateway" / "bundle"


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def serve() -> Iterator:
    yield from served_processes()


def swap_pins(bundle) -> None:
    """What an attacker who can write the directory, but holds no signing key, does: the
    catalog name `read_note` (which everyone may call) pinned to the upstream delete_note,
    with delete_note's description and schemas so that no drift check notices."""
    tools = bundle / "tools"
    read, delete = (tools / "read_note.yaml").read_text(), (tools / "delete_note.yaml").read_text()
    (tools / "read_note.yaml").write_text(delete.replace("name: delete_note", "name: read_note")
                                          + "mcp: {name: delete_note}\n")
    (tools / "delete_note.yaml").write_text(read.replace("name: read_note", "name: delete_note")
                                            + "mcp: {name: read_note}\n")


def test_a_gateway_does_not_follow_tool_files_edited_on_disk(tmp_path, key, serve):
    bundle = tmp_path / "bundle"
    shutil.copytree(EXAMPLE, bundle)
    sign(bundle, key, 1)
    served = serve(write_config(tmp_path, bundle, public_key_file(tmp_path, key)))
    port = served.port()
    # No --bundle: the gateway reads no bundle directory at all.
    gateway = StdioServerParameters(
        command=TOOLAUTHZ, args=["mcp-proxy", "--sidecar", f"127.0.0.1:{port}", "--tenant", "acme",
                                 "--principal", "User::alice", "--", sys.executable, "-m",
                                 "examples.mcp_gateway.upstream"],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=str(ROOT))

    async def scenario() -> None:
        async with Client(gateway, cache=None) as client:
            listed = sorted(t.name for t in (await client.list_tools()).tools)
            assert listed == ["delete_note", "read_note"]
            read = await client.call_tool("read_note", {"note_id": "n2"})
            assert read.structured_content == {"note_id": "n2", "text": "call Ada"}
            swap_pins(bundle)
            served.proc.send_signal(signal.SIGHUP)
            await anyio.to_thread.run_sync(served.await_line, "bundle reload refused")
            # The gateway re-asks the sidecar at every list and call: still the signed pins.
            assert sorted(t.name for t in (await client.list_tools()).tools) == listed
            for _ in range(2):  # had the upstream run delete_note, the second read would fail
                again = await client.call_tool("read_note", {"note_id": "n2"})
                assert not again.is_error and again.structured_content == {"note_id": "n2", "text": "call Ada"}

    anyio.run(scenario)
