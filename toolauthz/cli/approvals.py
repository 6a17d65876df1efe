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
import sys
from collections.abc import Callable

from google.protobuf.json_format import MessageToDict

from toolauthz.cli.options import TLS_ENV, TLS_HELP
from toolauthz.cli.output import add_output_option, wants_json
from toolauthz.cli.table import table
from toolauthz.client import AuthzClient, ClientTls, Principal, TrustedContext
from toolauthz.display.escape import display, display_uid
from toolauthz.proto.toolauthz.v1 import approvals_pb2 as apb
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb

SERVER_ENV = "TOOLAUTHZ_SERVER"
ID_TOKEN_ENV = "TOOLAUTHZ_ID_TOKEN"
DEFAULT_SERVER = "127.0.0.1:50051"
RPC_TIMEOUT = 10.0
# The proto enum is the one list of statuses: PENDING -> `pending`, ...
_STATUSES = [name.lower() for name in apb.ApprovalStatus.keys() if name != "APPROVAL_STATUS_UNSPECIFIED"]


def _shown_principal(principal: pb.Principal) -> str:
    return f'{display(principal.type)}::"{display(principal.id)}"'


def _shown_json(text: str) -> str:
    """JSON keeps its own quotes (a JSON string escapes the ones it holds); its
    unprintable characters are still escaped."""
    return display(text, quotes=False)


def _status(a: apb.Approval) -> str:
    return apb.ApprovalStatus.Name(a.status).lower()


def add_approvals_command(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                          parse_principal: Callable[[str], object]) -> None:
    server_help = f"the sidecar's Approvals address (default: ${SERVER_ENV}, else {DEFAULT_SERVER})"
    approvals = sub.add_parser("approvals", help="list, show, approve or reject pending approvals")
    approvals.add_argument("--server", default=None, help=server_help)
    for name, env in TLS_ENV.items():
        approvals.add_argument(f"--{name}", default=None, help=f"{TLS_HELP[name]}; default ${env}")
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
        decide.add_argument("--id-token-file", default=None,
                            help=f"the deciding person's ID token, when the sidecar proves approvers by their "
                                 f"identity provider (default: ${ID_TOKEN_ENV})")
        verb_parsers.append(decide)
    for verb_parser in verb_parsers:
        add_output_option(verb_parser)
        # Also after the verb; SUPPRESS keeps a value given before it when this one is absent.
        verb_parser.add_argument("--server", default=argparse.SUPPRESS, help=server_help)
        for name, env in TLS_ENV.items():
            verb_parser.add_argument(f"--{name}", default=argparse.SUPPRESS, help=f"{TLS_HELP[name]}; default ${env}")
    approvals.set_defaults(func=run)


def _principal(p: pb.Principal) -> str:
    return f'{display(p.type)}::"{display(p.id)}"'


def describe(a: apb.Approval) -> str:
    """The approval as the approver reads it; every value escaped (toolauthz/display/escape.py):
    the resource id comes from the model and must not forge lines of this page."""
    lines = [
        f"approval   {display(a.approval_id)}  [{_status(a)}]",
        f"code       {display(a.short_code)}   (compare with the requester's screen)",
        f"tool       {display(a.tool)} on {display_uid(a.resource)}",
        f"requester  {_shown_principal(a.requester)} in tenant {display(a.tenant)}",
        f"arguments  {_shown_arguments(a)}  (other fields: digest {display(a.digest[:16])}...)",
        f"group      {display(a.group)}  (policy {display(a.policy_id)})",
        f"expires    {a.expires_at.ToDatetime().isoformat()}Z",
    ]
    if a.usage:  # the meters the call was decided on, before it
        lines.append("usage      " + "; ".join(f"{display(f.label)}: {display(f.value, quotes=False)}"
                                               for f in a.usage))
    if a.approver.id:
        lines.append(f"decided by {_shown_principal(a.approver)}  {display(a.reason)}")
    return "\n".join(lines)


LIST_HEADER = ("APPROVAL", "CODE", "STATUS", "EXPIRES", "TENANT", "TOOL", "RESOURCE", "REQUESTER", "ARGUMENTS")


def summary(a: apb.Approval) -> list[str]:
    """One row of `approvals list` (LIST_HEADER), every cell escaped."""
    return [display(a.approval_id), display(a.short_code), _status(a), _expires(a), display(a.tenant),
            display(a.tool), display_uid(a.resource), _shown_principal(a.requester), _shown_arguments(a)]


def _shown_arguments(a: apb.Approval) -> str:
    """The arguments as the tool's display hints render them (`Amount: 75.50 EUR`; the
    server has already escaped the values), else the allow-listed JSON."""
    if a.shown_fields:
        return "; ".join(f"{display(f.label)}: {display(f.value, quotes=False)}" for f in a.shown_fields)
    return _shown_json(a.arguments_json)


def _expires(a: apb.Approval) -> str:
    return f"{a.expires_at.ToDatetime().isoformat(timespec='seconds')}Z" if a.HasField("expires_at") else "-"


def server_address(args: argparse.Namespace) -> str:
    """`--server` (before or after the verb), else $TOOLAUTHZ_SERVER, else the default."""
    return args.server or os.environ.get(SERVER_ENV) or DEFAULT_SERVER


def client_tls(args: argparse.Namespace) -> ClientTls | None:
    """`--ca`, `--cert`, `--key` (before or after the verb), else $TOOLAUTHZ_CA, ...;
    None (plaintext) when none is given."""
    files = {name: getattr(args, name, None) or os.environ.get(env) or None for name, env in TLS_ENV.items()}
    if not any(files.values()):
        return None
    return ClientTls(ca=files["ca"], cert=files["cert"], key=files["key"])


def run(args: argparse.Namespace) -> int:
    try:
        tls = client_tls(args)
        client = AuthzClient(server_address(args), timeout=RPC_TIMEOUT, tls=tls)
    except (ValueError, OSError) as exc:
        print(f"toolauthz: {display(str(exc))}", file=sys.stderr)
        return 1
    with client:
        if args.approvals_command == "list":
            listed = client.list_approvals(tenant=args.tenant, status=args.status, group=args.group)
            if wants_json(args):
                print(json.dumps([MessageToDict(approval) for approval in listed], indent=2))
            else:
                print(table(LIST_HEADER, [summary(approval) for approval in listed]))
            return 0
        if args.approvals_command == "show":
            _print_approval(args, client.get_approval(args.approval_id))
            return 0
        try:
            approver = TrustedContext(args.tenant, Principal(args.approver.type, args.approver.id), "cli")
            id_token = read_id_token(args.id_token_file)
        except ValueError as exc:
            print(f"toolauthz: invalid_argument: {display(str(exc))}", file=sys.stderr)
            return 1
        _print_approval(args, client.decide_approval(args.approval_id, approver, args.approvals_command, args.reason,
                                                     id_token=id_token))
        return 0


def _print_approval(args: argparse.Namespace, approval: apb.Approval) -> None:
    # json.dumps escapes every control character a model or a runtime may have written.
    print(json.dumps(MessageToDict(approval), indent=2) if wants_json(args) else describe(approval))


def read_id_token(path: str | None) -> str:
    """The ID token from `--id-token-file`, else $TOOLAUTHZ_ID_TOKEN, else none; a file
    is read whole, without its surrounding whitespace."""
    if path is None:
        return os.environ.get(ID_TOKEN_ENV, "").strip()
    try:
        with open(path, encoding="ascii") as f:
            return f.read(64 * 1024).strip()
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"cannot read the ID token file: {exc}") from None
