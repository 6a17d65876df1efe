"""`toolauthz policy impact --bundle NEW`: what a bundle would change on the calls already
served, before it is deployed.

Every retained call (`audit.retain_input`, store/retained.py) is decided again, as the
sidecar decides (engine.decide: the same input, entities, principal, run counts and
usage meter values),
under the current bundle and under NEW. "Current" is the bundle the sidecar would load:
`--base DIR`, by default the configured one (`bundle` of `--config`), verified as
`serve` verifies it when `bundle_verification` is configured. A call changes when its
decision, its reasons or its approval group differ. The report counts the changed calls
per policy (each policy whose presence among the reasons differs) and per tool, then
gives examples showing only what the audit trail may show (`audit.record` fields).
Rows are read a page at a time and only counts and a few examples are kept, so a replay
over a million calls holds no more memory than one over a hundred.
"""

from __future__ import annotations

import argparse
import json
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from toolauthz.audit.retention import RetentionError, unseal
from toolauthz.bundle import Bundle
from toolauthz.bundle.catalog import resolve_pointer
from toolauthz.bundle.tool_fields import parse_duration
from toolauthz.cli.output import add_output_option, renamed_option, wants_json
from toolauthz.display.escape import SHOWN_PREFIX_CHARS, shown
from toolauthz.engine import RunCounts, decide
from toolauthz.errors import RequestError, ToolAuthzError
from toolauthz.model import Principal, ProposedCall, TrustedContext
from toolauthz.store.retained import RetainedRow

REFUSED = "REFUSED"  # the request itself would be refused (RequestError): no decision
NO_POLICY = "(no policy)"


@dataclass(frozen=True)
class Outcome:
    decision: str
    reasons: tuple[str, ...]
    approval_group: str

    def show(self) -> str:
        reasons = ", ".join(self.reasons) or "no reasons"
        group = f", group {self.approval_group}" if self.approval_group else ""
        return f"{self.decision} ({reasons}{group})"


@dataclass(frozen=True)
class Change:
    tenant: str
    call_id: str
    tool: str
    decided_at: float
    before: Outcome
    after: Outcome
    fields: dict[str, Any]  # the tool's `audit.record` fields only

    @property
    def policies(self) -> list[str]:
        moved = sorted(set(self.before.reasons) ^ set(self.after.reasons))
        return moved or [NO_POLICY]

    def to_dict(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "call_id": self.call_id, "tool": self.tool, "decided_at": self.decided_at,
                "before": vars(self.before) | {"reasons": list(self.before.reasons)},
                "after": vars(self.after) | {"reasons": list(self.after.reasons)},
                "policies": self.policies, "fields": self.fields}


def redecide(bundle: Bundle, tenant: str, call_id: str, tool: str, body: Any) -> Outcome:
    """The decision `bundle` gives the retained call, as Authorize would make it."""
    ctx = TrustedContext(tenant, Principal(body.principal_type, body.principal_id), body.request_id,
                         body.entities_json)
    try:
        verdict = decide(bundle, ctx, ProposedCall(call_id, tool, body.input_json),
                         RunCounts(body.run_calls, body.run_tool_calls), body.usage)
    except RequestError:
        return Outcome(REFUSED, (), "")
    return Outcome(verdict.decision.value, verdict.reasons, verdict.approval_group)


def changes(base: Bundle, new: Bundle, rows: Iterable[RetainedRow], key: bytes,
            unreadable: Counter[str] | None = None) -> Iterator[tuple[RetainedRow, Change | None]]:
    """Each row with its change, or None when both bundles decide it alike. A row that
    does not open with the key is counted in `unreadable` and skipped."""
    for row in rows:
        try:
            body = unseal(key, row.tenant, row.call_id, row.tool, row.sealed)
        except (RetentionError, ValueError, KeyError, TypeError):
            if unreadable is not None:
                unreadable[row.tool] += 1
            continue
        before = redecide(base, row.tenant, row.call_id, row.tool, body)
        after = redecide(new, row.tenant, row.call_id, row.tool, body)
        if before == after:
            yield row, None
            continue
        yield row, Change(row.tenant, row.call_id, row.tool, row.decided_at, before, after,
                          _recorded_fields(base, row.tool, body.input_json))


def _recorded_fields(bundle: Bundle, tool: str, input_json: bytes) -> dict[str, Any]:
    slice_ = bundle.tools.get(tool)
    if slice_ is None:
        return {}
    value = json.loads(input_json)
    out = {}
    for pointer in slice_.tool.audit_fields:
        found, field_value = resolve_pointer(value, pointer)
        if found:
            out[pointer] = field_value
    return out


