/**
 * The SDK against a real sidecar (test/sidecar.ts): the example bundle's refund and
 * lookup tools, allowed, denied and waiting for approval; a turn in one batch; the
 * sidecar's digest equal to this SDK's; offline token checks; TLS with a client
 * certificate and a Unix socket; and fail-closed behaviour with no sidecar at all.
 */
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { after, before, describe, test } from "node:test";

import { AuthzClient, RpcError } from "../src/client.js";
import { Principal, ProposedCall, TrustedContext } from "../src/context.js";
import { digestOfRaw } from "../src/digest.js";
import * as apb from "../src/gen/toolauthz/v1/approvals_pb.js";
import * as pb from "../src/gen/toolauthz/v1/authorizer_pb.js";
import { Guard, type GuardEvent } from "../src/guard.js";
import { OfflineVerifier } from "../src/offline.js";
import { NO_RETRY, RetryPolicy } from "../src/retry.js";
import { AnthropicToolStream } from "../src/streaming.js";
import { ToolSet } from "../src/tools.js";
import { type Sidecar, startSidecar } from "./sidecar.js";

const SMALL = '{"order_id": "ord_1", "amount_cents": 1500}';
const LARGE = '{"order_id": "ord_1", "amount_cents": 6000, "reason": "parcel lost"}';
const TOO_MUCH = '{"order_id": "ord_1", "amount_cents": 4000}';
const BOB = new TrustedContext("acme", new Principal("User", "bob"), "approval-ui");

let sidecar: Sidecar;
let client: AuthzClient;
let runs = 0;
before(async () => {
  sidecar = await startSidecar();
  client = new AuthzClient(sidecar.target);
});
after(async () => {
  client?.close();
  await sidecar?.stop();
});

/** Alice's session: ord_1 is looked up in the runtime's own store (refundable 3000 unless said otherwise). */
function alice(requestId: string, refundable = 3000): TrustedContext {
  return new TrustedContext("acme", new Principal("User", "alice"), requestId, (call) => {
    const args = call.arguments as { order_id?: unknown } | undefined;
    if (args?.order_id !== "ord_1") return [];
    return [{ uid: { type: "Order", id: "ord_1" }, parents: [],
      attrs: { owner: { __entity: { type: "User", id: "alice" } }, refundable_cents: refundable } }];
  });
}

function tools(): ToolSet {
  const set = new ToolSet();
  set.register("issue_refund", (_args, call) => {
    runs++;
    return { refund_id: `rf_${call.callId}` };
  });
  set.register("lookup_order", (args) => ({ order_id: (args as { order_id: string }).order_id, status: "shipped" }),
    { concurrent: true });
  return set;
}

