/**
 * The adaptive throttle on its own (src/throttle.ts), with a hand-moved clock and a
 * scripted random source: the formula, the floor, the window, which answers are accepts.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { RpcError } from "../src/client.js";
import { AdaptiveThrottle, ThrottledError, ThrottlePolicy } from "../src/throttle.js";

/** A throttle whose clock is `clock.ms` and whose random source never refuses (1 is never below p). */
function counting(init: ConstructorParameters<typeof ThrottlePolicy>[0] = {}) {
  const clock = { ms: 0, random: 1 };
  const throttle = new AdaptiveThrottle(new ThrottlePolicy(init), { clockMs: () => clock.ms,
    random: () => clock.random });
  return { clock, throttle };
}

/** `requests` admitted calls, the first `accepts` of them answered with a response, the rest RESOURCE_EXHAUSTED. */
function fill(throttle: AdaptiveThrottle, requests: number, accepts: number): void {
  for (let i = 0; i < requests; i++) {
    throttle.admit();
    throttle.answered(i < accepts ? null : "RESOURCE_EXHAUSTED");
  }
}

describe("ThrottlePolicy", () => {
  test("the defaults are the Python SDK's", () => {
    const policy = new ThrottlePolicy();
    assert.equal(policy.multiplier, 1.1);
    assert.equal(policy.windowSeconds, 10);
    assert.equal(policy.minRequests, 20);
    assert.ok(Object.isFrozen(policy));
  });

  test("bad values throw; the edges of the ranges are allowed", () => {
    for (const multiplier of [0.99, 0, -1, NaN, Infinity]) {
      assert.throws(() => new ThrottlePolicy({ multiplier }), RangeError, `multiplier ${multiplier}`);
    }
    for (const windowSeconds of [0, -1, 3600.5, NaN, Infinity]) {
      assert.throws(() => new ThrottlePolicy({ windowSeconds }), RangeError, `windowSeconds ${windowSeconds}`);
    }
    for (const minRequests of [-1, 1.5, NaN, Infinity]) {
      assert.throws(() => new ThrottlePolicy({ minRequests }), RangeError, `minRequests ${minRequests}`);
    }
    const edges = new ThrottlePolicy({ multiplier: 1, windowSeconds: 3600, minRequests: 0 });
    assert.deepEqual([edges.multiplier, edges.windowSeconds, edges.minRequests], [1, 3600, 0]);
    assert.throws(() => new AdaptiveThrottle({ multiplier: 1, windowSeconds: 1, minRequests: 0 } as ThrottlePolicy),
      TypeError);
  });
});

