/**
 * The client's adaptive throttle against a grpc-js server in this process that answers
 * every method as the test says (overloaded, healthy, ...) and counts the calls it got.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { create, toBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";

import { AuthzClient, RpcError } from "../src/client.js";
import { Principal, ProposedCall, TrustedContext } from "../src/context.js";
import * as pb from "../src/gen/toolauthz/v1/authorizer_pb.js";
import { RetryPolicy } from "../src/retry.js";
import { AdaptiveThrottle, ThrottledError, ThrottlePolicy } from "../src/throttle.js";

const CONTEXT = new TrustedContext("acme", new Principal("User", "alice"), "run-1");
const CALL = new ProposedCall("c1", "issue_refund", "{}");
const CALLS = 200;
const RE = grpc.status.RESOURCE_EXHAUSTED;

/** method name, its attempt number for this test (1-based) -> a status to fail with, or null for OK. */
let answer: (name: string, attempt: number) => grpc.status | null = () => null;
const received = new Map<string, number>();
let server: grpc.Server;
let target: string;

before(async () => {
  server = new grpc.Server();
  const methods = ["Authorize", "AuthorizeBatch", "Verify"];
  const definition: Record<string, grpc.MethodDefinition<Buffer, Buffer>> = {};
  const handlers: grpc.UntypedServiceImplementation = {};
  for (const name of methods) {
    definition[name] = { path: `/toolauthz.v1.ToolAuthorizer/${name}`, requestStream: false, responseStream: false,
      requestSerialize: (b: Buffer) => b, requestDeserialize: (b: Buffer) => b,
      responseSerialize: (b: Buffer) => b, responseDeserialize: (b: Buffer) => b };
    handlers[name] = (_call: grpc.ServerUnaryCall<Buffer, Buffer>, callback: grpc.sendUnaryData<Buffer>) => {
      const attempt = (received.get(name) ?? 0) + 1;
      received.set(name, attempt);
      const status = answer(name, attempt);
      if (status !== null) return callback({ code: status, details: "scripted" }, null);
      const ok = name === "Verify" ? toBinary(pb.VerifyResponseSchema, create(pb.VerifyResponseSchema, { valid: true }))
        : new Uint8Array(0);
      callback(null, Buffer.from(ok));
    };
  }
  server.addService(definition, handlers);
  const port = await new Promise<number>((resolve, reject) => server.bindAsync("127.0.0.1:0",
    grpc.ServerCredentials.createInsecure(), (error, bound) => (error ? reject(error) : resolve(bound))));
  target = `127.0.0.1:${port}`;
});
after(() => server.forceShutdown());

/** A server that answers as `how` from now on, with its counts at zero. */
function serve(how: typeof answer): void {
  answer = how;
  received.clear();
}