@dataclass
class Report:
    """Counts over every replayed call and the first `max_examples` changes."""

    max_examples: int = 10
    total: int = 0
    changed: int = 0
    by_policy: Counter[str] = field(default_factory=Counter)
    by_tool: Counter[str] = field(default_factory=Counter)
    calls_by_tool: Counter[str] = field(default_factory=Counter)
    transitions: Counter[str] = field(default_factory=Counter)
    unreadable: Counter[str] = field(default_factory=Counter)
    examples: list[Change] = field(default_factory=list)

    def add(self, row: RetainedRow, change: Change | None) -> None:
        self.total += 1
        self.calls_by_tool[row.tool] += 1
        if change is None:
            return
        self.changed += 1
        self.by_tool[row.tool] += 1
        self.by_policy.update(change.policies)
        self.transitions[f"{change.before.decision} -> {change.after.decision}"] += 1
        if len(self.examples) < self.max_examples:
            self.examples.append(change)

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "changed": self.changed, "by_policy": dict(sorted(self.by_policy.items())),
                "by_tool": dict(sorted(self.by_tool.items())), "transitions": dict(sorted(self.transitions.items())),
                "unreadable": sum(self.unreadable.values()), "examples": [c.to_dict() for c in self.examples]}

    def text(self) -> str:
        lines = [f"{self.changed} of {self.total} retained calls change"]
        if self.unreadable:
            lines.append(f"{sum(self.unreadable.values())} retained calls do not open with this key: skipped")
        for title, counts in (("by policy", self.by_policy), ("by tool", self.by_tool),
                              ("by decision", self.transitions)):
            if counts:
                lines.append(f"{title}:")
                lines += [f"  {count:8d}  {shown(name)}" for name, count in sorted(counts.items())]
        if self.examples:
            lines.append("examples:")
        for change in self.examples:
            # json.dumps escapes every control and non-ASCII character: the value prints as it is held.
            fields = ", ".join(f"{shown(k)}={json.dumps(v)[:SHOWN_PREFIX_CHARS]}" for k, v in change.fields.items())
            lines.append(f"  {shown(change.tenant)} {shown(change.call_id)} {change.tool}"
                         f"{' ' + fields if fields else ''}")
            lines.append(f"    {shown(change.before.show())} -> {shown(change.after.show())}")
        return "\n".join(lines)

    def write_junit(self, path: str) -> None:
        """One testcase per tool replayed: a failure when any of its calls changes."""
        root = ET.Element("testsuites", name="toolauthz policy impact")
        suite = ET.SubElement(root, "testsuite", name="impact", tests=str(len(self.calls_by_tool)),
                              failures=str(len(self.by_tool)))
        for tool, calls in sorted(self.calls_by_tool.items()):
            case = ET.SubElement(suite, "testcase", name=tool, classname="impact")
            if self.by_tool[tool]:
                failure = ET.SubElement(case, "failure", type="decision_changed",
                                        message=f"{self.by_tool[tool]} of {calls} calls change")
                failure.text = "\n".join(f"{c.call_id}: {c.before.show()} -> {c.after.show()}"
                                         for c in self.examples if c.tool == tool)
        root.set("tests", suite.get("tests", "0"))
        root.set("failures", suite.get("failures", "0"))
        ET.indent(root)
        ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


def cmd_impact(args: argparse.Namespace) -> int:
    from toolauthz.audit.retention import load_retention_key
    from toolauthz.server.config import load_settings
    from toolauthz.server.reload import load_bundle_snapshot
    from toolauthz.store.retained import RetainedInputs

    settings = load_settings(args.config)
    since = parse_duration(args.since)
    if since is None:
        raise ToolAuthzError(f"--since takes a duration such as `7d`, not `{shown(args.since)}`")
    keys = settings.bundle_verification.public_keys() if settings.bundle_verification else None
    base = load_bundle_snapshot(args.base or settings.bundle, keys)
    new = load_bundle_snapshot(args.candidate)
    key = load_retention_key(args.retention_key or settings.retention_key_file)
    store = RetainedInputs(args.store or settings.store_url)
    now = time.time()
    report = Report(max_examples=args.examples)
    try:
        rows = store.stream(since=now - since, now=now, tenant=args.tenant)
        for row, change in changes(base, new, rows, key, report.unreadable):
            report.add(row, change)
    finally:
        store.close()
    if wants_json(args):
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.text())
    if args.junit:
        report.write_junit(args.junit)
    return 1 if args.fail_on_change and report.changed else 0


def add_policy_command(subparsers) -> None:
    policy = subparsers.add_parser("policy", help="policy lifecycle: the impact of a bundle on served calls")
    sub = policy.add_subparsers(dest="policy_command", required=True)
    impact = sub.add_parser("impact", help="re-decide retained calls under the current bundle and under --candidate")
    renamed_option(impact, "--candidate", "--bundle", dest="candidate", required=True,
                   help="the bundle to deploy (NEW); `--bundle` is its old spelling")
    impact.add_argument("--base", help="the current bundle (default: the configured `bundle`)")
    impact.add_argument("--since", default="7d", help="replay calls decided since this long ago (default 7d)")
    impact.add_argument("--tenant", help="only this tenant's calls")
    impact.add_argument("--store", help="the store URL (default: the configured one)")
    renamed_option(impact, "--retention-key", "--key", dest="retention_key",
                   help="the retention key file (default: <data_dir>/retention-key)")
    impact.add_argument("--config", help="the sidecar's config file")
    add_output_option(impact)
    impact.add_argument("--format", dest="output", choices=["text", "json"], help="the same as --output")
    impact.add_argument("--junit", metavar="FILE", help="also write JUnit XML: one testcase per tool")
    impact.add_argument("--examples", type=int, default=10, help="changed calls shown (default 10)")
    impact.add_argument("--fail-on-change", action="store_true", help="exit 1 when any call changes")
    impact.set_defaults(func=cmd_impact)
