/**
 * The client's retry rules and deadlines (docs/sdk.md), against a grpc-js server in this
 * process that answers each method with a scripted status and counts the attempts.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { create, toBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";

import { AuthzClient, RpcError } from "../src/client.js";
import { Principal, ProposedCall, TrustedContext } from "../src/context.js";
import { Guard } from "../src/guard.js";
import * as pb from "../src/gen/toolauthz/v1/authorizer_pb.js";
import { RetryPolicy } from "../src/retry.js";
import { ToolSet } from "../src/tools.js";

const CONTEXT = new TrustedContext("acme", new Principal("User", "alice"), "run-1");
const CALL = new ProposedCall("c1", "issue_refund", "{}");

/** method name -> statuses to answer, in order (then OK with an empty message). */
const script = new Map<string, grpc.status[]>();
const attempts = new Map<string, number>();
let hangs = false;
let garbage = false; // answer bytes that are no protobuf message
let server: grpc.Server;
let target: string;

before(async () => {
  server = new grpc.Server();
  const methods = ["Authorize", "AuthorizeBatch", "Verify", "GetKeys", "ReportOutcome", "GetStatus"];
  const definition: Record<string, grpc.MethodDefinition<Buffer, Buffer>> = {};
  for (const name of methods) {
    definition[name] = { path: `/toolauthz.v1.ToolAuthorizer/${name}`, requestStream: false, responseStream: false,
      requestSerialize: (b: Buffer) => b, requestDeserialize: (b: Buffer) => b,
      responseSerialize: (b: Buffer) => b, responseDeserialize: (b: Buffer) => b };
  }
  const handlers: grpc.UntypedServiceImplementation = {};
  for (const name of methods) {
    handlers[name] = (_call: grpc.ServerUnaryCall<Buffer, Buffer>, callback: grpc.sendUnaryData<Buffer>) => {
      attempts.set(name, (attempts.get(name) ?? 0) + 1);
      if (hangs) return; // never answers: the client's deadline ends the call
      if (garbage) return callback(null, Buffer.from([0xff, 0xff, 0xff, 0xff]));
      const status = script.get(name)?.shift();
      if (status !== undefined) callback({ code: status, details: "scripted" }, null);
      else if (name === "Verify") callback(null, Buffer.from(toBinary(pb.VerifyResponseSchema, create(pb.VerifyResponseSchema, { valid: true, code: "ok" }))));
      else callback(null, Buffer.alloc(0));
    };
  }
  server.addService(definition, handlers);
  const port = await new Promise<number>((resolve, reject) => server.bindAsync("127.0.0.1:0",
    grpc.ServerCredentials.createInsecure(), (error, bound) => (error ? reject(error) : resolve(bound))));
  target = `127.0.0.1:${port}`;
});
after(() => server.forceShutdown());

function fresh(statuses: Record<string, grpc.status[]>): AuthzClient {
  script.clear();
  attempts.clear();
  hangs = false;
  garbage = false;
  for (const [name, list] of Object.entries(statuses)) script.set(name, [...list]);
  return new AuthzClient(target, { timeoutMs: 5000, retry: new RetryPolicy({ initialBackoffMs: 1, maxBackoffMs: 2 }) });
}

const U = grpc.status.UNAVAILABLE;

