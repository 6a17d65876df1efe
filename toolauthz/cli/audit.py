"""`toolauthz audit ...`: questions auditors ask, answered from the audit store.

These commands read the store directly (the SQLite file of a data directory, or the
database of `--store URL`: an auditor with read access needs no running sidecar), or, with
`--server HOST:PORT`, a running sidecar's Audit service (query, export and show; TLS and
mTLS as `toolauthz approvals` takes them), printing the same either way. `checkpoints --out FILE` exports the signed
checkpoints, and `verify --checkpoints FILE` trusts only those: a writer holding the
database and the audit key cannot silently rewrite history exported before.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import sys
from collections.abc import Callable
from dataclasses import replace

from toolauthz.audit import AuditQuery, AuditRecord, Checkpoint, verify_chain
from toolauthz.audit.merkle import heads_from_json, heads_json, heads_root, records_in
from toolauthz.audit.shadow import shadow_counts
from toolauthz.audit.store import MAX_PAGE, AuditLog, checked_kind, checked_result
from toolauthz.cli.approvals import RPC_TIMEOUT, client_tls
from toolauthz.cli.audit_remote import RemoteAuditLog
from toolauthz.cli.audit_story import iso_time, print_story, story_json
from toolauthz.cli.options import add_anywhere, add_server_options, moment, principal_filter, resource_filter
from toolauthz.cli.output import add_output_option, renamed_option, wants_json
from toolauthz.client import AuthzClient
from toolauthz.display.escape import bounded_message, display, display_uid, shown
from toolauthz.errors import RequestError, ToolAuthzError
from toolauthz.server.config import DATABASE_FILE
from toolauthz.store.open import open_store

_FILTERS = ("tenant", "principal", "tool", "call_id", "request_id", "result", "kind", "resource", "approver",
            "approval_id", "decision_id", "error_code", "policy_id", "policy_version", "caller")
_FLAGS = {"policy_id": "--policy"}  # a policy's id is what records hold as a reason


def _argument(check: Callable[[str], str]) -> Callable[[str], str]:
    """An argparse type from an audit value check: a bad value exits 2 naming the allowed ones."""
    def parse(text: str) -> str:
        try:
            return check(text)
        except RequestError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


_FILTER_TYPES: dict[str, Callable[[str], str]] = {
    "principal": principal_filter, "approver": principal_filter, "resource": resource_filter,
    "result": _argument(checked_result), "kind": _argument(checked_kind)}


def add_audit_command(sub) -> None:
    audit = sub.add_parser("audit", help="query, export, show and verify the audit trail")
    verbs = audit.add_subparsers(dest="audit_command", required=True)
    parsers: list[argparse.ArgumentParser] = []
    for name, help_text in (("query", "matching records as a table (or JSON lines)"),
                            ("export", "matching records as JSON lines or CSV"),
                            ("shadow", "how many matching decisions each @shadow policy disagreed with")):
        p = verbs.add_parser(name, help=help_text)
        parsers.append(p)
        for f in _FILTERS:
            p.add_argument(_FLAGS.get(f, f"--{f.replace('_', '-')}"), dest=f, type=_FILTER_TYPES.get(f, str))
        p.add_argument("--since", type=moment, help="a duration ago (`7d`, `12h`) or an ISO 8601 time, inclusive")
        p.add_argument("--until", type=moment, help="a duration ago or an ISO 8601 time, exclusive")
        if name == "query":
            p.add_argument("--limit", type=int, default=100)
            add_output_option(p, json_alias=True)
        elif name == "shadow":
            add_output_option(p)
        else:
            # Its records are data for programs, in a format of their own: `--format`
            # chooses it. `--output` stays the old spelling of `--out` (a file name), which
            # scripts written before `--output text|json` existed still pass.
            renamed_option(p, "--out", "--output", dest="out",
                           help="a file; default standard output (`--output FILE` is the old spelling)")
            p.add_argument("--format", choices=("jsonl", "csv"), default="jsonl",
                           help="JSON lines (default) or CSV with a header row; there is no text form "
                                "(`audit query` prints a table)")
    show = verbs.add_parser("show", help="one call's whole story, or that of every call on a resource")
    show.add_argument("call_id", nargs="?")
    show.add_argument("--tenant")
    show.add_argument("--resource", type=resource_filter,
                      help='every call on this resource, e.g. Order::"ord_777" (instead of a call id)')
    show.add_argument("--tool", help="with --resource: only calls of this tool")
    add_output_option(show, help="text (default) or JSON: one object per call, its summary and records")
    verify = verbs.add_parser("verify", help="check the hash chains against the signed checkpoints")
    verify.add_argument("--public-key", help="file with the audit public key (PASERK k4.public); "
                                             "default: derived from <data-dir>/audit-key.pem")
    verify.add_argument("--checkpoints", help="a file written by `audit checkpoints --out`: verify against "
                                              "these signed checkpoints only, not those in the store")
    add_output_option(verify)
    checkpoints = verbs.add_parser("checkpoints", help="export the signed checkpoints, one per line")
    checkpoints.add_argument("--out", required=True, help="the file to write")
    add_output_option(checkpoints)
    every = [*parsers, show, verify, checkpoints]
    add_server_options(audit, [*parsers, show], "the sidecar's Audit address: read it instead of a local store "
                                                "(query, export, show)")
    add_anywhere(audit, every, "--data-dir", default=".toolauthz")
    add_anywhere(audit, every, "--store", help="sqlite:///path or postgresql://...; default: "
                                               "$TOOLAUTHZ_STORE, else <data-dir>/toolauthz.db")
    audit.set_defaults(func=run)


def run(args) -> int:
    verbs = {"query": _query, "export": _export, "show": _show, "verify": _verify, "checkpoints": _checkpoints,
             "shadow": _shadow}
    if getattr(args, "server", None):
        if args.audit_command not in ("query", "export", "show", "shadow"):
            raise ToolAuthzError(f"`audit {args.audit_command}` reads the store itself: give --store or --data-dir")
        try:
            client = AuthzClient(args.server, timeout=RPC_TIMEOUT, tls=client_tls(args))
        except (ValueError, OSError) as exc:
            raise ToolAuthzError(str(exc)) from None
        with client:
            return verbs[args.audit_command](RemoteAuditLog(client), args)
    url = args.store or os.environ.get("TOOLAUTHZ_STORE") or ""
    if not url:
        path = pathlib.Path(args.data_dir) / DATABASE_FILE
        if not path.exists():
            older = pathlib.Path(args.data_dir) / "audit.db"
            hint = f"; `{older}` is the audit trail of an earlier version: read it with that version" \
                if older.exists() else ""
            raise ToolAuthzError(f"no audit store at `{path}`{hint}")
        url = f"sqlite://{path.absolute()}"
    store = open_store(url, pool_size=1)
    try:
        return verbs[args.audit_command](store.audit_log, args)
    finally:
        store.close()


def _filters(args) -> AuditQuery:
    values = {f: getattr(args, f) for f in _FILTERS}
    return AuditQuery(**values, time_from=args.since, time_to=args.until)


def _pages(log: AuditLog, query: AuditQuery, limit: int | None = None):
    after, left = 0, limit
    while left is None or left > 0:
        page = log.query(query, limit=min(MAX_PAGE, left or MAX_PAGE), after_seq=after)
        yield from page
        if len(page) < min(MAX_PAGE, left or MAX_PAGE):
            return
        after = page[-1].seq
        left = None if left is None else left - len(page)


def as_json(record: AuditRecord) -> dict:
    e = record.event
    return {"seq": record.seq, "time": iso_time(e.time), "kind": e.kind, "result": e.result,
            "decision_id": e.decision_id, "request_id": e.request_id, "call_id": e.call_id, "tenant": e.tenant,
            "principal": e.principal, "tool": e.tool, "resource": e.resource, "reasons": list(e.reasons),
            "error_codes": list(e.error_codes), "digest": e.digest, "policy_version": e.policy_version,
            "jti": e.jti, "approval_id": e.approval_id, "approver": e.approver, "caller": e.caller, "fields": e.fields,
            "detail": e.detail, "hash": record.hash}


def _row(record: AuditRecord) -> str:
    e = record.event
    why = display(",".join(e.reasons or e.error_codes))
    return (f"{record.seq:>7}  {iso_time(e.time)}  {display(e.kind):9}  {display(e.result):17}  "
            f"{display(e.tenant):10}  {display_uid(e.principal):18}  {display(e.tool):16}  "
            f"{display_uid(e.resource) or '-':22}  {display(e.call_id):20}  {why}")


def _query(log, args) -> int:
    records = _pages(log, _filters(args), args.limit)
    if wants_json(args):
        for record in records:
            print(json.dumps(as_json(record), sort_keys=True))
        return 0
    print(f"{'seq':>7}  {'time':24}  {'kind':9}  {'result':17}  {'tenant':10}  {'principal':18}  "
          f"{'tool':16}  {'resource':22}  {'call_id':20}  reasons/errors")
    for record in records:
        print(_row(record))
    return 0


def _export(log, args) -> int:
    out = open(args.out, "w", encoding="utf-8", newline="") if args.out else sys.stdout
    try:
        records = _pages(log, _filters(args))
        if args.format == "csv":
            _write_csv(out, records)
            return 0
        for record in records:
            out.write(json.dumps(as_json(record), sort_keys=True) + "\n")
    finally:
        if args.out:
            out.close()
    return 0


CSV_COLUMNS = ("seq", "time", "kind", "result", "tenant", "principal", "tool", "resource", "call_id", "request_id",
               "decision_id", "approval_id", "approver", "caller", "reasons", "error_codes", "digest",
               "policy_version", "jti", "fields", "detail", "hash")
# A spreadsheet runs a cell that starts with one of these as a formula; records hold
# strings a model or runtime wrote, so such a cell is written with a leading `'`.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _write_csv(out, records) -> None:
    """One row per record, lists and mappings as JSON text."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for record in records:
        values = as_json(record)
        writer.writerow([_csv_cell(values[name]) for name in CSV_COLUMNS])


