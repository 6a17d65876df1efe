"""`toolauthz authorize --server` and `toolauthz status --server`: the same questions the
local commands answer, asked of a running sidecar over gRPC (plaintext, TLS or mTLS with
the options every remote command takes: `--ca`, `--cert`, `--key`)."""

from __future__ import annotations

import argparse
import json
import pathlib
import secrets
from collections.abc import Iterable
from typing import Any

from toolauthz.cli.approvals import DEFAULT_SERVER, RPC_TIMEOUT, SERVER_ENV, client_tls, server_address
from toolauthz.cli.options import add_server_options
from toolauthz.cli.output import add_output_option, wants_json
from toolauthz.cli.table import table
from toolauthz.client import AuthzClient
from toolauthz.display.escape import display
from toolauthz.proto.toolauthz.v1 import authorizer_pb2 as pb


def _client(args: argparse.Namespace) -> AuthzClient:
    return AuthzClient(server_address(args), timeout=RPC_TIMEOUT, tls=client_tls(args))


def authorize_remote(args: argparse.Namespace) -> int:
    """One Authorize call; prints the answer as JSON (json.dumps escapes every control
    character, so no string from a policy or a caller can break the output)."""
    entities = pathlib.Path(args.entities).read_bytes() if args.entities else b""
    # A fresh call id unless one is given: a fixed one would replay the first decision.
    call_id = args.call_id or f"cli_{secrets.token_hex(8)}"
    context = pb.TrustedContext(tenant=args.tenant, principal=pb.Principal(type=args.principal.type,
                                                                           id=args.principal.id),
                                request_id=args.request_id, entities_json=entities)
    call = pb.ToolCall(call_id=call_id, name=args.tool, input_json=args.input.encode())
    with _client(args) as client:
        answer = client.authorize(context, call)
    errors = [(e.code, e.message) for e in answer.errors]
    detail = explained(args, entities, answer.policy_version) if any(c == "policy_error" for c, _ in errors) else {}
    print_decision(args, decision_json(pb.Decision.Name(answer.decision), answer.reasons, errors,
                                       answer.policy_version, decision_id=answer.decision_id, call_id=call_id,
                                       approval_id=answer.approval_id, token=answer.token, replayed=answer.replayed,
                                       detail=detail))
    return deny_status(args, pb.Decision.Name(answer.decision))


def explained(args: argparse.Namespace, entities: bytes, policy_version: str) -> dict[str, Any]:
    """Why policies could not be evaluated, as the local form says it: the sidecar answers
    a runtime without Cedar's diagnostics, so the same call is decided here with `--bundle`
    when that bundle is the version the sidecar served; otherwise a hint says where to look."""
    from toolauthz.bundle import load_bundle
    from toolauthz.engine import decide
    from toolauthz.errors import BundleError, RequestError
    from toolauthz.model import ProposedCall, TrustedContext

    hint = {"hint": "the sidecar's policies could not be evaluated on what was sent" +
            ("" if entities else " (no --entities were given: policies that read the resource's attributes "
                                 "fail without them)") +
            f"; for Cedar's detail run the same command with `--bundle DIR` of version {policy_version} and "
            "without --server, or `toolauthz audit show CALL_ID` on the sidecar"}
    try:
        bundle = load_bundle(args.bundle)
    except (BundleError, OSError):
        return hint
    if bundle.version != policy_version:
        return hint
    try:
        verdict = decide(bundle, TrustedContext(args.tenant, args.principal, args.request_id, entities),
                         ProposedCall("cli", args.tool, args.input.encode()))
    except RequestError:
        return hint
    return {**verdict.detail, "explained_by": f"the local bundle `{args.bundle}` (the version the sidecar served)"}


def print_decision(args: argparse.Namespace, text: str) -> None:
    """The decision as JSON (the default, for programs), or as lines for a person: each
    value on one line with its control characters escaped (a message names things in
    backticks, so those and quotes are kept as they are)."""
    if wants_json(args):
        print(text)
        return
    answer = json.loads(text)

    def line(value: Any) -> str:
        return display(value if isinstance(value, str) else json.dumps(value), quotes=False)

    print(f"{answer.pop('decision')}  (policy version {line(answer.pop('policy_version'))})")
    print(f"reasons: {', '.join(line(r) for r in answer.pop('reasons')) or '-'}")
    for error in answer.pop("errors"):
        print(f"error {line(error['code'])}: {line(error['message'])}")
    detail = answer.pop("detail", {})
    for name, value in [*answer.items(), *detail.items()]:
        for item in value if isinstance(value, list) else [value]:
            print(f"{name}: {line(item)}")


def deny_status(args: argparse.Namespace, decision: str) -> int:
    """`--fail-on-deny`: exit 2 when the answer is DENY (as OPA's `eval --fail`), else 0."""
    return 2 if getattr(args, "fail_on_deny", False) and decision == "DENY" else 0


def decision_json(decision: str, reasons: Iterable[str], errors: Iterable[tuple[str, str]], policy_version: str,
                  **more: Any) -> str:
    """A decision as `toolauthz authorize` prints it, local or remote; `more`'s empty
    values are left out."""
    out: dict[str, Any] = {"decision": decision, "reasons": list(reasons),
                           "errors": [{"code": code, "message": message} for code, message in errors],
                           "policy_version": policy_version}
    out.update({name: value for name, value in more.items() if value})
    return json.dumps(out, indent=2)


STATUS_HEADER = ("WORKER", "PID", "POLICY_VERSION", "LOADED_AT", "RELOADS", "DECISIONS", "BATCHES", "WAITING",
                 "LAST_RELOAD_ERROR")


def status_remote(args: argparse.Namespace) -> int:
    """GetStatus: the sidecar's totals, then one row per worker process."""
    with _client(args) as client:
        status = client.get_status()
    if wants_json(args):
        from google.protobuf.json_format import MessageToDict
        print(json.dumps(MessageToDict(status), indent=2))
        return 0
    print(f"bundle          {display(status.bundle_dir)}")
    print(f"policy version  {display(status.policy_version)}  (loaded {_time(status.loaded_at)})")
    if status.HasField("bundle_revision"):
        print(f"revision        {status.bundle_revision}  (signed by {display(status.bundle_signer)}, "
              f"digest {display(status.bundle_digest)})")
    print(f"reload error    {display(status.last_reload_error) or '-'}")
    print(f"decisions       {status.decisions} in {status.decision_batches} batches, {status.decisions_waiting} "
          f"waiting; {status.reloads} reloads")
    for notice in status.notices:
        print(f"notice          {display(notice)}")
    for policy_id, count in sorted(status.shadow_effects.items()):
        print(f"shadow effect   {display(policy_id)}: {count}")
    print()
    rows = [[str(w.index), str(w.pid), display(w.policy_version), _time(w.loaded_at), str(w.reloads),
             str(w.decisions), str(w.decision_batches), str(w.decisions_waiting), display(w.last_reload_error) or "-"]
            for w in status.workers]
    print(table(STATUS_HEADER, rows))
    return 0


def _time(ts) -> str:
    return f"{ts.ToDatetime().isoformat(timespec='seconds')}Z" if ts.seconds or ts.nanos else "-"


def add_status_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = sub.add_parser("status", help="a running sidecar's status (GetStatus): bundle, reloads, every worker")
    add_server_options(status, [], f"HOST:PORT or unix:///path of the sidecar (default: ${SERVER_ENV}, "
                                   f"else {DEFAULT_SERVER})")
    add_output_option(status, json_alias=True)
    status.set_defaults(func=status_remote)
