/**
 * The client's adaptive throttle against a grpc-js server in this process that answers
 * every method as the test says (overloaded, healthy, marking its answers congested, ...)
 * and counts the calls it got.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { create, toBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";

import { AuthzClient, RpcError } from "../src/client.js";
import { Principal, ProposedCall, TrustedContext } from "../src/context.js";
import * as pb from "../src/gen/toolauthz/v1/authorizer_pb.js";
import { RetryPolicy } from "../src/retry.js";
import { AdaptiveThrottle, CONGESTED_METADATA, ThrottledError, ThrottlePolicy } from "../src/throttle.js";
import { seeded } from "./support.js";

const CONTEXT = new TrustedContext("acme", new Principal("User", "alice"), "run-1");
const CALL = new ProposedCall("c1", "issue_refund", "{}");
const CALLS = 200;
const RE = grpc.status.RESOURCE_EXHAUSTED;

/** method name, its attempt number for this test (1-based) -> a status to fail with, or null for OK. */
let answer: (name: string, attempt: number) => grpc.status | null = () => null;
/** method name -> the value of the congestion mark in its trailing metadata, or null for none. */
let mark: (name: string) => string | null = () => null;
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
      const trailer = new grpc.Metadata();
      const value = mark(name);
      if (value !== null) trailer.set(CONGESTED_METADATA, value);
      if (status !== null) return callback({ code: status, details: "scripted", metadata: trailer }, null);
      const ok = name === "Verify" ? toBinary(pb.VerifyResponseSchema, create(pb.VerifyResponseSchema, { valid: true }))
        : new Uint8Array(0);
      callback(null, Buffer.from(ok), trailer);
    };
  }
  server.addService(definition, handlers);
  const port = await new Promise<number>((resolve, reject) => server.bindAsync("127.0.0.1:0",
    grpc.ServerCredentials.createInsecure(), (error, bound) => (error ? reject(error) : resolve(bound))));
  target = `127.0.0.1:${port}`;
});
after(() => server.forceShutdown());

/** A server that answers as `how` from now on, marking as `marks` says (default: never), with its counts at zero. */
function serve(how: typeof answer, marks: typeof mark = () => null): void {
  answer = how;
  mark = marks;
  received.clear();
}

/**
 * p after `signals` calls sent one after another, each answered with a signal (a refusal, or
 * with `mark` a marked answer), from 0 with a stopped clock: the first 20 (minRequests) were
 * sent at 0 and set 1 - backoff once together; each later one was sent at the p the one
 * before set, so the share let through shrinks backoff-fold per call (0.5 for a refusal, 0.8
 * for a mark): 1 - backoff^(n - 19), up to 0.999.
 */
