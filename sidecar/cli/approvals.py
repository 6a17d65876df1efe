"""`toolauthz approvals ...`: a thin client of the Approvals service, for the person who
approves. The approver's identity is given explicitly (`--as`, `--tenant`); in a real
deployment the approval tool takes it from its own authenticated session."""

from __future__ import annotations

import grpc

from sidecar.cli.options import add_anywhere
from sidecar.display import display, display_uid
from sidecar.proto.toolauthz.v1 import approvals_pb2 as apb
from sidecar.proto.toolauthz.v1 import approvals_pb2_grpc as apb_grpc
from sidecar.proto.toolauthz.v1 import authorizer_pb2 as pb

# The proto enum is the one list of statuses: PENDING -> `pending`, ...
_STATUSES = [name.lower() for name in apb.ApprovalStatus.keys() if name != "APPROVAL_STATUS_UNSPECIFIED"]


def add_approvals_command(sub, parse_principal) -> None:
    approvals = sub.add_parser("approvals", help="list, show, approve or reject pending approvals")
    verbs = approvals.add_subparsers(dest="approvals_command", required=True)
    listing = verbs.add_parser("list")
    listing.add_argument("--tenant", default="")
    listing.add_argument("--status", choices=_STATUSES, default="pending")
    listing.add_argument("--group", default="")
    show = verbs.add_parser("show")
    show.add_argument("approval_id")
    for verb in ("approve", "reject"):
        p = verbs.add_parser(verb)
        p.add_argument("approval_id")
        p.add_argument("--as", dest="approver", required=True, type=parse_principal, help='e.g. User::"bob"')
        p.add_argument("--tenant", required=True)
        p.add_argument("--reason", default="", required=verb == "reject")
    add_anywhere(approvals, verbs.choices.values(), "--server", default="127.0.0.1:50051",
                 help="the sidecar's Approvals address")
    approvals.set_defaults(func=run)


def _principal(p: pb.Principal) -> str:
    return f'{display(p.type)}::"{display(p.id)}"'


def describe(a: apb.Approval) -> str:
    """The approval as the approver reads it; every value escaped (sidecar/display.py):
    the resource id comes from the model and must not forge lines of this page."""
    lines = [
        f"approval   {display(a.approval_id)}  [{apb.ApprovalStatus.Name(a.status).lower()}]",
        f"code       {display(a.short_code)}   (compare with the requester's screen)",
        f"tool       {display(a.tool)} on {display_uid(a.resource)}",
        f"requester  {_principal(a.requester)} in tenant {display(a.tenant)}",
        f"arguments  {display(a.arguments_json, quotes=False)}  (other fields: digest {display(a.digest[:16])}...)",
        f"group      {display(a.group)}  (policy {display(a.policy_id)})",
        f"expires    {a.expires_at.ToDatetime().isoformat()}Z",
    ]
    if a.approver.id:
        lines.append(f"decided by {_principal(a.approver)}  {display(a.reason)}")
    return "\n".join(lines)


def summary_line(a: apb.Approval) -> str:
    return (f"{display(a.approval_id)}  {display(a.short_code)}  {apb.ApprovalStatus.Name(a.status).lower():8}  "
            f"{display(a.tenant)}  {display(a.tool)}  {display_uid(a.resource)}  {_principal(a.requester)}  "
            f"{display(a.arguments_json, quotes=False)}")


def run(args) -> int:
    with grpc.insecure_channel(args.server) as channel:
        stub = apb_grpc.ApprovalsStub(channel)
        if args.approvals_command == "list":
            reply = stub.ListApprovals(apb.ListApprovalsRequest(
                tenant=args.tenant, status=apb.ApprovalStatus.Value(args.status.upper()), group=args.group), timeout=10)
            for a in reply.approvals:
                print(summary_line(a))
            return 0
        if args.approvals_command == "show":
            print(describe(stub.GetApproval(apb.GetApprovalRequest(approval_id=args.approval_id), timeout=10)))
            return 0
        approver = pb.TrustedContext(tenant=args.tenant, request_id="cli",
                                     principal=pb.Principal(type=args.approver.type, id=args.approver.id))
        verdict = apb.APPROVE if args.approvals_command == "approve" else apb.REJECT
        decided = stub.DecideApproval(apb.DecideApprovalRequest(
            approval_id=args.approval_id, approver=approver, verdict=verdict, reason=args.reason), timeout=10)
        print(describe(decided))
        return 0