describe("against a live sidecar", () => {
  test("health and status", async () => {
    assert.equal(await client.health(), true);
    const status = await client.getStatus();
    assert.match(status.policyVersion, /\S/);
  });

  test("an allowed call runs once, is verified and reported; the same id replays", async () => {
    const before = runs;
    const guard = new Guard(client, alice("run-allow", 10_000), tools());
    const result = await guard.run("ts_allow_1", "issue_refund", SMALL);
    assert.equal(result.status, "completed", JSON.stringify(result));
    assert.deepEqual(result.output, { refund_id: "rf_ts_allow_1" });
    assert.equal(result.reported, "recorded");
    assert.equal(runs, before + 1);
    const again = await guard.run("ts_allow_1", "issue_refund", SMALL);
    assert.equal(again.replayed, true);
    // Another Guard (another runtime) gets the replayed decision without a token: nothing runs.
    const other = await new Guard(client, alice("run-allow", 10_000), tools()).run("ts_allow_1", "issue_refund", SMALL);
    assert.deepEqual([other.status, other.code, other.reported], ["failed", "already_executed", "not_reported"]);
    assert.equal(runs, before + 1);
  });

  test("a denied call never runs and says which policy refused it", async () => {
    const before = runs;
    const result = await new Guard(client, alice("run-deny", 3000), tools()).run("ts_deny_1", "issue_refund", TOO_MUCH);
    assert.deepEqual([result.status, result.code, result.decision, result.reported], ["failed", "denied", "DENY", "recorded"]);
    assert.match(result.content, /refund-never-above-refundable/);
    assert.equal(result.toToolResult().is_error, true);
    assert.equal(runs, before);
  });

  test("invalid arguments are refused by the sidecar, never run", async () => {
    const result = await new Guard(client, alice("run-bad"), tools())
      .run("ts_bad_1", "issue_refund", '{"order_id":"ord_1","amount_cents":1,"amount_cents":999999}');
    assert.deepEqual([result.status, result.code, result.reported], ["failed", "invalid_input", "not_in_ledger"]);
  });

  test("a call that needs approval waits, then runs once after a person approves", async () => {
    const before = runs;
    const guard = new Guard(client, alice("run-approval", 10_000), tools());
    const pending = await guard.run("ts_approval_1", "issue_refund", LARGE);
    assert.deepEqual([pending.status, pending.isError, pending.terminal], ["approval_pending", true, false]);
    assert.ok(pending.content.includes(pending.approvalId));
    assert.equal((await guard.run("ts_approval_1", "issue_refund", LARGE)).status, "approval_pending");
    await client.decideApproval(pending.approvalId, BOB, "approve", { reason: "checked" });
    const done = await guard.run("ts_approval_1", "issue_refund", LARGE);
    assert.deepEqual([done.status, done.approvalId, done.replayed], ["completed", pending.approvalId, false]);
    assert.equal(runs, before + 1);
  });

  test("approvalWaitMs: the watch brings the token once a person approves", async () => {
    const events: GuardEvent[] = [];
    const decisions: Promise<unknown>[] = [];
    const guard = new Guard(client, alice("run-watch", 10_000), tools(), { approvalWaitMs: 30_000, observer: (event) => {
      events.push(event);
      if (event.kind === "approval" && event.data.status === "PENDING") {
        decisions.push(client.decideApproval(String(event.data.approvalId), BOB, "approve"));
      }
    } });
    const result = await guard.run("ts_watch_1", "issue_refund", LARGE);
    await Promise.all(decisions);
    assert.deepEqual([result.status, result.decision], ["completed", "APPROVAL_REQUIRED"]);
    assert.deepEqual(events.filter((e) => e.kind === "approval").map((e) => e.data.status), ["PENDING", "APPROVED"]);
  });

  test("a rejected approval never runs", async () => {
    const guard = new Guard(client, alice("run-reject", 10_000), tools(), { approvalWaitMs: 30_000, observer: (event) => {
      if (event.kind === "approval" && event.data.status === "PENDING") {
        void client.decideApproval(String(event.data.approvalId), BOB, "reject");
      }
    } });
    const result = await guard.run("ts_reject_1", "issue_refund", LARGE);
    assert.deepEqual([result.status, result.code, result.executed], ["failed", "approval_rejected", false]);
  });

  test("a turn's parallel calls go in one AuthorizeBatch", async () => {
    const guard = new Guard(client, alice("run-turn", 3000), tools());
    const results = await guard.runTurn([
      ["ts_turn_a", "lookup_order", '{"order_id":"ord_1"}'],
      ["ts_turn_b", "lookup_order", '{"order_id":"ord_1"}'],
      ["ts_turn_c", "issue_refund", TOO_MUCH],
      ["ts_turn_d", "issue_refund", SMALL],
    ]);
    assert.deepEqual(results.map((r) => [r.callId, r.status, r.code]), [
      ["ts_turn_a", "completed", ""], ["ts_turn_b", "completed", ""], ["ts_turn_c", "failed", "denied"],
      ["ts_turn_d", "completed", ""]]);
  });

  test("a streamed turn: assembled calls run, a refused one authorizes nothing", async () => {
    const stream = new AnthropicToolStream({ issue_refund: 4096 });
    const delta = (index: number, partial_json: string) => ({ type: "content_block_delta", index,
      delta: { type: "input_json_delta", partial_json } });
    const events = [
      { type: "content_block_start", index: 0, content_block: { type: "tool_use", id: "ts_stream_a", name: "lookup_order", input: {} } },
      delta(0, '{"order_id"'), delta(0, ':"ord_1"}'), { type: "content_block_stop", index: 0 },
      { type: "content_block_start", index: 1, content_block: { type: "tool_use", id: "ts_stream_b", name: "issue_refund", input: {} } },
      delta(1, '{"order_id":"ord_1",'), // the stream ends before this block does
    ];
    const answers = [...events.flatMap((event) => stream.feed(event)), ...stream.close()];
    const results = await new Guard(client, alice("run-stream", 3000), tools()).runTurn(answers);
    assert.deepEqual(results.map((r) => [r.callId, r.status, r.code, r.reported]), [
      ["ts_stream_a", "completed", "", "recorded"], ["ts_stream_b", "failed", "stream_incomplete", "not_reported"]]);
  });

  test("the sidecar's digest is this SDK's digest, and the token checks offline", async () => {
    const context = alice("run-offline", 10_000);
    const call = new ProposedCall("ts_offline_1", "issue_refund", '{"amount_cents":1500.0,"order_id":"ord_1","reason":"caf\\u00e9 \\ud83d\\ude00"}');
    const response = await client.authorize(context, call);
    assert.equal(response.decision, pb.Decision.ALLOW);
    assert.equal(response.digest, digestOfRaw({ tool: call.name, tenant: "acme", callId: call.callId,
      principalType: "User", principalId: "alice" }, call.inputJson));
    const checker = new OfflineVerifier(client);
    assert.equal((await checker.check(response.token, context, call)).code, "ok");
    const swapped = new ProposedCall(call.callId, call.name, '{"amount_cents":1501,"order_id":"ord_1"}');
    assert.equal((await checker.check(response.token, context, swapped)).code, "bad_signature");
    const bob = new TrustedContext("acme", new Principal("User", "bob"), "run-offline");
    assert.equal((await checker.check(response.token, bob, call)).code, "bad_signature");
    const flipped = response.token.slice(0, -8) + (response.token.at(-8) === "A" ? "B" : "A") + response.token.slice(-7);
    assert.notEqual((await checker.check(flipped, context, call)).code, "ok");
    for (const junk of ["", "v4.local.xyz", "v2.public.abc", "eyJhbGciOiJub25lIn0.e30.", "x".repeat(10_000)]) {
      assert.equal((await checker.check(junk, context, call)).code, "malformed", junk.slice(0, 20));
    }
    const late = new OfflineVerifier(client, { now: () => Date.now() + 3600_000 });
    assert.equal((await late.check(response.token, context, call)).code, "expired");
    // Offline checks never consume the token: Verify still accepts it, once.
    assert.equal((await client.verify(response.token, context, call)).valid, true);
    assert.equal((await client.verify(response.token, context, call)).code, "already_used");
  });

  test("mTLS with a client certificate, and a Unix socket", async () => {
    const { ca, cert, key, serverName } = sidecar.pki;
    const tls = new AuthzClient(sidecar.tlsTarget, { tls: { ca, cert, key, serverName } });
    try {
      assert.ok((await tls.getKeys()).keys.length > 0);
      const result = await new Guard(tls, alice("run-tls", 10_000), tools()).run("ts_tls_1", "issue_refund", SMALL);
      assert.equal(result.status, "completed", JSON.stringify(result));
    } finally {
      tls.close();
    }
    const noCert = new AuthzClient(sidecar.tlsTarget, { tls: { ca, serverName }, retry: NO_RETRY, timeoutMs: 5000 });
    try {
      await assert.rejects(noCert.getKeys(), RpcError);
    } finally {
      noCert.close();
    }
    const plain = new AuthzClient(sidecar.tlsTarget, { retry: NO_RETRY, timeoutMs: 5000 });
    try {
      await assert.rejects(plain.getKeys(), (error: RpcError) => error.code === "UNAVAILABLE");
    } finally {
      plain.close();
    }
    const unix = new AuthzClient(sidecar.unixTarget);
    try {
      assert.match(sidecar.unixTarget, /^unix:\/\/\//);
      const result = await new Guard(unix, alice("run-unix", 10_000), tools()).run("ts_unix_1", "issue_refund", SMALL);
      assert.equal(result.status, "completed", JSON.stringify(result));
    } finally {
      unix.close();
    }
  });

  test("approvals: listed, decided, and the token shown to the requester only", async () => {
    const context = alice("run-get", 10_000);
    const call = new ProposedCall("ts_get_1", "issue_refund", LARGE);
    const response = await client.authorize(context, call);
    assert.equal(response.decision, pb.Decision.APPROVAL_REQUIRED);
    const listed = await client.listApprovals({ tenant: "acme", status: apb.ApprovalStatus.PENDING });
    assert.ok(listed.some((a) => a.approvalId === response.approvalId));
    await client.decideApproval(response.approvalId, BOB, "approve");
    const seen = await client.getApproval(response.approvalId, context);
    assert.equal(seen.status, apb.ApprovalStatus.APPROVED);
    assert.match(seen.token, /^v4\.public\./);
    await assert.rejects(client.getApproval(response.approvalId, BOB), // another principal: not theirs to read
      (error: RpcError) => error.code === "PERMISSION_DENIED");
  });
});

describe("without a sidecar", () => {
  test("an unreachable sidecar is UNAVAILABLE and the call fails closed", async () => {
    const port = await freePort();
    const down = new AuthzClient(`127.0.0.1:${port}`, { timeoutMs: 3000,
      retry: new RetryPolicy({ initialBackoffMs: 1, maxBackoffMs: 1 }) });
    try {
      let attempts = 0;
      await assert.rejects(down.getKeys(), (error: RpcError) => error.code === "UNAVAILABLE");
      const result = await new Guard(down, alice("run-down"), tools(), { observer: () => attempts++ })
        .run("ts_down_1", "issue_refund", SMALL);
      assert.deepEqual([result.status, result.code, result.executed, result.reported],
        ["failed", "authorization_unavailable", false, "report_failed"]);
      assert.ok(attempts > 0);
    } finally {
      down.close();
    }
  });

  test("bad client settings are refused at construction", () => {
    assert.throws(() => new AuthzClient("unix:relative.sock"), TypeError);
    assert.throws(() => new AuthzClient("127.0.0.1:1", { timeoutMs: 0 }), RangeError);
    assert.throws(() => new AuthzClient("127.0.0.1:1", { tls: { cert: "a.pem" } }), TypeError);
    assert.throws(() => new AuthzClient("127.0.0.1:1", { transportLabel: "http" }), TypeError);
  });
});

/** A port nothing listens on: bound to port 0, then closed. */
function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address ? address.port : 0));
    });
  });
}
