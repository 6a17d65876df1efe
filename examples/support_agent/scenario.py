"""The scenario: one support run for alice (tenant acme), against a real sidecar.

    step 1  lookup_order ord_1001                  allowed, executed
    step 2  issue_refund with a customer_id field   rejected by the schema: zero executions
            lookup_order ord_2002 (carol's order)   denied by policy (both results in one message)
    step 3  issue_refund 1500 cents                 allowed, executed once
    step 4  issue_refund 6000 cents                 approval required; bob (finance) approves
                                                    through the Approvals API; then executed
    step 5  the model repeats toolu_04              replay: the recorded result, no execution
    step 6  the model asks for yet another lookup   not executed: the step limit ends the run
    then    a restarted runtime sees toolu_04 again the sidecar's ledger blocks it too

Then each call's audit story, from Audit.QueryDecisions.
"""

from __future__ import annotations

import contextlib
import json
import logging
import pathlib
import queue
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from typing import TextIO

import grpc

from examples.support_agent.backend import Backend
from examples.support_agent.loop import LoopResult, run_agent
from examples.support_agent.model import ScriptedModel, text, tool_use
from toolauthz.bundle.catalog import load_catalog
from toolauthz.client import AuthzClient, CallResult, Guard, GuardEvent, Principal, TrustedContext
from toolauthz.server.build import build_sidecar, create_server
from toolauthz.server.config import Settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "policies"
TENANT, CUSTOMER, APPROVER = "acme", "alice", "bob"
REQUEST_ID = "support-run-1"
MAX_STEPS = 6
APPROVAL_WAIT = 10.0
USER_MESSAGE = "Hi, my order ord_1001 never arrived. Can you check it and refund me? Also my friend's ord_2002."


def script() -> list[list]:
    """The assistant turns, as a model might produce them."""
    return [
        [text("Let me look up your order."),
         tool_use("toolu_01", "lookup_order", '{"order_id": "ord_1001"}')],
        [text("I'll refund the shipping and check your friend's order."),
         tool_use("toolu_02", "issue_refund",
                  '{"order_id": "ord_1001", "amount_cents": 1500, "customer_id": "cus_88213"}'),
         tool_use("toolu_03", "lookup_order", '{"order_id": "ord_2002"}')],
        [text("Retrying the refund without the extra field."),
         tool_use("toolu_04", "issue_refund", '{"order_id": "ord_1001", "amount_cents": 1500, "reason": "late"}')],
        [text("And the remaining value of the lost parcel."),
         tool_use("toolu_05", "issue_refund",
                  '{"order_id": "ord_1001", "amount_cents": 6000, "reason": "parcel lost"}')],
        [text("Let me make sure the first refund went through."),
         tool_use("toolu_04", "issue_refund", '{"order_id": "ord_1001", "amount_cents": 1500, "reason": "late"}')],
    ]


def keep_checking(step: int) -> list:
    """After the script, the model keeps asking for the same lookup: a loop only a limit ends."""
    return [text("Checking the order status once more."),
            tool_use(f"toolu_{step:02d}", "lookup_order", '{"order_id": "ord_1001"}')]


class Trace:
    """Thread-safe printing, and the lines kept for tests."""

    def __init__(self, out: TextIO | None):
        self.out = out
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, line: str = "", indent: int = 0) -> None:
        text_line = " " * indent + line
        with self._lock:
            self.lines.append(text_line)
            if self.out is not None:
                print(text_line, file=self.out, flush=True)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


