"""`toolauthz catalog import-mcp` and `toolauthz mcp-proxy` as a user runs them: the
installed console script in a subprocess, the official MCP client (default mode) on the
other side, the example's notes server upstream over stdio and over HTTP."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import anyio
import httpx2 as httpx
import pytest
import yaml
from conftest import calls_audited
from mcp import Client, StdioServerParameters
from mcp_support import ROOT, example_bundle, start, stop, text

from toolauthz.audit.store import AuditQuery
from toolauthz.mcp_proxy.pins import load_pins

TOOLAUTHZ = str(pathlib.Path(sys.executable).parent / "toolauthz")  # the console script of this venv
UPSTREAM = [sys.executable, "-m", "examples.mcp_gateway.upstream"]
bundle_dir = example_bundle  # the sidecar (conftest) and the gateway load a copy of the example bundle


def toolauthz(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOLAUTHZ, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.fixture
def http_upstream() -> Iterator[str]:
    """The notes server over Streamable HTTP on a free loopback port: its URL."""
    running = start([*UPSTREAM, "--http", "127.0.0.1:0"], "listening on", output="stdout")
    try:
        yield running.wait_for_line().split()[-1]
    finally:
        stop(running)


# -- catalog import-mcp ---------------------------------------------------------------


def test_import_mcp_from_a_stdio_upstream_without_upstream_name(tmp_path):
    done = toolauthz("catalog", "import-mcp", "--bundle", str(tmp_path), "--", *UPSTREAM)
    assert done.returncode == 0, done.stderr
    assert "wrote: tools/read_note.yaml" in done.stdout
    pins = load_pins(tmp_path)
    assert sorted(pins) == ["delete_note", "export_all_notes", "read_note"]
    assert pins["read_note"].upstream is None and pins["read_note"].side_effect == "read"


def test_import_mcp_from_an_http_upstream_with_upstream_name(tmp_path, http_upstream):
    done = toolauthz("catalog", "import-mcp", "--bundle", str(tmp_path), "--upstream", "notes", http_upstream)
    assert done.returncode == 0, done.stderr
    pins = load_pins(tmp_path)
    assert sorted(pins) == ["notes__delete_note", "notes__export_all_notes", "notes__read_note"]
    assert {(p.upstream, p.upstream_name) for p in pins.values()} == {
        ("notes", "read_note"), ("notes", "delete_note"), ("notes", "export_all_notes")}
    draft = yaml.safe_load((tmp_path / "tools" / "notes__delete_note.yaml").read_text())
    assert draft["mcp"]["upstream"] == "notes" and draft["side_effect"] == "delete"


def test_import_mcp_again_merges_and_says_unchanged(tmp_path, http_upstream):
    assert toolauthz("catalog", "import-mcp", "--bundle", str(tmp_path), http_upstream).returncode == 0
    again = toolauthz("catalog", "import-mcp", "--bundle", str(tmp_path), http_upstream)
    assert again.returncode == 0 and again.stdout.count("unchanged: tools/") == 3


@pytest.mark.parametrize("argv, says", [
    (["http://127.0.0.1:9/mcp"], "could not list the tools of the upstream MCP server (ConnectError"),
    (["--", "/nonexistent/server"], "could not list the tools of the upstream MCP server (FileNotFoundError"),
    (["--upstream", "Not a name", "--", *UPSTREAM], "--upstream `Not a name`: a-z 0-9 _ -"),
    ([], "name the upstream MCP server: a URL or a command line"),
])
def test_import_mcp_errors_are_one_line_and_write_nothing(tmp_path, argv, says):
    done = toolauthz("catalog", "import-mcp", "--bundle", str(tmp_path / "b"), *argv)
    assert done.returncode == 1
    assert says in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "b" / "tools").exists() or not any((tmp_path / "b" / "tools").iterdir())


# -- mcp-proxy ---------------------------------------------------------------------------


def proxy_argv(bundle: pathlib.Path, port: int, *extra: str) -> list[str]:
    return ["mcp-proxy", "--bundle", str(bundle), "--sidecar", f"127.0.0.1:{port}", "--tenant", "acme",
            "--principal", "User::alice", *extra]


def test_mcp_proxy_over_stdio_with_the_official_client(server, bundle_dir):
    _srv, port = server
    gateway = StdioServerParameters(command=TOOLAUTHZ, args=[*proxy_argv(bundle_dir, port), "--", *UPSTREAM],
                                    env=dict(os.environ), cwd=str(ROOT))

    async def main() -> None:
        async with Client(gateway, cache=None) as client:
            listed = await client.list_tools()
            assert sorted(t.name for t in listed.tools) == ["delete_note", "read_note"]
            read = await client.call_tool("read_note", {"note_id": "n1"})
            assert not read.is_error and read.structured_content == {"note_id": "n1", "text": "buy milk"}
            sealed = await client.call_tool("read_note", {"note_id": "a1"})
            assert sealed.is_error and (sealed.meta or {}).get("io.toolauthz/code") == "denied"
            assert "archived-notes-are-sealed" in text(sealed)

    anyio.run(main)


@pytest.mark.parametrize("argv, says", [
    (["--listen", "http://0.0.0.0:8808"], "--listen must be `stdio` or http://127.0.0.1:PORT (loopback only)"),
    (["--execution-timeout", "0"], "execution_timeout_seconds must be a number of seconds above 0"),
    (["--allowed-host", "*.example"], "allowed_hosts: `*.example` is not a host name"),
    (["--approval-wait", "-1"], "approval_wait_seconds must be 0 or a number of seconds up to 86400"),
])
def test_mcp_proxy_refuses_a_bad_configuration_before_serving(bundle_dir, argv, says):
    done = toolauthz(*proxy_argv(bundle_dir, 9, *argv), "--", *UPSTREAM)
    assert done.returncode == 1 and says in done.stderr and "Traceback" not in done.stderr


def test_a_listen_port_in_use_is_one_line(bundle_dir):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = toolauthz(*proxy_argv(bundle_dir, 9, "--listen", f"http://127.0.0.1:{port}"), "--", *UPSTREAM)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"toolauthz: --listen http://127.0.0.1:{port}: Address already in use" in done.stderr


def test_a_misspelt_configuration_key_is_refused(bundle_dir, tmp_path):
    config = tmp_path / "gateway.yaml"
    config.write_text("execution_timeout: 5\ntenant: acme\nprincipal: User::alice\n")
    done = toolauthz("mcp-proxy", "--config", str(config), "--bundle", str(bundle_dir), "--", *UPSTREAM)
    assert done.returncode == 1 and "unknown key `execution_timeout`" in done.stderr


def test_oauth_off_is_for_loopback_only(bundle_dir, tmp_path):
    config = tmp_path / "gateway.yaml"
    config.write_text("oauth: off\nlisten: http://192.0.2.1:8808\ntenant: acme\nprincipal: User::alice\n")
    done = toolauthz("mcp-proxy", "--config", str(config), "--bundle", str(bundle_dir), "--", *UPSTREAM)
    assert done.returncode == 1 and "loopback only" in done.stderr


# -- DNS rebinding ----------------------------------------------------------------------


def test_a_rebinding_host_is_refused_on_127_0_0_2(server, bundle_dir):
    _srv, port = server
    running = start([TOOLAUTHZ, *proxy_argv(bundle_dir, port, "--listen", "http://127.0.0.2:0",
                                            "--allowed-host", "gateway.test"), "--", *UPSTREAM], "listening on")
    try:
        url = running.wait_for_line().split()[-1]
        assert url.startswith("http://127.0.0.2:") and url.endswith("/mcp")
        netloc = url.split("/")[2]
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "read_note", "arguments": {"note_id": "n1"}}}
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        for host, refused in [("rebind.attacker.example", True), (f"rebind.attacker.example:{netloc[10:]}", True),
                              ("127.0.0.1" + netloc[9:], True), (netloc, False), ("gateway.test", False),
                              (f"gateway.test:{netloc.split(':')[1]}", False)]:
            answer = httpx.post(url, json=body, headers={**headers, "host": host}, timeout=30)
            assert (answer.status_code == 421) == refused, (host, answer.status_code)

        async def main() -> None:
            async with Client(url, cache=None) as client:  # the official client, default mode
                read = await client.call_tool("read_note", {"note_id": "n1"})
                assert not read.is_error and read.structured_content == {"note_id": "n1", "text": "buy milk"}

        anyio.run(main)
    finally:
        stop(running)


def test_every_origin_but_the_gateways_own_is_refused(server, bundle_dir):
    _srv, port = server
    running = start([TOOLAUTHZ, *proxy_argv(bundle_dir, port, "--listen", "http://127.0.0.2:0"), "--", *UPSTREAM],
                    "listening on")
    try:
        url = running.wait_for_line().split()[-1]
        netloc = url.split("/")[2]
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        body = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
        evil = httpx.post(url, json=body, headers={**headers, "origin": "http://rebind.attacker.example"})
        assert evil.status_code == 403
        own = httpx.post(url, json=body, headers={**headers, "origin": f"http://{netloc}"})
        assert own.status_code not in (403, 421)
    finally:
        stop(running)


def test_a_refused_host_reaches_neither_the_sidecar_nor_the_upstream(server, sidecar, bundle_dir):
    """A rebinding `tools/call` is answered 421 before any MCP handling: the sidecar never
    hears of it (no audit record at all), while the same call with the right Host does."""
    _srv, port = server
    running = start([TOOLAUTHZ, *proxy_argv(bundle_dir, port, "--listen", "http://127.0.0.2:0"), "--", *UPSTREAM],
                    "listening on")
    try:
        url = running.wait_for_line().split()[-1]
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "read_note", "arguments": {"note_id": "n1"}}}
        headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        answer = httpx.post(url, json=body, headers={**headers, "host": "rebind.attacker.example"}, timeout=30)
        assert answer.status_code == 421
        assert calls_audited(sidecar) == []

        async def main() -> None:
            async with Client(url, cache=None) as client:
                assert not (await client.call_tool("read_note", {"note_id": "n1"})).is_error

        anyio.run(main)
        assert [r.event.tool for r in sidecar.audit_log.query(AuditQuery(kind="authorize"), limit=10)] == ["read_note"]
    finally:
        stop(running)


def test_host_rules_unit():
    from toolauthz.errors import RequestError
    from toolauthz.mcp_proxy.hosts import check_allowed_hosts, transport_security

    assert check_allowed_hosts(["Gateway.Internal", "10.0.0.5:8808", "[::1]"]) == (
        "gateway.internal", "10.0.0.5:8808", "[::1]")
    for bad in (["*"], ["evil.example/path"], ["a b"], ["x\n"], ["user@host"], "gateway.internal", [3]):
        with pytest.raises(RequestError):
            check_allowed_hosts(bad)
    rules = transport_security("127.0.0.2", ("gateway.internal",), "https://tools.example/mcp")
    assert rules.enable_dns_rebinding_protection
    assert {"127.0.0.2:*", "gateway.internal:*", "tools.example", "tools.example:*"} <= set(rules.allowed_hosts)
    assert not any(h.startswith(("localhost", "127.0.0.1")) for h in rules.allowed_hosts)  # not its address
    assert {"localhost:*", "[::1]:*"} <= set(transport_security("127.0.0.1").allowed_hosts)
    assert "[::1]:*" in transport_security("::1").allowed_hosts