describe("retries", () => {
  test("read-only RPCs: up to maxAttempts on UNAVAILABLE", async () => {
    const client = fresh({ GetKeys: [U, U] });
    await client.getKeys();
    assert.equal(attempts.get("GetKeys"), 3);
    fresh({ GetKeys: [U, U, U] });
    await assert.rejects(client.getKeys(), (e: RpcError) => e.code === "UNAVAILABLE");
    assert.equal(attempts.get("GetKeys"), 3);
    client.close();
  });

  test("Authorize and AuthorizeBatch: at most one retry", async () => {
    const client = fresh({ Authorize: [U, U], AuthorizeBatch: [U, U] });
    await assert.rejects(client.authorize(CONTEXT, CALL), (e: RpcError) => e.code === "UNAVAILABLE");
    await assert.rejects(client.authorizeBatch(CONTEXT, [CALL]), (e: RpcError) => e.code === "UNAVAILABLE");
    assert.equal(attempts.get("Authorize"), 2);
    assert.equal(attempts.get("AuthorizeBatch"), 2);
    client.close();
  });

  test("Verify: never retried (it consumes the token)", async () => {
    const client = fresh({ Verify: [U] });
    await assert.rejects(client.verify("t", CONTEXT, CALL), (e: RpcError) => e.code === "UNAVAILABLE");
    assert.equal(attempts.get("Verify"), 1);
    client.close();
  });

  test("only UNAVAILABLE is retried: never DEADLINE_EXCEEDED, never INVALID_ARGUMENT", async () => {
    const client = fresh({ GetKeys: [grpc.status.DEADLINE_EXCEEDED], Authorize: [grpc.status.INVALID_ARGUMENT] });
    await assert.rejects(client.getKeys(), (e: RpcError) => e.code === "DEADLINE_EXCEEDED");
    await assert.rejects(client.authorize(CONTEXT, CALL), (e: RpcError) => e.code === "INVALID_ARGUMENT");
    assert.equal(attempts.get("GetKeys"), 1);
    assert.equal(attempts.get("Authorize"), 1);
    client.close();
  });

  test("ReportOutcome: ALREADY_EXISTS after a retried attempt is our own first report", async () => {
    const client = fresh({ ReportOutcome: [U, grpc.status.ALREADY_EXISTS] });
    const report = await client.reportOutcome(CONTEXT, "c1", "completed");
    assert.equal(report.alreadyRecorded, true);
    assert.equal(attempts.get("ReportOutcome"), 2);
    fresh({ ReportOutcome: [grpc.status.ALREADY_EXISTS] });
    await assert.rejects(client.reportOutcome(CONTEXT, "c1", "completed"), (e: RpcError) => e.code === "ALREADY_EXISTS");
    client.close();
  });

  test("the deadline bounds the whole call", async () => {
    const client = fresh({});
    hangs = true;
    await assert.rejects(client.getStatus({ timeoutMs: 100 }), (e: RpcError) => e.code === "DEADLINE_EXCEEDED");
    assert.equal(attempts.get("GetStatus"), 1);
    client.close();
  });

  test("an aborted signal cancels the call", async () => {
    const client = fresh({});
    hangs = true;
    const controller = new AbortController();
    const pending = client.getStatus({ signal: controller.signal });
    controller.abort();
    await assert.rejects(pending, (e: RpcError) => e.code === "CANCELLED");
    client.close();
  });

  test("an answer that is not a valid message is INTERNAL, never a crash", async () => {
    const client = fresh({});
    garbage = true;
    await assert.rejects(client.getStatus(), (e: RpcError) => e.code === "INTERNAL");
    client.close();
  });
});

describe("CANCELLED from the sidecar's side (gRPC's core refusing a call its full backlog cannot hold)", () => {
  test("is not retried, and the Guard fails the call closed as authorization_unavailable", async () => {
    const client = fresh({ Authorize: [grpc.status.CANCELLED], AuthorizeBatch: [grpc.status.CANCELLED] });
    let runs = 0;
    const tools = new ToolSet();
    tools.register("issue_refund", () => { runs++; return {}; });
    const guard = new Guard(client, CONTEXT, tools);
    const one = await guard.run("c1", "issue_refund", "{}");
    const turn = await guard.runTurn([["t1", "issue_refund", "{}"], ["t2", "issue_refund", "{}"]]);
    assert.deepEqual([one, ...turn].map((r) => [r.status, r.code, r.executed, r.reported]),
      Array(3).fill(["failed", "authorization_unavailable", false, "recorded"]));
    assert.match(one.content, /right now/);
    assert.equal(runs, 0);
    assert.equal(attempts.get("Authorize"), 1);
    assert.equal(attempts.get("AuthorizeBatch"), 1);
    assert.equal(attempts.get("ReportOutcome"), 3);
    client.close();
  });
});
