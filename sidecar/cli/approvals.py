"""`toolauthz approvals ...`: the approving person's view of the Approvals service, through
the SDK client. The approver's identity is given explicitly (`--as`, `--tenant`); in a real
deployment the approval tool takes it from its own authenticated session.

Every string an approval carries came from a model (the resource id, the arguments) or
a runtime (the requester, the tenant, a reason): each is printed escaped, so that no
newline, escape sequence, invisible or reordering character, or quote can forge a line
or a field that a person reads before approving.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable

from sidecar.client import AuthzClient, Principal, TrustedContext
from sidecar.proto.toolauthz.v1 import approvals_pb2 as apb
from sidecar.proto.toolauthz.v1 import authorizer_pb2 as pb

SERVER_ENV = "TOOLAUTHZ_SERVER"
DEFAULT_SERVER = "127.0.0.1:50051"
RPC_TIMEOUT = 10.0
# The proto enum is the one list of statuses: PENDING -> `pending`, ...
_STATUSES = [name.lower() for name in apb.ApprovalStatus.keys() if name != "APPROVAL_STATUS_UNSPECIFIED"]
_NAMED_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
# A Cedar uid, `Type::"id"` (namespaced types too): the id is shown escaped between quotes.
_UID = re.compile(r'^([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)::"(.*)"$', re.DOTALL)


def _code_point(char: str) -> str:
    number = ord(char)
    if number < 0x100:
        return f"\\x{number:02x}"
    return f"\\u{number:04x}" if number < 0x10000 else f"\\U{number:08x}"


def _shown(value: str) -> str:
    """`value` as a terminal can show it safely: every character that is not printable
    (controls and ESC, line and paragraph separators, zero-width and bidi controls, ...)
    as its code, and quotes and backslashes escaped, so a value cannot end its field."""
    return "".join(_NAMED_ESCAPES.get(c) or (c if c.isprintable() else _code_point(c)) for c in value)


def _shown_uid(uid: str) -> str:
    match = _UID.match(uid)
    if match is None:
        return _shown(uid)
    return f'{match.group(1)}::"{_shown(match.group(2))}"'


def _shown_principal(principal: pb.Principal) -> str:
    return f'{_shown(principal.type)}::"{_shown(principal.id)}"'


def _shown_json(text: str) -> str:
    """JSON keeps its own quotes (a JSON string escapes the ones it holds); anything that
    is not JSON is shown like any other value."""
    try:
        value = json.loads(text)
    except ValueError:
        return _shown(text)
    dumped = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return "".join(c if c.isprintable() else _code_point(c) for c in dumped)


def _status(a: apb.Approval) -> str:
    return apb.ApprovalStatus.Name(a.status).lower()


def add_approvals_command(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                          parse_principal: Callable[[str], object]) -> None:
    server_help = f"the sidecar's Approvals address (default: ${SERVER_ENV}, else {DEFAULT_SERVER})"
    approvals = sub.add_parser("approvals", help="list, show, approve or reject pending approvals")
    approvals.add_argument("--server", default=None, help=server_help)
    verbs = approvals.add_subparsers(dest="approvals_command", required=True)
    listing = verbs.add_parser("list")
    verb_parsers = [listing]
    listing.add_argument("--tenant", default="")
    listing.add_argument("--status", choices=_STATUSES, default="pending")
    listing.add_argument("--group", default="")
    show = verbs.add_parser("show")
    show.add_argument("approval_id")
    verb_parsers.append(show)
    for verb in ("approve", "reject"):
        decide = verbs.add_parser(verb)
        decide.add_argument("approval_id")
        decide.add_argument("--as", dest="approver", required=True, type=parse_principal, help='e.g. User::"bob"')
        decide.add_argument("--tenant", required=True)
        decide.add_argument("--reason", default="", required=verb == "reject")
        verb_parsers.append(decide)
    for verb_parser in verb_parsers:
        # Also after the verb; SUPPRESS keeps a value given before it when this one is absent.
        verb_parser.add_argument("--server", default=argparse.SUPPRESS, help=server_help)
    approvals.set_defaults(func=run)


def describe(a: apb.Approval) -> str:
    lines = [
        f"approval   {_shown(a.approval_id)}  [{_status(a)}]",
        f"code       {_shown(a.short_code)}   (compare with the requester's screen)",
        f"tool       {_shown(a.tool)} on {_shown_uid(a.resource)}",
        f"requester  {_shown_principal(a.requester)} in tenant {_shown(a.tenant)}",
        f"arguments  {_shown_json(a.arguments_json)}  (other fields: digest {_shown(a.digest[:16])}...)",
        f"group      {_shown(a.group)}  (policy {_shown(a.policy_id)})",
        f"expires    {a.expires_at.ToDatetime().isoformat()}Z",
    ]
    if a.approver.id:
        lines.append(f"decided by {_shown_principal(a.approver)}  {_shown(a.reason)}")
    return "\n".join(lines)


def summary(a: apb.Approval) -> str:
    """One line of `approvals list`."""
    return (f"{_shown(a.approval_id)}  {_shown(a.short_code)}  {_status(a):8}  {_shown(a.tenant)}  {_shown(a.tool)}  "
            f"{_shown_uid(a.resource)}  {_shown_principal(a.requester)}  {_shown_json(a.arguments_json)}")


def server_address(args: argparse.Namespace) -> str:
    """`--server` (before or after the verb), else $TOOLAUTHZ_SERVER, else the default."""
    return args.server or os.environ.get(SERVER_ENV) or DEFAULT_SERVER


def run(args: argparse.Namespace) -> int:
    with AuthzClient(server_address(args), timeout=RPC_TIMEOUT) as client:
        if args.approvals_command == "list":
            for approval in client.list_approvals(tenant=args.tenant, status=args.status, group=args.group):
                print(summary(approval))
            return 0
        if args.approvals_command == "show":
            print(describe(client.get_approval(args.approval_id)))
            return 0
        try:
            approver = TrustedContext(args.tenant, Principal(args.approver.type, args.approver.id), "cli")
        except ValueError as exc:
            print(f"toolauthz: invalid_argument: {_shown(str(exc))}", file=sys.stderr)
            return 1
        print(describe(client.decide_approval(args.approval_id, approver, args.approvals_command, args.reason)))
        return 0
