"""`toolauthz mcp-proxy` and `toolauthz catalog import-mcp`.

    toolauthz mcp-proxy --tenant acme --principal User::alice --bundle DIR -- python -m some.server
    toolauthz mcp-proxy --config proxy.yaml --listen http://127.0.0.1:8808 https://tools.example/mcp
    toolauthz catalog import-mcp --bundle DIR [--force] -- python -m some.server

The upstream is the words after the options: a URL (Streamable HTTP) or a command line
(stdio). Logs go to stderr: on stdio, stdout carries the MCP protocol.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import urllib.parse
from collections.abc import Callable
from typing import Any

import anyio
import yaml

from toolauthz.cli.approvals import DEFAULT_SERVER, SERVER_ENV
from toolauthz.display.escape import display
from toolauthz.errors import RequestError
from toolauthz.files.tools import UPSTREAM_NAME
from toolauthz.service.loopback import is_loopback_host


def add_mcp_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                     parse_principal: Callable[[str], Any]) -> None:
    proxy = sub.add_parser("mcp-proxy", help="an MCP server that guards one upstream MCP server's tools")
    proxy.add_argument("--config", help="YAML: bundle, sidecar, tenant, principal, listen, approval_wait_seconds, "
                                        "upstream or upstreams (flags win)")
    proxy.add_argument("--bundle", help="the bundle whose tools/ pins the upstream tools (default policies)")
    proxy.add_argument("--sidecar", help=f"the sidecar's address (default ${SERVER_ENV}, else {DEFAULT_SERVER})")
    proxy.add_argument("--tenant")
    proxy.add_argument("--principal", type=parse_principal, help="who every call acts for, e.g. User::alice")
    proxy.add_argument("--listen", help="stdio (default) or http://127.0.0.1:PORT (loopback only)")
    proxy.add_argument("--approval-wait", type=float, dest="approval_wait_seconds",
                       help="seconds a call waits for a person's approval (default 0: answer with the approval id)")
    proxy.add_argument("--execution-timeout", type=float, dest="execution_timeout_seconds",
                       help="seconds an upstream tool call may take (default 30; per upstream and tool in --config)")
    proxy.add_argument("--allowed-host", action="append", dest="allowed_hosts", metavar="HOST[:PORT]",
                       help="HTTP: a Host name answered besides the listen address (repeatable)")
    proxy.add_argument("upstream", nargs=argparse.REMAINDER, help="a URL, or the command that starts the server")
    proxy.set_defaults(func=run_proxy, parse_principal=parse_principal)

    catalog = sub.add_parser("catalog", help="tool catalog helpers")
    verbs = catalog.add_subparsers(dest="catalog_command", required=True)
    importer = verbs.add_parser("import-mcp", help="write tools/<name>.yaml drafts from an MCP server's tools/list")
    importer.add_argument("--bundle", default="policies")
    importer.add_argument("--force", action="store_true",
                          help="overwrite tool files that exist (default: merge, keeping what a person wrote)")
    # The option and the positional server need two destinations: sharing one, the
    # positional list overwrote the option's name.
    importer.add_argument("--upstream", dest="upstream_name", metavar="NAME",
                          help="bind the tools to this upstream of the gateway (mcp.upstream)")
    importer.add_argument("--prefix", help="the catalog names' prefix (default with --upstream: NAME__)")
    importer.add_argument("server", nargs=argparse.REMAINDER, metavar="upstream",
                          help="a URL, or the command that starts the server")
    importer.set_defaults(func=run_import)


def upstream_target(words: list[str]) -> Any:
    """A URL string or StdioServerParameters; RequestError when there is none."""
    from mcp import StdioServerParameters

    words = words[1:] if words[:1] == ["--"] else words
    if not words:
        raise RequestError("name the upstream MCP server: a URL or a command line")
    if len(words) == 1 and words[0].startswith(("http://", "https://")):
        return words[0]
    return StdioServerParameters(command=words[0], args=words[1:], env=dict(os.environ))


def loopback_http(listen: str) -> tuple[str, int]:
    """(host, port) of `http://HOST:PORT` with a loopback host; RequestError otherwise.
    Downstream HTTP takes the identity from the configuration, so it must not be reachable
    by anyone but this machine until callers are authenticated."""
    url = urllib.parse.urlsplit(listen)
    host = url.hostname or ""
    try:
        port = url.port
    except ValueError:
        port = None
    loopback = is_loopback_host(host)
    if url.scheme != "http" or not loopback or port is None:
        raise RequestError("--listen must be `stdio` or http://127.0.0.1:PORT (loopback only)")
    return host, port


def any_http(listen: str) -> tuple[str, int]:
    """(host, port) of `http://HOST:PORT`: with `oauth`, every caller proves who they are,
    so the gateway may listen beyond loopback (put TLS in front of it)."""
    url = urllib.parse.urlsplit(listen)
    try:
        port = url.port
    except ValueError:
        port = None
    if url.scheme != "http" or not url.hostname or port is None:
        raise RequestError("--listen must be `stdio` or http://HOST:PORT")
    return url.hostname, port


_CONFIG_KEYS = {"bundle", "sidecar", "tenant", "principal", "listen", "approval_wait_seconds",
                "execution_timeout_seconds", "allowed_hosts", "upstream", "upstreams", "oauth"}


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if args.config:
        loaded = yaml.safe_load(pathlib.Path(args.config).read_text(encoding="utf-8"))
        if not isinstance(loaded, dict):
            raise RequestError("the proxy's config must be a mapping")
        unknown = sorted(str(key) for key in set(loaded) - _CONFIG_KEYS)
        if unknown:  # a misspelt key must not fall back to a default silently
            raise RequestError(f"the proxy's config: unknown key `{display(unknown[0][:64])}`")
        config = loaded
    for key in ("bundle", "sidecar", "tenant", "principal", "listen", "approval_wait_seconds",
                "execution_timeout_seconds", "allowed_hosts"):
        value = getattr(args, key)
        if value is not None:
            config[key] = value
    if args.upstream:
        config["upstream"] = args.upstream
    if isinstance(config.get("principal"), str):
        config["principal"] = args.parse_principal(config["principal"])
    return config


def _oauth(raw: Any) -> Any:
    """The `oauth` section; `oauth: off` (or false) is development without sign-in, which
    the listen check then allows on loopback only."""
    from toolauthz.mcp_proxy.config import resource_server

    if raw is None or raw is False or raw == "off":
        return None
    return resource_server(raw)


def run_proxy(args: argparse.Namespace) -> int:
    from toolauthz.client import Principal
    from toolauthz.mcp_proxy.config import seconds_of, upstream_specs
    from toolauthz.mcp_proxy.hosts import check_allowed_hosts
    from toolauthz.mcp_proxy.proxy import ProxySettings
    from toolauthz.mcp_proxy.upstreams import UpstreamSpec

    config = _settings(args)
    upstream = config.get("upstream")
    if upstream or "upstreams" not in config:
        targets = [UpstreamSpec("default", upstream_target([upstream] if isinstance(upstream, str)
                                                          else list(upstream or [])))]
    else:
        targets = upstream_specs(config["upstreams"])
    principal = config.get("principal")
    listen = str(config.get("listen") or "stdio")
    oauth = _oauth(config.get("oauth"))
    http = None if listen == "stdio" else (any_http(listen) if oauth is not None else loopback_http(listen))
    settings = ProxySettings(bundle=pathlib.Path(config.get("bundle") or "policies"),
                             tenant=str(config["tenant"]) if config.get("tenant") else None,
                             principal=Principal(principal.type, principal.id) if principal is not None else None,
                             approval_wait_seconds=_approval_wait(config.get("approval_wait_seconds", 0)),
                             execution_timeout=seconds_of(config.get("execution_timeout_seconds", 30.0),
                                                          "execution_timeout_seconds"),
                             downstream="stdio" if http is None else "http", oauth=oauth,
                             allowed_hosts=check_allowed_hosts(config.get("allowed_hosts")))
    settings.configured_caller()  # RequestError when the identity is missing
    sidecar = str(config.get("sidecar") or os.environ.get(SERVER_ENV) or DEFAULT_SERVER)
    listener = _bound(*http) if http is not None else None  # a port in use fails here, before anything starts
    try:
        anyio.run(_serve, settings, sidecar, targets, listener)
    except BaseExceptionGroup as group:  # the task groups wrap a failure of one part: say which
        raise _innermost(group) from None
    return 0


def _approval_wait(raw: Any) -> float:
    from toolauthz.mcp_proxy.config import MAX_EXECUTION_SECONDS

    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 <= raw <= MAX_EXECUTION_SECONDS:
        raise RequestError(f"approval_wait_seconds must be 0 or a number of seconds up to {int(MAX_EXECUTION_SECONDS)}")
    return float(raw)


def _bound(host: str, port: int) -> Any:
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RequestError(f"--listen http://{host}:{port}: {exc.strerror or exc}") from None
    return sock


def _innermost(group: BaseExceptionGroup[Any]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def _serve(settings: Any, sidecar: str, targets: list[Any], listener: Any) -> None:
    from mcp.server.stdio import stdio_server

    from toolauthz.client import AsyncAuthzClient
    from toolauthz.mcp_proxy.proxy import McpProxy

    authz = AsyncAuthzClient(sidecar, transport_label="mcp")  # its decisions count as `transport="mcp"`
    proxy = McpProxy(settings, authz)
    try:
        async with proxy.connected(*targets):
            if listener is None:
                async with stdio_server() as (read_stream, write_stream):
                    await proxy.server.run(read_stream, write_stream, proxy.server.create_initialization_options())
            else:
                await _serve_http(proxy, listener)
    finally:
        await authz.close()


async def _serve_http(proxy: Any, sock: Any) -> None:
    """Serves the proxy's HTTP app on the bound socket and says where on stderr, once it
    accepts connections: `listening on http://HOST:PORT/mcp`."""
    import socket

    import uvicorn

    host, port = sock.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host

    class AnnouncingServer(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print(f"toolauthz mcp-proxy: listening on http://{shown_host}:{port}/mcp", file=sys.stderr, flush=True)

    await AnnouncingServer(uvicorn.Config(proxy.http_app(host), log_level="warning")).serve(sockets=[sock])


def run_import(args: argparse.Namespace) -> int:
    from toolauthz.mcp_proxy.importer import list_upstream_tools, write_drafts

    upstream = args.upstream_name
    if upstream is not None and not UPSTREAM_NAME.fullmatch(upstream):
        raise RequestError(f"--upstream `{display(upstream)}`: a-z 0-9 _ -, 1 to 32 characters, starting with a letter")
    target = upstream_target(list(args.server))
    try:
        tools = anyio.run(list_upstream_tools, target)
    except Exception as exc:  # noqa: BLE001 - the upstream's failure, named: never a traceback, no file written
        raise RequestError(f"could not list the tools of the upstream MCP server ({_reason(exc)})") from None
    prefix = args.prefix if args.prefix is not None else (upstream.replace("-", "_") + "__" if upstream else "")
    kept = write_drafts(pathlib.Path(args.bundle), tools, sys.stdout, force=args.force, upstream=upstream,
                        prefix=prefix)
    return 1 if kept else 0


def _reason(exc: BaseException) -> str:
    """The innermost cause of a failed connection, one line: a task group wraps it."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {display(text[:200])}" if text else type(exc).__name__
