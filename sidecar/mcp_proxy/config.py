"""The `upstreams` section of the gateway's configuration file.

    upstreams:
      notes:                         # the name tool files give in `mcp.upstream`
        command: [python, -m, examples.mcp_gateway.upstream]   # stdio
        prefix: ""                   # the catalog names of its tools start with it
      crm:
        url: https://crm.internal/mcp                           # Streamable HTTP
        mode: legacy                 # auto (default: either protocol era) or legacy
        # prefix defaults to the name and two underscores: crm__lookup_customer
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from sidecar.errors import RequestError
from sidecar.mcp_proxy.upstreams import UpstreamSpec
from sidecar.tool_files import UPSTREAM_NAME

__all__ = ["upstream_specs"]

_PREFIX = re.compile(r"^([a-z][a-z0-9_]{0,31})?\Z")  # a catalog name starts with it
_KEYS = {"url", "command", "prefix", "mode"}


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
    return UpstreamSpec(name, target, prefix=prefix, mode=mode)