function raised(signals: number, mark = false): number {
  const { markBackoff, refusalBackoff } = new ThrottlePolicy();
  const backoff = mark ? markBackoff : refusalBackoff;
  let p = 0;
  for (let i = 1; i <= signals; i++) p = Math.max(p, Math.min(0.999, 1 - (1 - (i <= 20 ? 0 : p)) * backoff));
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
    // The first 20 (minRequests) all reach it, sent at 0, and leave p at 0.5; with the clock
    // stopped (no decay) each further refusal halves the share let through, so the k-th one
    // after them takes ~2^k calls: 180 calls send about 8 more (p then at the 0.999 cap, one
    // in 1000 still goes through). Expected ~28.
    const reached = received.get("Authorize") ?? 0;
    assert.ok(reached >= 20 && reached < 80, `the sidecar received ${reached} of ${CALLS}`);
    assert.equal(local + reached, CALLS);
    assert.deepEqual(new Set(codes), new Set(["RESOURCE_EXHAUSTED"]));
    assert.equal(throttle.rejectionProbability(), raised(reached)); // one back-off per refusal, none per local one
    client.close();
  });

  test("the default client throttles too (real clock and Math.random)", async () => {
    serve(() => RE);
    const client = new AuthzClient(target);
    assert.ok(client.throttle instanceof AdaptiveThrottle);
    assert.equal(client.throttle.policy.refusalBackoff, 0.5);
    const { codes } = await authorizeMany(client, CALLS);
    const reached = received.get("Authorize") ?? 0;
    // Expected ~36 (above, and p decays by a few percent in the fraction of a second this
    // takes); 80 would take dozens of draws against p ~ 0.97 all coming up.
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
    // The first 20 set 0.5, then about 4 of the other 30 reach it as p climbs: 1 - 0.5^5 = 0.97.
    const shut = throttle.rejectionProbability();
    assert.equal(shut, raised(received.get("Authorize") ?? 0));
    assert.ok(shut > 0.8, `p after 50 refused calls: ${shut}`);
    serve(() => null);
    clock.ms = 10_000; // two half-lives: p ~ 0.24, and the window's counts are gone
    near(throttle.rejectionProbability(), 0, 0); // below the floor again
    const { codes, local } = await authorizeMany(client, CALLS);
    // p from ~0.24 down by 0.01 per accept (the clock stays at 10 s): 0 after ~24 accepts.
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
    // 20 requests, 20 refusals of calls sent at 0: one back-off, to 0.5 (counted apart, 1 - 0.5^20).
    assert.equal(throttle.rejectionProbability(), raised(20));
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
    near(throttle.rejectionProbability(), raised(20) - 10 * throttle.policy.recovery, 1e-12);
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

describe("a sidecar that marks its answers congested (trailing metadata toolauthz-congested: 1)", () => {
  const OK = () => null;

  test("the mark's name is the sidecar's, as on the wire", () => {
    assert.equal(CONGESTED_METADATA, "toolauthz-congested"); // toolauthz/service/authorizer.py, CONGESTED_METADATA
  });
  const MARKED = (name: string) => (name === "Verify" ? null : "1");

  test("every Authorize answered and marked: p rises, more gently than with refusals, and the client refuses calls itself", async () => {
    serve(OK, MARKED);
    const { client, throttle } = throttledClient();
    const { codes, local } = await authorizeMany(client, CALLS);
    const reached = received.get("Authorize") ?? 0;
    // The first 20 set 0.2, then each marked answer cuts the share sent by a fifth: ~16 of the
    // other 180 reach it as p climbs (refusals, halving it, let fewer through).
    assert.ok(reached >= 20 && reached < 80, `the sidecar received ${reached} of ${CALLS}`);
    assert.ok(local > 100, `${local} calls refused here`);
    assert.equal(local + reached, CALLS);
    assert.equal(codes.filter((code) => code === "OK").length, reached); // every call sent succeeded
    assert.equal(throttle.rejectionProbability(), raised(reached, true)); // one back-off per marked answer
    client.close();
  });

  test("the same answers unmarked leave p at 0: every call reaches it", async () => {
    serve(OK);
    const { client, throttle } = throttledClient(() => 0); // refuses whenever p > 0
    const { codes, local } = await authorizeMany(client, CALLS);
    assert.equal(local, 0);
    assert.equal(received.get("Authorize"), CALLS);
    assert.ok(codes.every((code) => code === "OK"));
    assert.equal(throttle.rejectionProbability(), 0);
    client.close();
  });

  test("the key with another value is no mark", async () => {
    for (const value of ["0", "true", "11"]) {
      serve(OK, (name) => (name === "Verify" ? null : value));
      const { client, throttle } = throttledClient(() => 0);
      const { local } = await authorizeMany(client, 30);
      assert.equal(local, 0, value);
      assert.equal(received.get("Authorize"), 30, value);
      assert.equal(throttle.rejectionProbability(), 0, value);
      client.close();
    }
  });

  test("AuthorizeBatch answers marked count too", async () => {
    serve(OK, MARKED);
    const { client, throttle } = throttledClient(() => 1); // nothing refused here: each batch is answered
    for (let i = 0; i < 25; i++) await client.authorizeBatch(CONTEXT, [CALL]);
    assert.equal(received.get("AuthorizeBatch"), 25);
    assert.equal(throttle.rejectionProbability(), raised(25, true));
    client.close();
  });

  test("the mark on the attempt that succeeds after a retry counts", async () => {
    serve((_name, attempt) => (attempt % 2 === 1 ? grpc.status.UNAVAILABLE : null), MARKED);
    const { client, throttle } = throttledClient(() => 1);
    const { codes } = await authorizeMany(client, 25);
    assert.equal(received.get("Authorize"), 50);
    assert.ok(codes.every((code) => code === "OK"));
    assert.equal(throttle.rejectionProbability(), raised(25, true));
    client.close();
  });

  test("a mark on a failure is not read: the failure's code decides", async () => {
    serve(() => grpc.status.INVALID_ARGUMENT, MARKED);
    const { client, throttle } = throttledClient(() => 0);
    const { codes, local } = await authorizeMany(client, 30);
    assert.equal(local, 0);
    assert.ok(codes.every((code) => code === "INVALID_ARGUMENT"));
    assert.equal(throttle.rejectionProbability(), 0);
    client.close();
  });

  test("Verify answers are never counted, even marked", async () => {
    serve(OK); // fill the window past the floor with unmarked Authorize answers
    const { client, throttle } = throttledClient(() => 0);
    await authorizeMany(client, 20);
    serve(OK, (name) => (name === "Verify" ? "1" : null));
    for (let i = 0; i < 50; i++) assert.equal((await client.verify("token", CONTEXT, CALL)).valid, true);
    assert.equal(received.get("Verify"), 50);
    // Had one marked Verify counted, p would be 0.2 or more, and with random 0 every call below refused here.
    assert.equal(throttle.rejectionProbability(), 0);
    const { local } = await authorizeMany(client, 10);
    assert.equal(local, 0);
    client.close();
  });
});