def _csv_cell(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
    return "'" + text if text.startswith(_FORMULA_START) else text


def _show(log, args) -> int:
    if (args.call_id is None) == (args.resource is None):
        raise ToolAuthzError("give a call id or --resource, not both")
    if args.call_id is None:
        return _show_resource(log, args)
    if args.tool:
        raise ToolAuthzError("--tool goes with --resource")
    records = list(_pages(log, AuditQuery(call_id=args.call_id, tenant=args.tenant)))
    if not records:
        print(f"no audit records for call `{shown(args.call_id)}`", file=sys.stderr)
        return 1
    _tell(args, records)
    return 0


def _show_resource(log, args) -> int:
    """Every call on the resource, each with its story: a call is found by its decision
    (verify and outcome records name no resource), then read whole by its call id."""
    decisions = _pages(log, AuditQuery(resource=args.resource, tool=args.tool, tenant=args.tenant, kind="authorize"))
    calls = list(dict.fromkeys((r.event.tenant, r.event.call_id) for r in decisions))
    if not calls:
        print(f"no audit records for resource `{shown(args.resource)}`", file=sys.stderr)
        return 1
    for i, (tenant, call_id) in enumerate(calls):
        if i and not wants_json(args):
            print()
        _tell(args, list(_pages(log, AuditQuery(call_id=call_id, tenant=tenant))))
    return 0


def _tell(args, records: list[AuditRecord]) -> None:
    """One call's story: text, or one JSON line (a resource's calls are JSON lines)."""
    if wants_json(args):
        print(json.dumps(story_json(records, as_json), sort_keys=True))
    else:
        print_story(records)


def _shadow(log, args) -> int:
    """Counts per @shadow policy over the matching decisions (toolauthz/audit/shadow.py)."""
    total, counts = shadow_counts(_pages(log, replace(_filters(args), kind="authorize")))
    if wants_json(args):
        print(json.dumps({"decisions": total, "disagreements": dict(sorted(counts.items()))}, indent=2))
        return 0
    print(f"{sum(counts.values())} shadow disagreements in {total} decisions")
    for policy, count in sorted(counts.items()):
        print(f"  {count:8d}  {display(policy)}")
    return 0


def _verify(log, args) -> int:
    keys = _audit_public_keys(args)
    checkpoints = _exported_checkpoints(args.checkpoints) if args.checkpoints else log.checkpoints()
    heads = log.heads()  # before the records: a record appended meanwhile is past its head
    findings = verify_chain(log.iter_chains(), checkpoints, keys, heads=heads)
    count, root = records_in(heads), heads_root(heads)
    chains = sum(1 for h in heads if h.seq)
    if wants_json(args):
        print(json.dumps({"ok": not findings, "records": count, "chains": chains, "checkpoints": len(checkpoints),
                          "root": root, "findings": [{"where": f.where, "kind": f.kind, "message": f.message}
                                                     for f in findings]}, indent=2))
        return 1 if findings else 0
    if not findings:
        source = f"exported in `{shown(args.checkpoints)}`" if args.checkpoints else "stored"
        print(f"ok: {count} records in {chains} chains, {len(checkpoints)} checkpoints ({source}), "
              f"root {root[:16]}…")
        return 0
    for f in findings:
        print(f"{display(f.where)}: {display(f.kind)}: {bounded_message(f.message)}")
    print(f"{len(findings)} finding(s): the audit trail was altered", file=sys.stderr)
    return 1


def _checkpoints(log, args) -> int:
    checkpoints = log.checkpoints()
    # A line per checkpoint: its token, and for one of every chain the heads its root signs.
    lines = [f"{cp.token} {heads_json(cp.heads)}" if cp.version == 2 else cp.token for cp in checkpoints]
    pathlib.Path(args.out).write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    if wants_json(args):
        print(json.dumps({"checkpoints": len(checkpoints), "out": args.out}))
    else:
        print(f"{len(checkpoints)} checkpoints written to {shown(args.out)}")
    return 0


def _exported_checkpoints(path: str) -> list[Checkpoint]:
    """The tokens of an export; what each one says is read from it only once its
    signature verifies (verify_chain), so the placeholders here are never trusted."""
    lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
    exported = [line.strip().partition(" ") for line in lines if line.strip()]
    return [Checkpoint(0, "", 0.0, "", token, heads_from_json(heads.strip())) for token, _, heads in exported]


def _audit_public_keys(args):
    import pyseto

    if args.public_key:
        try:
            return pyseto.Key.from_paserk(pathlib.Path(args.public_key).read_text().strip())
        except FileNotFoundError:
            raise ToolAuthzError(f"the public key file `{shown(args.public_key)}` does not exist") from None
    from toolauthz.tokens.keys import load_private_key_file

    private_key = pathlib.Path(args.data_dir) / "audit-key.pem"
    if not private_key.exists():
        # Verifying a store from elsewhere (--store) is the usual case: the key is not here.
        raise ToolAuthzError(
            f"no audit key to verify with: pass the audit public key with `--public-key FILE` (PASERK "
            f"k4.public), or `--data-dir` of the sidecar that signed the checkpoints (its `audit-key.pem`; "
            f"`{shown(str(private_key))}` does not exist)")
    return load_private_key_file(private_key).public_key
