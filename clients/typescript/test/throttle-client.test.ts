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
import { seeded } from "./support.js";

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

/** p after `refusals` sidecar refusals from 0 with a stopped clock: each adds step * (1 - target), up to 0.999. */
function raised(refusals: number): number {
  const policy = new ThrottlePolicy();
  let p = 0;
  for (let i = 0; i < refusals; i++) p = Math.min(0.999, p + policy.step * (1 - policy.target));
  return p;
}

/** A client whose throttle has a stopped clock (moved by hand) and a seeded random source. */
function throttledClient(random: () => number = seeded(42)) {
  const clock = { ms: 0 };
  const throttle = new AdaptiveThrottle(new ThrottlePolicy(), { clockMs: () => clock.ms, random });
  const client = new AuthzClient(target, { throttle, retry: new RetryPolicy({ initialBackoffMs: 1, maxBackoffMs: 2 }) });
  return { clock, client, throttle };
}

function near(actual: number, expected: number, tolerance: number): void {
  assert.ok(Math.abs(actual - expected) <= tolerance, `${actual} is not within ${tolerance} of ${expected}`);
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
    // The first 20 (minRequests) all reach it, and leave p at 20 * 0.0455 = 0.91; with the
    // clock stopped (no decay) each further refusal adds 0.0455, so after 22 p is at its cap,
    // 0.999: a handful more reach it, and then about 1 in 1000. Expected ~22.
    const reached = received.get("Authorize") ?? 0;
    assert.ok(reached >= 20 && reached < 80, `the sidecar received ${reached} of ${CALLS}`);
    assert.equal(local + reached, CALLS);
    assert.deepEqual(new Set(codes), new Set(["RESOURCE_EXHAUSTED"]));
    assert.equal(throttle.rejectionProbability(), raised(reached)); // one step per refusal, none per local one
    client.close();
  });

  test("the default client throttles too (real clock and Math.random)", async () => {
    serve(() => RE);
    const client = new AuthzClient(target);
    assert.ok(client.throttle instanceof AdaptiveThrottle);
    assert.equal(client.throttle.policy.multiplier, 1.1);
    const { codes } = await authorizeMany(client, CALLS);
    const reached = received.get("Authorize") ?? 0;
    // Expected ~25 (above, and p decays by a few percent in the fraction of a second this
    // takes); 80 would take dozens of draws against p ~ 0.95 all coming up.
    assert.ok(reached >= 20 && reached < 80, `the sidecar received ${reached} of ${CALLS}`);
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

  test("once the sidecar recovers, the decay and its accepts bring p to 0: every call reaches it", async () => {
    serve(() => RE);
    const { clock, client, throttle } = throttledClient(seeded(7));
    await authorizeMany(client, 50);
    const shut = throttle.rejectionProbability();
    assert.ok(shut > 0.9, `p after 50 refused calls: ${shut}`);
    serve(() => null);
    clock.ms = 10_000; // two half-lives: p ~ 0.25, and the window's counts are gone
    near(throttle.rejectionProbability(), 0, 0); // below the floor again
    const { codes, local } = await authorizeMany(client, CALLS);
    // p from ~0.25 down by 0.0045 per accept (the clock stays at 10 s): 0 after ~55 accepts.
    assert.ok(local < 30, `${local} calls refused here after the sidecar recovered`);
    assert.equal(received.get("Authorize"), CALLS - local);
    assert.ok(codes.slice(100).every((code) => code === "OK"), codes.slice(100).join());
    assert.ok(codes.every((code) => code === "OK" || code === "RESOURCE_EXHAUSTED"));
    assert.equal(throttle.rejectionProbability(), 0);
    client.close();
  });
});

describe("retries and the throttle", () => {
  test("one admit per call and one answer, the final one: not one per attempt", async () => {
    // Each call: UNAVAILABLE (retried once), then RESOURCE_EXHAUSTED. Admitted per attempt,
    // 15 calls would fill the window to 30 requests, past the floor of 20; answered per
    // attempt, each UNAVAILABLE would lower p between the refusals.
    serve((_name, attempt) => (attempt % 2 === 1 ? grpc.status.UNAVAILABLE : RE));
    const { client, throttle } = throttledClient(() => 1); // 1 is never below p: nothing refused
    const first = await authorizeMany(client, 15);
    assert.equal(received.get("Authorize"), 30);
    assert.equal(throttle.rejectionProbability(), 0); // 15 requests: below the floor
    const rest = await authorizeMany(client, 5);
    assert.equal(received.get("Authorize"), 40);
    assert.ok([...first.codes, ...rest.codes].every((code) => code === "RESOURCE_EXHAUSTED"));
    assert.equal(throttle.rejectionProbability(), raised(20)); // 20 requests, 20 refusals, nothing else
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

  test("DEADLINE_EXCEEDED is not an overload: it lowers p like an accept", async () => {
    serve(() => RE);
    const { client, throttle } = throttledClient(() => 1); // nothing refused here
    await authorizeMany(client, 20);
    assert.equal(throttle.rejectionProbability(), raised(20));
    serve(() => grpc.status.DEADLINE_EXCEEDED);
    const { codes } = await authorizeMany(client, 10);
    assert.equal(received.get("Authorize"), 10); // not retried
    assert.ok(codes.every((code) => code === "DEADLINE_EXCEEDED"));
    const { step, target } = throttle.policy;
    near(throttle.rejectionProbability(), raised(20) - 10 * step * target, 1e-12);
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
