"""The `upstreams` and `oauth` sections of the gateway's configuration file.

    upstreams:
      notes:                         # the name tool files give in `mcp.upstream`
        command: [python, -m, examples.mcp_gateway.upstream]   # stdio
        prefix: ""                   # the catalog names of its tools start with it
      crm:
        url: https://crm.internal/mcp                           # Streamable HTTP
        mode: legacy                 # auto (default: either protocol era) or legacy
        execution_timeout_seconds: 60                           # default: the gateway's (30)
        tool_timeouts: {export_all: 300}                        # by upstream tool name
        # prefix defaults to the name and two underscores: crm__lookup_customer
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any

from toolauthz.clock import SystemClock
from toolauthz.display.escape import display
from toolauthz.errors import KeyFileError, RequestError
from toolauthz.files.tools import UPSTREAM_NAME
from toolauthz.identity.jwks import ASYMMETRIC_ALGORITHMS, RemoteJwks, RemoteSettings
from toolauthz.mcp_proxy.auth import ResourceServer
from toolauthz.mcp_proxy.upstreams import UpstreamSpec
from toolauthz.model import TOOL_NAME

__all__ = ["upstream_specs", "resource_server", "seconds_of"]

_PREFIX = re.compile(r"^([a-z][a-z0-9_]{0,31})?\Z")  # a catalog name starts with it
_KEYS = {"url", "command", "prefix", "mode", "execution_timeout_seconds", "tool_timeouts"}
MAX_EXECUTION_SECONDS = 24 * 3600.0


def seconds_of(raw: Any, where: str) -> float:
    """A positive number of seconds, at most a day; RequestError naming `where` otherwise."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not 0 < raw <= MAX_EXECUTION_SECONDS:
        raise RequestError(f"{where} must be a number of seconds above 0 and at most {int(MAX_EXECUTION_SECONDS)}")
    return float(raw)


def _tool_timeouts(name: str, raw: Any) -> dict[str, float]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise RequestError(f"upstreams.{name}.tool_timeouts must map upstream tool names to seconds")
    timeouts: dict[str, float] = {}
    for tool, seconds in raw.items():
        if not isinstance(tool, str) or not TOOL_NAME.fullmatch(tool):
            raise RequestError(f"upstreams.{name}.tool_timeouts: `{display(str(tool)[:128])}` is not a tool name")
        timeouts[tool] = seconds_of(seconds, f"upstreams.{name}.tool_timeouts.{tool}")
    return timeouts


def upstream_specs(raw: Any) -> list[UpstreamSpec]:
    """The upstreams of the configuration; RequestError naming the first problem."""
    if not isinstance(raw, Mapping) or not raw:
        raise RequestError("`upstreams` must map each upstream's name to its `url` or `command`")
    return [_spec(name, entry) for name, entry in raw.items()]


def _spec(name: Any, entry: Any) -> UpstreamSpec:
    from mcp import StdioServerParameters

    if not isinstance(name, str) or not UPSTREAM_NAME.fullmatch(name):
        raise RequestError(f"upstream name {name!r}: a-z 0-9 _ -, 1 to 32 characters, starting with a letter")
    if not isinstance(entry, Mapping):
        raise RequestError(f"upstreams.{name} must be a mapping with `url` or `command`")
    unknown = sorted(set(entry) - _KEYS)
    if unknown:
        raise RequestError(f"upstreams.{name}: unknown key `{unknown[0]}`")
    prefix = entry.get("prefix", name.replace("-", "_") + "__")
    if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
        raise RequestError(f"upstreams.{name}.prefix must be empty or start a tool name (a-z, 0-9, _)")
    mode = entry.get("mode", "auto")
    if mode not in ("auto", "legacy"):
        raise RequestError(f"upstreams.{name}.mode must be `auto` or `legacy`")
    url, command = entry.get("url"), entry.get("command")
    if (url is None) == (command is None):
        raise RequestError(f"upstreams.{name} needs exactly one of `url` and `command`")
    target: Any
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise RequestError(f"upstreams.{name}.url must be an http:// or https:// URL")
        target = url
    else:
        words = command.split() if isinstance(command, str) else command
        if not isinstance(words, list) or not words or not all(isinstance(w, str) and w for w in words):
            raise RequestError(f"upstreams.{name}.command must be a command line (a list of words)")
        target = StdioServerParameters(command=words[0], args=words[1:], env=dict(os.environ))
    timeout = entry.get("execution_timeout_seconds")
    return UpstreamSpec(name, target, prefix=prefix, mode=mode,
                        execution_timeout=None if timeout is None else seconds_of(
                            timeout, f"upstreams.{name}.execution_timeout_seconds"),
                        tool_timeouts=_tool_timeouts(name, entry.get("tool_timeouts")))


_OAUTH_KEYS = {"resource", "issuer", "jwks_uri", "discovery", "ca_file", "algorithms", "principal_claim",
               "principal_type", "tenant_claim", "tenant", "leeway_seconds", "scopes_supported",
               "refresh_interval_seconds", "max_age_seconds"}


def resource_server(raw: Any) -> ResourceServer:
    """The `oauth` section: the gateway as an OAuth resource server (see mcp_proxy/auth.py).

        oauth:
          resource: https://tools.example/mcp     # the tokens' audience
          issuer: https://idp.example             # their `iss`
          jwks_uri: https://idp.example/jwks      # or `discovery: true`
          tenant: acme                            # or tenant_claim: org
          principal_claim: sub                    # default; principal_type: User
    """
    if not isinstance(raw, Mapping):
        raise RequestError("`oauth` must be a mapping (resource, issuer, jwks_uri, tenant...)")
    unknown = sorted(set(raw) - _OAUTH_KEYS)
    if unknown:
        raise RequestError(f"oauth: unknown key `{unknown[0]}`")
    issuer = raw.get("issuer")
    if not isinstance(issuer, str) or not issuer.startswith("https://"):
        raise RequestError("oauth.issuer must be the authorization server's https:// URL")
    remote: dict[str, Any] = {"issuer": issuer} if raw.get("discovery") is True else {"jwks_uri": raw.get("jwks_uri")}
    for key in ("refresh_interval_seconds", "max_age_seconds"):
        if key in raw:
            remote[key] = raw[key]
    try:
        ca_file = raw.get("ca_file")
        keys = RemoteJwks(RemoteSettings(**remote, ca_file=pathlib.Path(ca_file) if ca_file else None),
                          SystemClock())
        algorithms = raw.get("algorithms", ["RS256", "ES256", "EdDSA"])
        if not isinstance(algorithms, list) or not algorithms or not set(algorithms) <= set(ASYMMETRIC_ALGORITHMS):
            raise ValueError(f"oauth.algorithms must list some of {', '.join(ASYMMETRIC_ALGORITHMS)}")
        scopes = raw.get("scopes_supported", [])
        if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
            raise ValueError("oauth.scopes_supported must list scope names")
        return ResourceServer(resource=str(raw.get("resource") or ""), issuer=issuer, keys=keys,
                              algorithms=tuple(algorithms), principal_claim=str(raw.get("principal_claim", "sub")),
                              principal_type=str(raw.get("principal_type", "User")),
                              tenant_claim=raw.get("tenant_claim"), tenant=raw.get("tenant"),
                              leeway_seconds=int(raw.get("leeway_seconds", 30)), scopes_supported=tuple(scopes))
    except (KeyFileError, ValueError, TypeError) as exc:
        raise RequestError(str(exc)) from None
