"""Command-line options shared by a command and its verbs."""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from toolauthz.display.escape import shown
from toolauthz.model import PRINCIPAL_ID, Principal


def add_anywhere(command: argparse.ArgumentParser, verbs: Iterable[argparse.ArgumentParser], flag: str,
                 **options: Any) -> None:
    """`flag` on `command` and on each of its `verbs`, so that `toolauthz audit --data-dir X
    verify` and `toolauthz audit verify --data-dir X` mean the same. The verbs' copy has no
    default of its own: given after the verb it wins, absent it leaves the command's value."""
    command.add_argument(flag, **options)
    verb_options = {key: value for key, value in options.items() if key != "default"}
    for verb in verbs:
        verb.add_argument(flag, **verb_options, default=argparse.SUPPRESS)


# TLS to a sidecar: the CA of its certificate, and this client's certificate and key.
TLS_HELP = {"ca": "PEM file of the CA that signed the sidecar's certificate (TLS)",
            "cert": "PEM file of this client's certificate (mTLS)", "key": "PEM file of this client's key (mTLS)"}
TLS_ENV = {"ca": "TOOLAUTHZ_CA", "cert": "TOOLAUTHZ_CERT", "key": "TOOLAUTHZ_KEY"}


def add_server_options(command: argparse.ArgumentParser, verbs: Iterable[argparse.ArgumentParser],
                       server_help: str) -> None:
    """`--server` and the TLS files (`--ca`, `--cert`, `--key`), before or after the verb."""
    verbs = list(verbs)
    add_anywhere(command, verbs, "--server", default=None, help=server_help)
    for name, env in TLS_ENV.items():
        add_anywhere(command, verbs, f"--{name}", default=None, help=f"{TLS_HELP[name]}; default ${env}")


_QUOTED_PRINCIPAL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)::"(.*)"', re.DOTALL)
_BARE_PRINCIPAL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)::(.*)", re.DOTALL)


def parse_principal(text: str) -> Principal:
    """`User::"alice"` as Cedar writes it, or `User::alice` where that is unambiguous:
    the bare id is a valid principal id, so it holds no quote, space or control character
    for a shell or a reader to misread."""
    quoted = _QUOTED_PRINCIPAL.fullmatch(text)
    if quoted:
        return Principal(quoted.group(1), quoted.group(2))
    bare = _BARE_PRINCIPAL.fullmatch(text)
    if bare and PRINCIPAL_ID.fullmatch(bare.group(2)):
        return Principal(bare.group(1), bare.group(2))
    raise argparse.ArgumentTypeError(f'principal must look like `User::"alice"` or `User::alice`, not `{shown(text)}`')


def resource_filter(text: str) -> str:
    """An audit filter on the resource as records hold it, `Order::"ord_1"`; `Order::ord_1`
    is read as that too. A resource id is whatever the tool's input held, so any id is taken."""
    if _QUOTED_PRINCIPAL.fullmatch(text):
        return text
    bare = _BARE_PRINCIPAL.fullmatch(text)
    if bare and '"' not in bare.group(2):
        return f'{bare.group(1)}::"{bare.group(2)}"'
    raise argparse.ArgumentTypeError(f'resource must look like `Order::"ord_1"` or `Order::ord_1`, not `{shown(text)}`')


def principal_filter(text: str) -> str:
    """An audit filter on the principal, in the form the audit trail records it."""
    return str(parse_principal(text))


def moment(text: str) -> float:
    """`7d` (that long ago) or an ISO 8601 moment, as Unix seconds."""
    from toolauthz.bundle.tool_fields import parse_duration

    ago = parse_duration(text)
    if ago is not None:
        return time.time() - ago
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"`{shown(text)}` is neither a duration such as `7d` nor an ISO 8601 "
                                         "date or time") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()