/** A deterministic random source in [0, 1) (mulberry32), so each run refuses the same calls. */
function seeded(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A client whose throttle has a stopped clock (moved by hand) and a seeded random source. */
function throttledClient(random: () => number = seeded(42)) {
  const clock = { ms: 0 };
  const throttle = new AdaptiveThrottle(new ThrottlePolicy(), { clockMs: () => clock.ms, random });
  const client = new AuthzClient(target, { throttle, retry: new RetryPolicy({ initialBackoffMs: 1, maxBackoffMs: 2 }) });
  return { clock, client, throttle };
}

/** `count` Authorize calls one after another; their failures' codes, in order ("OK" for a response). */
async function authorizeMany(client: AuthzClient, count: number): Promise<{ codes: string[]; local: number }> {
  const codes: string[] = [];
  let local = 0;
  for (let i = 0; i < count; i++) {
    try {
      await client.authorize(CONTEXT, CALL);
      codes.push("OK");
    } catch (error) {
      assert.ok(error instanceof RpcError, String(error));
      if (error instanceof ThrottledError) local++;
      codes.push(error.code);
    }
  }
  return { codes, local };
}

describe("a sidecar that refuses every Authorize (RESOURCE_EXHAUSTED)", () => {
  test("most calls are refused in the client, and every one fails closed with RESOURCE_EXHAUSTED", async () => {
    serve((name) => (name === "Verify" ? null : RE));
    const { client, throttle } = throttledClient();
    const { codes, local } = await authorizeMany(client, CALLS);
    // The first 20 (minRequests) all reach it; after r requests with no accept, a call
    // reaches it with probability 1 - r/(r+1) = 1/(r+1): about ln(200/21) ~ 2.3 more.
    const reached = received.get("Authorize") ?? 0;
    assert.ok(reached >= 20 && reached < 40, `the sidecar received ${reached} of ${CALLS}`);
    assert.equal(local + reached, CALLS);
    assert.deepEqual(new Set(codes), new Set(["RESOURCE_EXHAUSTED"]));
    assert.equal(throttle.rejectionProbability(), CALLS / (CALLS + 1));
    client.close();
  });

  test("the default client throttles too (real clock and Math.random)", async () => {
    serve(() => RE);
    const client = new AuthzClient(target);
    assert.ok(client.throttle instanceof AdaptiveThrottle);
    assert.equal(client.throttle.policy.multiplier, 1.1);
    const { codes } = await authorizeMany(client, CALLS);
    const reached = received.get("Authorize") ?? 0;
    // Expected ~22 (above); 100 would take dozens of 1-in-(r+1) draws all coming up.
    assert.ok(reached >= 20 && reached < 100, `the sidecar received ${reached} of ${CALLS}`);
    assert.ok(codes.every((code) => code === "RESOURCE_EXHAUSTED"));
    client.close();
  });

  test("throttle: null sends every call to the sidecar", async () => {
    serve(() => RE);
    const client = new AuthzClient(target, { throttle: null });
    assert.equal(client.throttle, null);
    const { codes, local } = await authorizeMany(client, CALLS);
    assert.equal(received.get("Authorize"), CALLS);
    assert.equal(local, 0);
    assert.ok(codes.every((code) => code === "RESOURCE_EXHAUSTED"));
    client.close();
  });

  test("AuthorizeBatch is throttled by the same counts", async () => {
    serve(() => RE);
    const { client } = throttledClient(() => 0); // refuses whenever p > 0
    await authorizeMany(client, 20);
    for (let i = 0; i < 10; i++) {
      await assert.rejects(client.authorizeBatch(CONTEXT, [CALL]), ThrottledError);
    }
    assert.equal(received.get("AuthorizeBatch"), undefined);
    client.close();
  });

  test("Verify is never throttled nor counted: the sidecar sees every one", async () => {
    serve((name) => (name === "Verify" ? null : RE));
    const { client, throttle } = throttledClient(() => 0);
    await authorizeMany(client, 100);
    assert.equal(received.get("Authorize"), 20);
    const before = throttle.rejectionProbability();
    for (let i = 0; i < 50; i++) assert.equal((await client.verify("token", CONTEXT, CALL)).valid, true);
    assert.equal(received.get("Verify"), 50);
    // Had the 50 answered Verify calls been counted (as requests or accepts), p would have moved.
    assert.equal(throttle.rejectionProbability(), before);
    client.close();
  });

  test("once the refusals leave the window and the sidecar recovers, every call reaches it", async () => {
    serve(() => RE);
    const { clock, client, throttle } = throttledClient(() => 0);
    await authorizeMany(client, 50);
    assert.equal(received.get("Authorize"), 20);
    serve(() => null);
    clock.ms = 10_000;
    const { codes } = await authorizeMany(client, CALLS);
    assert.equal(received.get("Authorize"), CALLS);
    assert.ok(codes.every((code) => code === "OK"));
    assert.equal(throttle.rejectionProbability(), 0);
    client.close();
  });
});

describe("retries and the throttle", () => {
  test("one admit per call and one answer, the final one: not one per attempt", async () => {
    // Each call: UNAVAILABLE (retried once), then RESOURCE_EXHAUSTED. Counted per call, the
    // window holds 30 requests and no accept; per attempt, 60 requests, or 30 UNAVAILABLE accepts.
    serve((_name, attempt) => (attempt % 2 === 1 ? grpc.status.UNAVAILABLE : RE));
    const { client, throttle } = throttledClient(() => 1); // 1 is never below p: nothing refused
    const { codes } = await authorizeMany(client, 30);
    assert.equal(received.get("Authorize"), 60);
    assert.ok(codes.every((code) => code === "RESOURCE_EXHAUSTED"));
    assert.equal(throttle.rejectionProbability(), 30 / 31);
    client.close();
  });

  test("UNAVAILABLE is an accept: a sidecar that is down is not throttled", async () => {
    serve(() => grpc.status.UNAVAILABLE);
    const { client, throttle } = throttledClient(() => 0);
    const { codes, local } = await authorizeMany(client, 50);
    assert.equal(local, 0);
    assert.equal(received.get("Authorize"), 100); // every call, and its one retry
    assert.ok(codes.every((code) => code === "UNAVAILABLE"));
    assert.equal(throttle.rejectionProbability(), 0);
    client.close();
  });
});

describe("a healthy sidecar", () => {
  test("every call reaches it, with the default client", async () => {
    serve(() => null);
    const client = new AuthzClient(target);
    const { codes, local } = await authorizeMany(client, CALLS);
    assert.equal(received.get("Authorize"), CALLS);
    assert.equal(local, 0);
    assert.ok(codes.every((code) => code === "OK"));
    assert.equal(client.throttle?.rejectionProbability(), 0);
    client.close();
  });

  test("every call reaches it, even when the random source would refuse any p > 0", async () => {
    serve(() => null);
    const { client } = throttledClient(() => 0);
    const { local } = await authorizeMany(client, CALLS);
    await client.authorizeBatch(CONTEXT, [CALL, CALL]);
    assert.equal(local, 0);
    assert.equal(received.get("Authorize"), CALLS);
    assert.equal(received.get("AuthorizeBatch"), 1);
    client.close();
  });
});