class FinanceDesk:
    """The approval tool of the finance team, in its own thread with its own client and
    its own (here: simulated) authenticated session: bob. It is told of new approval
    requests by the runtime's trace (a real desk would list them or be notified)."""

    def __init__(self, address: str, trace: Trace):
        self.address = address
        self.trace = trace
        self.requests: queue.Queue[str | None] = queue.Queue()
        self.decided: list[str] = []
        self._client = AuthzClient(address, timeout=5.0)
        self._thread = threading.Thread(target=self._serve, name="finance-desk", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (approval_id := self.requests.get()) is not None:
            self._handle(approval_id)

    def _handle(self, approval_id: str) -> None:
        t, c = self.trace, self._client
        shown = c.get_approval(approval_id)  # no requester context: no token
        t(f"[finance desk] approval {approval_id} is pending, code {shown.short_code}: {shown.tool} on "
          f"{shown.resource} for {shown.requester.type}::\"{shown.requester.id}\", "
          f"arguments {shown.arguments_json}", 10)
        alice = TrustedContext(TENANT, Principal("User", CUSTOMER), "approval-ui")
        try:
            c.decide_approval(approval_id, alice, "approve")
        except grpc.RpcError as exc:
            t(f"[finance desk] alice tries to approve her own refund: refused ({exc.code().name})", 10)
        t("[finance desk] bob (group finance) approves it through the Approvals API", 10)
        t(f"               (the CLI equivalent: toolauthz approvals approve {approval_id} "
          f"--as 'User::\"bob\"' --tenant {TENANT} --server {self.address})", 10)
        bob = TrustedContext(TENANT, Principal("User", APPROVER), "approval-ui")
        c.decide_approval(approval_id, bob, "approve", reason="carrier confirmed the parcel is lost")
        self.decided.append(approval_id)

    def close(self) -> None:
        self.requests.put(None)
        self._thread.join(10)
        self._client.close()


@dataclass
class ScenarioReport:
    trace: Trace
    backend: Backend
    loop: LoopResult
    results: dict[str, CallResult] = field(default_factory=dict)  # the first result of each call id
    replays: dict[str, CallResult] = field(default_factory=dict)  # later answers for the same id
    restart_replay: CallResult | None = None
    stories: dict[str, list] = field(default_factory=dict)  # call id -> audit records
    checks: list[tuple[str, bool]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(ok for _, ok in self.checks)


def _describe(event: GuardEvent) -> str | None:
    d = event.data
    if event.kind == "authorize":
        why = ", ".join(d["reasons"]) or ", ".join(d["codes"]) or "-"
        extra = " (replayed)" if d["replayed"] else ""
        if d["decision"] == "ALLOW" and not d["token"]:
            extra += ", no token: already executed"
        if d["approval_id"]:
            extra += f", approval {d['approval_id']}"
        return f"authorize -> {d['decision']}{extra}  [{why}]"
    if event.kind == "approval_wait":
        return f"waiting up to {d['seconds']:g}s for a person (WatchApproval {d['approval_id']})"
    if event.kind == "approval":
        if d["status"] == "PENDING":
            return None  # printed by the desk, in its own words
        return f"approval -> {d['status']} by {d['approver'] or '-'}; the token came with it"
    if event.kind == "verify":
        return f"verify -> {d['code']}" + (" (token consumed: single use)" if d["valid"] else "")
    if event.kind == "execute":
        return f"execute {event.name} (deadline {d['deadline_seconds']:g}s)"
    if event.kind == "outcome":
        if d["status"] == "rejected":
            return f"rejected without running: {d['code']}"
        if d["replayed"]:
            return f"replay: the recorded result ({d['status']}) is returned; NOT executed again"
        code = f" {d['code']}" if d["code"] else ""
        return f"outcome -> {d['status']}{code}  [ReportOutcome: {d['reported']}]"
    return None


@contextlib.contextmanager
def _quiet_sidecar_logs():
    logger = logging.getLogger("toolauthz")
    before = logger.level
    logger.setLevel(logging.ERROR)  # "generated a development key" is expected here
    try:
        yield
    finally:
        logger.setLevel(before)


def run_scenario(out: TextIO | None = None) -> ScenarioReport:
    trace = Trace(out)
    with tempfile.TemporaryDirectory(prefix="toolauthz-example-") as tmp, _quiet_sidecar_logs():
        settings = Settings(bundle=BUNDLE, data_dir=pathlib.Path(tmp) / "data", listen="127.0.0.1:0",
                            audit={"checkpoint_interval_seconds": 3600})
        sidecar = build_sidecar(settings)
        server, port = create_server(sidecar, "127.0.0.1:0")
        address = f"127.0.0.1:{port}"
        try:
            with AuthzClient(address, timeout=5.0) as client:
                desk = FinanceDesk(address, trace)
                try:
                    report = _run(client, desk, trace, address)
                finally:
                    desk.close()
        finally:
            server.stop(grace=2).wait()  # every call has ended: a graceful GOAWAY
            sidecar.close()
    return report


def _run(client: AuthzClient, desk: FinanceDesk, trace: Trace, address: str) -> ScenarioReport:
    status = client.get_status()
    trace("toolauthz example: a support agent's tool loop")
    trace(f"sidecar {address}, bundle {pathlib.Path(status.bundle_dir).name}/ "
          f"(policy version {status.policy_version[:12]}), temporary data dir")
    trace(f"run {REQUEST_ID}: tenant {TENANT}, principal User::\"{CUSTOMER}\" "
          f"(from the session; never from model arguments)")
    trace()

    backend = Backend.demo()
    catalog = load_catalog(BUNDLE / "tools", [])
    tool_specs = [{"name": t.name, "description": t.description, "input_schema": t.input_schema}
                  for t in catalog.values()]
    context = TrustedContext(TENANT, Principal("User", CUSTOMER), REQUEST_ID, entities=backend.entities_for(TENANT))
    results: dict[str, CallResult] = {}
    replays: dict[str, CallResult] = {}

    def observe(event: GuardEvent) -> None:
        line = _describe(event)
        if line:
            trace(f"{event.call_id} {line}", 10)
        if event.kind == "approval_wait" and event.data["seconds"] > 0:
            desk.requests.put(event.data["approval_id"])

    guard = Guard(client, context, backend.tools(BUNDLE), approval_wait=APPROVAL_WAIT, observer=observe)
    model = ScriptedModel(script(), then=keep_checking)

    def on_step(step: int, response) -> None:
        trace(f"step {step}  assistant ({response.stop_reason}):")
        for block in response.content:
            if block["type"] == "text":
                trace(f'"{block["text"]}"', 8)
            elif block["type"] == "tool_use":
                trace(f"tool_use {block['id']} {block['name']} {response.raw_arguments.get(block['id'])}", 8)

    def on_result(block: dict, outcome: CallResult | None, result: dict) -> None:
        if outcome is not None:
            (replays if block["id"] in results else results).setdefault(block["id"], outcome)
        flag = "error" if result["is_error"] else "ok"
        trace(f"tool_result {result['tool_use_id']} ({flag}): {result['content']}", 8)
        if outcome is None:
            trace("(not sent to the sidecar: the loop's limit answered it)", 10)
        elif not outcome.executed:
            runs = backend.executions[block["name"]]
            trace(f"(not executed; {block['name']} implementation runs so far: {runs})", 10)

    trace(f"user: {USER_MESSAGE}")
    messages = [{"role": "user", "content": USER_MESSAGE}]
    loop = run_agent(model, guard, messages, tools=tool_specs, max_steps=MAX_STEPS, on_step=on_step,
                     on_result=on_result)
    trace(f"loop stopped by guard `{loop.stopped_by}` after {loop.steps} model steps "
          f"({loop.tool_calls} tool calls sent to the Guard)")
    roles = " ".join(m["role"][0].upper() for m in loop.messages)
    trace(f"transcript: {len(loop.messages)} messages ({roles}); every tool_use answered, "
          f"each turn's results in one user message")
    trace()

    trace("runtime restart: a new Guard for the same run is handed toolu_04 again")
    restarted = Guard(client, context, backend.tools(BUNDLE), observer=observe)
    again = restarted.run("toolu_04", "issue_refund",
                          '{"order_id": "ord_1001", "amount_cents": 1500, "reason": "late"}')
    trace(f"tool_result toolu_04 (error): {again.content}", 8)
    trace()

    report = ScenarioReport(trace, backend, loop, results, replays, again)
    _audit_stories(client, report)
    _checks(report, desk)
    return report


def _audit_stories(client: AuthzClient, report: ScenarioReport) -> None:
    trace = report.trace
    trace("audit stories (Audit.QueryDecisions, filtered by call id)")
    call_ids = list(report.results) + [cid for cid in _limit_answered(report) if cid not in report.results]
    for call_id in call_ids:
        records = client.query_decisions(tenant=TENANT, call_id=call_id)
        report.stories[call_id] = records
        if not records:
            trace(f"{call_id}: no records (never sent to the sidecar)", 2)
            continue
        first = records[0]
        trace(f"{call_id}  {first.tool} by {first.principal} on {first.resource or '-'}", 2)
        for rec in records:
            trace(_story_line(rec), 6)
        if not any(rec.kind == "outcome" for rec in records):
            trace("(no outcome: refused before the ledger, so there is no call to close)", 6)


def _limit_answered(report: ScenarioReport) -> list[str]:
    last = report.loop.messages[-1]
    return [b["tool_use_id"] for b in last["content"] if isinstance(last["content"], list)]


def _story_line(rec) -> str:
    detail = json.loads(rec.detail_json or "{}")
    if rec.kind == "authorize":
        why = ", ".join(rec.reasons) or ", ".join(rec.error_codes) or "-"
        replay = " (replayed)" if detail.get("replayed") else ""
        token = "" if rec.result != "ALLOW" else ("; token issued" if rec.jti else "; no token (already executed)")
        return f"decision      {rec.result}{replay} because {why}{token}"
    if rec.kind == "approval":
        why = f" ({', '.join(rec.error_codes)})" if rec.error_codes else ""
        return f"approval      {rec.result}{why} by {rec.approver}"
    if rec.kind == "verify":
        return f"verification  {rec.result}"
    code = detail.get("error_code") or ""
    return f"outcome       {rec.result}{' ' + code if code else ''}"


def _checks(report: ScenarioReport, desk: FinanceDesk) -> None:
    res, ex, trace = report.results, report.backend.executions, report.trace
    refunds = report.backend.refunds

    def status(cid):
        r = res.get(cid)
        return (r.status, r.code) if r else None

    approvals = [rec for rec in report.stories.get("toolu_05", []) if rec.kind == "approval"]
    checks = [
        ("allowed order lookup: toolu_01 completed, lookup_order executed once",
         status("toolu_01") == ("completed", "") and ex["lookup_order"] == 1),
        ("arguments rejected by the schema: toolu_02 failed/invalid_input, zero executions",
         status("toolu_02") == ("failed", "invalid_input")
         and not any(r.idempotency_key == "toolu_02" for r in refunds)),
        ("another customer's order denied: toolu_03 failed/denied, not executed",
         status("toolu_03") == ("failed", "denied") and not res["toolu_03"].executed),
        ("small refund allowed and executed once: toolu_04 completed",
         status("toolu_04") == ("completed", "") and [r.idempotency_key for r in refunds].count("toolu_04") == 1),
        ("large refund approved by User::\"bob\" (finance), then executed: toolu_05 completed",
         status("toolu_05") == ("completed", "") and desk.decided == [res["toolu_05"].approval_id]
         and any(a.result == "APPROVE" and a.approver == 'User::"bob"' for a in approvals)),
        ("replayed call id toolu_04: recorded result returned, no second execution",
         report.replays.get("toolu_04") is not None and report.replays["toolu_04"].replayed
         and [r.idempotency_key for r in refunds].count("toolu_04") == 1),
        ("replay after a runtime restart: the sidecar issues no token, no execution",
         report.restart_replay is not None and report.restart_replay.code == "already_executed"
         and not report.restart_replay.executed),
        (f"step limit: stopped by guard max_steps after {MAX_STEPS} model steps",
         report.loop.stopped_by == "max_steps" and report.loop.steps == MAX_STEPS),
        ("executions: lookup_order 1, issue_refund 2 (refunds rf_1 1500, rf_2 6000)",
         dict(ex) == {"lookup_order": 1, "issue_refund": 2}
         and [(r.refund_id, r.amount_cents) for r in refunds] == [("rf_1", 1500), ("rf_2", 6000)]),
    ]
    report.checks = checks
    trace()
    trace("summary")
    for name, ok in checks:
        trace(f"[{'ok' if ok else 'FAILED'}] {name}", 2)


def main(argv: list[str] | None = None) -> int:
    report = run_scenario(sys.stdout)
    return 0 if report.ok else 1