describe("AdaptiveThrottle", () => {
  test("the probability at exact points", () => {
    const cases: [Parameters<typeof counting>[0], number, number, number][] = [
      [{}, 30, 10, (30 - 1.1 * 10) / 31], // ~ 19/31
      [{}, 30, 0, 30 / 31],
      [{}, 20, 0, 20 / 21], // exactly minRequests: throttled
      [{}, 30, 28, 0], // 30 - 30.8 < 0
      [{}, 110, 100, 0], // 110 - 110 = 0: the sidecar accepts enough
      [{ multiplier: 2 }, 40, 10, 20 / 41],
      [{ minRequests: 0 }, 1, 0, 1 / 2],
    ];
    for (const [init, requests, accepts, expected] of cases) {
      const { throttle } = counting(init);
      fill(throttle, requests, accepts);
      assert.equal(throttle.rejectionProbability(), expected, `${requests} requests, ${accepts} accepts`);
    }
    assert.ok(Math.abs((30 - 1.1 * 10) / 31 - 19 / 31) < 1e-12);
  });

  test("nothing is refused while the window holds fewer than minRequests", () => {
    const { clock, throttle } = counting();
    clock.random = 0; // refuses whenever p > 0
    fill(throttle, 19, 0); // 19 admitted, all overloaded
    assert.equal(throttle.rejectionProbability(), 0);
    throttle.admit(); // p from 19 requests: 0, admitted although the sidecar accepted nothing
    throttle.answered("RESOURCE_EXHAUSTED");
    assert.equal(throttle.rejectionProbability(), 20 / 21);
    assert.throws(() => throttle.admit(), ThrottledError); // 20 requests: now refused
  });

  test("the probability is computed before the new request is counted", () => {
    const { clock, throttle } = counting({ minRequests: 0 });
    clock.random = 0;
    throttle.admit(); // from (0, 0): p = 0; counting first would make it 1/2 and refuse
    assert.throws(() => throttle.admit(), (e: ThrottledError) => e.requests === 1 && e.accepts === 0);
  });

  test("a refused call is counted as a request", () => {
    const { clock, throttle } = counting();
    fill(throttle, 20, 0);
    clock.random = 0;
    assert.throws(() => throttle.admit(), ThrottledError);
    assert.throws(() => throttle.admit(), ThrottledError);
    assert.equal(throttle.rejectionProbability(), 22 / 23);
  });

  test("the local refusal is an RpcError RESOURCE_EXHAUSTED that says what happened", () => {
    const { clock, throttle } = counting();
    fill(throttle, 25, 2);
    clock.random = 0;
    assert.throws(() => throttle.admit(), (e: unknown) => {
      assert.ok(e instanceof RpcError && e instanceof ThrottledError);
      assert.equal(e.code, "RESOURCE_EXHAUSTED");
      assert.equal(e.details, "throttled by the client: the sidecar accepted 2 of the last 25 calls "
        + "(adaptive throttling); retry later");
      assert.equal(e.message, `RESOURCE_EXHAUSTED: ${e.details}`);
      assert.equal(e.name, "ThrottledError");
      assert.equal(RpcError.of(e), e);
      return true;
    });
  });

  test("the random source decides against p", () => {
    const { clock, throttle } = counting();
    fill(throttle, 30, 10); // p = 19/31 ~ 0.613
    clock.random = 0.61; // below p: refused, and counted
    assert.throws(() => throttle.admit(), ThrottledError);
    clock.random = 0.62; // p is now (31 - 11) / 32 = 0.625
    assert.throws(() => throttle.admit(), ThrottledError);
    clock.random = 0.7; // p is now (32 - 11) / 33 ~ 0.636
    throttle.admit(); // above p: let through
  });

  test("buckets expire after the window: counts drop to zero and nothing is refused", () => {
    const { clock, throttle } = counting(); // 10 s window, 1 s buckets
    fill(throttle, 30, 0);
    clock.ms = 9_999; // still the same window
    assert.equal(throttle.rejectionProbability(), 30 / 31);
    clock.ms = 10_000; // the first bucket fell out
    assert.equal(throttle.rejectionProbability(), 0);
    clock.random = 0;
    for (let i = 0; i < 19; i++) throttle.admit(); // from zero again: 19 below the floor
  });

  test("only the buckets older than the window expire", () => {
    const { clock, throttle } = counting();
    fill(throttle, 20, 0); // at 0 s
    clock.ms = 5_000;
    fill(throttle, 25, 0); // at 5 s
    assert.equal(throttle.rejectionProbability(), 45 / 46);
    clock.ms = 10_500; // the 0 s bucket is gone, the 5 s one stays
    assert.equal(throttle.rejectionProbability(), 25 / 26);
    clock.ms = 15_000;
    assert.equal(throttle.rejectionProbability(), 0);
  });

  test("a long quiet spell clears everything; a clock that steps back reuses the newest bucket", () => {
    const { clock, throttle } = counting();
    fill(throttle, 30, 0);
    clock.ms = 1_000_000;
    assert.equal(throttle.rejectionProbability(), 0);
    fill(throttle, 30, 0);
    clock.ms = 500_000; // backwards: the counts stay
    assert.equal(throttle.rejectionProbability(), 30 / 31);
    clock.ms = 1_000_000 + 10_000; // ten seconds after the newest bucket
    assert.equal(throttle.rejectionProbability(), 0);
  });

  test("RESOURCE_EXHAUSTED and DEADLINE_EXCEEDED are not accepts; every other answer is", () => {
    const overloads = ["RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"];
    const accepts = [null, "UNAVAILABLE", "INVALID_ARGUMENT", "PERMISSION_DENIED", "FAILED_PRECONDITION",
      "INTERNAL", "CANCELLED", "UNKNOWN", "NOT_FOUND"];
    for (const code of [...overloads, ...accepts]) {
      const { throttle } = counting();
      for (let i = 0; i < 30; i++) {
        throttle.admit();
        throttle.answered(code);
      }
      assert.equal(throttle.rejectionProbability(), overloads.includes(code as string) ? 30 / 31 : 0, String(code));
    }
  });

  test("the default clock is real time: a fresh throttle refuses nothing", () => {
    const throttle = new AdaptiveThrottle();
    assert.equal(throttle.policy.minRequests, 20);
    for (let i = 0; i < 19; i++) {
      throttle.admit();
      throttle.answered("RESOURCE_EXHAUSTED");
    }
    assert.equal(throttle.rejectionProbability(), 0);
  });
});
