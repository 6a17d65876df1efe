/**
 * The adaptive throttle on its own (src/throttle.ts), with a hand-moved clock and a
 * scripted or seeded random source: the controller's steps, its decay, the floor, the
 * window, which answers are overloads; then its dynamics against a simulated sidecar.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { RpcError } from "../src/client.js";
import { AdaptiveThrottle, formatG, ThrottledError, ThrottlePolicy } from "../src/throttle.js";
import { seeded } from "./support.js";

const STEP = 0.05;
const TARGET = 1 - 1 / 1.1; // 1/11
const UP = STEP * (1 - TARGET); // ~0.04545 per sidecar refusal
const DOWN = STEP * TARGET; // ~0.004545 per other answer

/** A throttle whose clock is `clock.ms` and whose random source is `clock.random` (1: never refuses). */
function counting(init: ConstructorParameters<typeof ThrottlePolicy>[0] = {}) {
  const clock = { ms: 0, random: 1 };
  const throttle = new AdaptiveThrottle(new ThrottlePolicy(init), { clockMs: () => clock.ms,
    random: () => clock.random });
  return { clock, throttle };
}

/** `count` admitted calls, each answered with `code` (null: a response). */
function fill(throttle: AdaptiveThrottle, count: number, code: string | null): void {
  for (let i = 0; i < count; i++) {
    throttle.admit();
    throttle.answered(code);
  }
}

/** p as the controller computes it after `refusals` refusals from 0, with a frozen clock. */
function raised(refusals: number): number {
  let p = 0;
  for (let i = 0; i < refusals; i++) p = Math.min(0.999, p + UP);
  return p;
}

function near(actual: number, expected: number, tolerance: number, message?: string): void {
  assert.ok(Math.abs(actual - expected) <= tolerance, `${message ?? ""} ${actual} is not within ${tolerance} of ${expected}`);
}

describe("ThrottlePolicy", () => {
  test("the defaults are the Python SDK's", () => {
    const policy = new ThrottlePolicy();
    assert.equal(policy.multiplier, 1.1);
    assert.equal(policy.windowSeconds, 10);
    assert.equal(policy.minRequests, 20);
    assert.equal(policy.step, 0.05);
    assert.equal(policy.halfLifeSeconds, 5);
    assert.equal(policy.target, 1 - 1 / 1.1);
    assert.equal(new ThrottlePolicy({ multiplier: 2 }).target, 0.5);
    assert.equal(new ThrottlePolicy({ multiplier: 1 }).target, 0);
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
    for (const step of [0, -0.05, 1.01, NaN, Infinity]) {
      assert.throws(() => new ThrottlePolicy({ step }), /step must be above 0 and at most 1/, `step ${step}`);
      assert.throws(() => new ThrottlePolicy({ step }), RangeError);
    }
    for (const halfLifeSeconds of [0, -5, 3600.5, NaN, Infinity]) {
      assert.throws(() => new ThrottlePolicy({ halfLifeSeconds }), /halfLifeSeconds must be between 0 and 3600/,
        `halfLifeSeconds ${halfLifeSeconds}`);
      assert.throws(() => new ThrottlePolicy({ halfLifeSeconds }), RangeError);
    }
    const edges = new ThrottlePolicy({ multiplier: 1, windowSeconds: 3600, minRequests: 0, step: 1,
      halfLifeSeconds: 3600 });
    assert.deepEqual([edges.multiplier, edges.windowSeconds, edges.minRequests, edges.step, edges.halfLifeSeconds],
      [1, 3600, 0, 1, 3600]);
    const small = new ThrottlePolicy({ step: 1e-9, halfLifeSeconds: 1e-9 });
    assert.deepEqual([small.step, small.halfLifeSeconds], [1e-9, 1e-9]);
    assert.throws(() => new AdaptiveThrottle({ multiplier: 1, windowSeconds: 1, minRequests: 0, step: 0.05,
      halfLifeSeconds: 5, target: 0 } as ThrottlePolicy), TypeError);
  });
});

describe("AdaptiveThrottle: the controller", () => {
  test("nothing is refused while the window holds fewer than minRequests", () => {
    const { clock, throttle } = counting();
    clock.random = 0; // refuses whenever p > 0
    fill(throttle, 19, "RESOURCE_EXHAUSTED"); // 19 admitted, all refused by the sidecar
    assert.equal(throttle.rejectionProbability(), 0); // p is 19 * UP inside, but the window is below the floor
    throttle.admit(); // p taken from 19 requests: 0, admitted although the sidecar refused everything
    throttle.answered("RESOURCE_EXHAUSTED");
    assert.equal(throttle.rejectionProbability(), raised(20)); // 20 requests: the floor is reached
    assert.throws(() => throttle.admit(), ThrottledError);
  });

  test("the probability is taken before the new request is counted", () => {
    const { clock, throttle } = counting({ minRequests: 1 });
    throttle.answered("RESOURCE_EXHAUSTED"); // p = UP, but no request in the window yet
    clock.random = 0;
    throttle.admit(); // from 0 requests: p = 0; counting first would refuse it
    assert.throws(() => throttle.admit(), ThrottledError);
  });

  test("after n refusals p is min(0.999, n * step * (1 - target)), exactly, with a frozen clock", () => {
    for (const n of [20, 21, 22, 25, 30]) {
      const { throttle } = counting();
      fill(throttle, n, "RESOURCE_EXHAUSTED");
      const expected = Math.min(0.999, n * STEP * (1 - TARGET));
      near(throttle.rejectionProbability(), expected, 1e-12, `${n} refusals`);
      assert.equal(throttle.rejectionProbability(), raised(n), `${n} refusals`);
    }
    const { throttle } = counting();
    fill(throttle, 22, "RESOURCE_EXHAUSTED"); // 22 * 0.04545 = 0.99999..., above the cap
    assert.equal(throttle.rejectionProbability(), 0.999);
    fill(throttle, 100, "RESOURCE_EXHAUSTED");
    assert.equal(throttle.rejectionProbability(), 0.999); // never every call
  });

  test("an accept lowers p by step * target, and never below 0", () => {
    const { throttle } = counting();
    fill(throttle, 20, "RESOURCE_EXHAUSTED");
    const before = throttle.rejectionProbability();
    fill(throttle, 1, null);
    near(throttle.rejectionProbability(), before - DOWN, 1e-12);
    fill(throttle, 10, null);
    near(throttle.rejectionProbability(), before - 11 * DOWN, 1e-12);
    fill(throttle, 1000, null); // far more than enough to reach 0
    assert.equal(throttle.rejectionProbability(), 0);
    fill(throttle, 1, "RESOURCE_EXHAUSTED"); // from 0, not from below it
    near(throttle.rejectionProbability(), UP, 1e-15);
  });

  test("one refusal per 10 answers holds p still: 1 * UP == 10 * DOWN (the balance at 1 in 11)", () => {
    const { throttle } = counting();
    fill(throttle, 20, "RESOURCE_EXHAUSTED");
    const start = throttle.rejectionProbability();
    for (let round = 0; round < 5; round++) {
      fill(throttle, 1, "RESOURCE_EXHAUSTED");
      fill(throttle, 10, null);
    }
    near(throttle.rejectionProbability(), start, 1e-12);
  });

  test("p halves every halfLifeSeconds by itself", () => {
    const { clock, throttle } = counting({ windowSeconds: 60 }); // the requests stay in the window
    fill(throttle, 20, "RESOURCE_EXHAUSTED");
    const start = throttle.rejectionProbability();
    assert.ok(start > 0.9);
    clock.ms = 5_000;
    near(throttle.rejectionProbability(), start / 2, 1e-9, "one half-life");
    clock.ms = 7_500;
    near(throttle.rejectionProbability(), start / 2 ** 1.5, 1e-9, "one and a half");
    clock.ms = 15_000;
    near(throttle.rejectionProbability(), start / 8, 1e-9, "three");
    clock.ms = 15_000; // no time passed: no decay
    near(throttle.rejectionProbability(), start / 8, 1e-9, "still three");
  });

  test("the half-life is the policy's", () => {
    const { clock, throttle } = counting({ halfLifeSeconds: 1 });
    fill(throttle, 20, "RESOURCE_EXHAUSTED");
    const start = throttle.rejectionProbability();
    clock.ms = 2_000;
    near(throttle.rejectionProbability(), start / 4, 1e-9);
  });

  test("a clock that steps back neither decays nor un-decays p, and counts in the newest bucket", () => {
    const { clock, throttle } = counting();
    clock.ms = 5_000;
    fill(throttle, 20, "RESOURCE_EXHAUSTED");
    const start = throttle.rejectionProbability();
    clock.ms = 1_000; // backwards
    assert.equal(throttle.rejectionProbability(), start);
    clock.ms = 5_000; // back where it was: still no time passed since the last decay
    assert.equal(throttle.rejectionProbability(), start);
    clock.ms = 10_000;
    near(throttle.rejectionProbability(), start / 2, 1e-9);
  });

  test("only RESOURCE_EXHAUSTED raises p; every other answer lowers it like an accept", () => {
    const others = [null, "DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED", "INVALID_ARGUMENT", "PERMISSION_DENIED",
      "FAILED_PRECONDITION", "INTERNAL", "UNKNOWN", "NOT_FOUND"];
    for (const code of others) {
      const { throttle } = counting();
      fill(throttle, 20, "RESOURCE_EXHAUSTED");
      const before = throttle.rejectionProbability();
      fill(throttle, 3, code);
      near(throttle.rejectionProbability(), before - 3 * DOWN, 1e-12, String(code));
      fill(throttle, 1000, code);
      assert.equal(throttle.rejectionProbability(), 0, String(code));
    }
    for (const code of others) {
      const { throttle } = counting();
      fill(throttle, 30, code); // a sidecar that only ever answers this: never throttled
      assert.equal(throttle.rejectionProbability(), 0, String(code));
    }
  });

  test("the random source decides against p", () => {
    const { clock, throttle } = counting();
    fill(throttle, 10, "RESOURCE_EXHAUSTED");
    fill(throttle, 10, null); // 20 requests, p = 10 * UP - 10 * DOWN
    const p = throttle.rejectionProbability();
    near(p, 10 * UP - 10 * DOWN, 1e-12);
    clock.random = p - 1e-9; // below p: refused
    assert.throws(() => throttle.admit(), ThrottledError);
    assert.equal(throttle.rejectionProbability(), p); // a refusal here does not move p
    clock.random = p; // not below p: let through
    throttle.admit();
  });

  test("buckets expire after the window; p decays on its own clock", () => {
    const { clock, throttle } = counting(); // 10 s window, 1 s buckets
    fill(throttle, 30, "RESOURCE_EXHAUSTED");
    clock.ms = 9_999; // still the same window
    near(throttle.rejectionProbability(), 0.999 * 0.5 ** (9.999 / 5), 1e-9);
    clock.ms = 10_000; // the first bucket fell out: the floor applies again
    assert.equal(throttle.rejectionProbability(), 0);
    clock.random = 0;
    for (let i = 0; i < 20; i++) throttle.admit(); // 20 admitted from an empty window
    assert.throws(() => throttle.admit(), ThrottledError); // p (decayed to ~0.25) applies again
  });

  test("only the buckets older than the window expire", () => {
    const { clock, throttle } = counting({ halfLifeSeconds: 3600 }); // next to no decay
    fill(throttle, 15, "RESOURCE_EXHAUSTED"); // at 0 s
    clock.ms = 5_000;
    fill(throttle, 10, null); // at 5 s: 25 requests in the window
    assert.ok(throttle.rejectionProbability() > 0);
    clock.ms = 10_500; // the 0 s bucket is gone: 10 requests, below the floor
    assert.equal(throttle.rejectionProbability(), 0);
    fill(throttle, 10, null); // 20 again, p still what the controller made of it
    const decay = (seconds: number) => 0.5 ** (seconds / 3600);
    near(throttle.rejectionProbability(), ((15 * UP * decay(5)) - 10 * DOWN) * decay(5.5) - 10 * DOWN, 1e-12);
  });

  test("a long quiet spell clears the buckets and p", () => {
    const { clock, throttle } = counting();
    fill(throttle, 30, "RESOURCE_EXHAUSTED");
    clock.ms = 1_000_000;
    fill(throttle, 20, null);
    assert.equal(throttle.rejectionProbability(), 0);
  });

  test("the local refusal is an RpcError RESOURCE_EXHAUSTED that says what happened", () => {
    const { clock, throttle } = counting();
    fill(throttle, 7, null);
    fill(throttle, 18, "RESOURCE_EXHAUSTED");
    clock.random = 0;
    assert.throws(() => throttle.admit(), ThrottledError); // counted as a request, not as an answer
    assert.throws(() => throttle.admit(), (e: unknown) => {
      assert.ok(e instanceof RpcError && e instanceof ThrottledError);
      assert.equal(e.code, "RESOURCE_EXHAUSTED");
      assert.equal(e.details, "throttled by the client: the sidecar refused 18 of the 25 calls it answered "
        + "in the last 10 s (adaptive throttling); retry later");
      assert.deepEqual([e.refused, e.answered, e.windowSeconds], [18, 25, 10]);
      assert.equal(e.message, `RESOURCE_EXHAUSTED: ${e.details}`);
      assert.equal(e.name, "ThrottledError");
      assert.equal(RpcError.of(e), e);
      return true;
    });
  });

  test("the window in the details is written as Python's {:g} writes it", () => {
    const { clock, throttle } = counting({ windowSeconds: 2.5 });
    fill(throttle, 20, "RESOURCE_EXHAUSTED");
    clock.random = 0;
    assert.throws(() => throttle.admit(), (e: ThrottledError) => e.details === "throttled by the client: the sidecar "
      + "refused 20 of the 20 calls it answered in the last 2.5 s (adaptive throttling); retry later");
    // format(x, "g") in Python, for each x.
    const python: [number, string][] = [[10, "10"], [2.5, "2.5"], [0.1, "0.1"], [3600, "3600"], [0.0001, "0.0001"],
      [0.00001, "1e-05"], [1e-7, "1e-07"], [123456, "123456"], [1234567, "1.23457e+06"], [100000, "100000"],
      [33.333333333, "33.3333"], [999999.5, "1e+06"], [0.000099999999, "0.0001"], [2.0000001, "2"], [0.3, "0.3"]];
    for (const [x, expected] of python) assert.equal(formatG(x), expected, String(x));
  });

  test("the default clock is real time: a fresh throttle refuses nothing", () => {
    const throttle = new AdaptiveThrottle();
    assert.equal(throttle.policy.minRequests, 20);
    fill(throttle, 19, "RESOURCE_EXHAUSTED");
    assert.equal(throttle.rejectionProbability(), 0);
  });
});

/**
 * A client asked for `rate` calls per second, one per tick of 1000/rate ms of a simulated
 * clock (1 ms at 1000/s), against a sidecar that accepts `capacity(second)` calls in each
 * whole second and refuses the rest. `onTick` sees the time and what happened.
 */
function simulate(throttle: AdaptiveThrottle, clock: { ms: number }, rate: number, fromMs: number, toMs: number,
                  capacity: (second: number) => number,
                  onTick: (ms: number, outcome: "throttled" | "accepted" | "refused") => void = () => {}): void {
  const tickMs = 1000 / rate;
  let second = -1;
  let budget = 0;
  for (let tick = Math.round(fromMs / tickMs); tick * tickMs < toMs; tick++) {
    const ms = tick * tickMs;
    clock.ms = ms;
    const now = Math.floor(ms / 1000);
    if (now !== second) {
      second = now;
      budget = capacity(now);
    }
    try {
      throttle.admit();
    } catch (error) {
      assert.ok(error instanceof ThrottledError);
      onTick(ms, "throttled");
      continue;
    }
    if (budget > 0) {
      budget--;
      throttle.answered(null);
      onTick(ms, "accepted");
    } else {
      throttle.answered("RESOURCE_EXHAUSTED");
      onTick(ms, "refused");
    }
  }
}

function simulated(seed: number) {
  const clock = { ms: 0 };
  const throttle = new AdaptiveThrottle(new ThrottlePolicy(), { clockMs: () => clock.ms, random: seeded(seed) });
  return { clock, throttle };
}

describe("AdaptiveThrottle: dynamics against a simulated sidecar", () => {
  for (const seed of [1, 2, 3]) {
    test(`1000 calls/s, a sidecar that accepts 400/s: about 1.1 times that is sent; then it recovers in seconds (seed ${seed})`, () => {
      const { clock, throttle } = simulated(seed);
      let sent = 0;
      let accepted = 0;
      let throttled = 0;
      simulate(throttle, clock, 1000, 0, 20_000, () => 400, (ms, outcome) => {
        if (ms < 10_000) return;
        if (outcome === "throttled") {
          throttled++;
          return;
        }
        sent++;
        if (outcome === "accepted") accepted++;
      });
      const ratio = sent / accepted;
      assert.ok(ratio >= 1.0 && ratio <= 1.25, `sent/accepted over the last 10 s: ${sent}/${accepted} = ${ratio}`);
      // Not starved either: the sidecar gets nearly all it can take (4000), the rest is refused here.
      assert.ok(accepted > 3600, `the sidecar accepted ${accepted} in the last 10 s, it can take 4000`);
      assert.ok(throttled > 5000, `${throttled} of 10000 calls refused here in the last 10 s`);
      let recovered = Infinity;
      let late = 0; // ticks from 3 s after recovery on with p at 0.01 or more
      simulate(throttle, clock, 1000, 20_000, 40_000, () => Infinity, (ms) => {
        const p = throttle.rejectionProbability();
        if (recovered === Infinity && p < 0.01) recovered = ms;
        if (ms >= 23_000 && p >= 0.01) late++;
      });
      assert.ok(recovered - 20_000 <= 3_000, `p fell below 0.01 ${(recovered - 20_000) / 1000} s after recovery`);
      assert.equal(late, 0, "p rose to 0.01 or more again while the sidecar accepted everything");
    });
  }

  for (const seed of [1, 2, 3]) {
    test(`a sidecar that refuses everything for 30 s, then accepts all, 100 calls/s: back within 10 s (seed ${seed})`, () => {
      const { clock, throttle } = simulated(seed);
      let reached = 0;
      simulate(throttle, clock, 100, 0, 30_000, () => 0, (_ms, outcome) => {
        if (outcome !== "throttled") reached++;
      });
      const shut = throttle.rejectionProbability();
      assert.ok(shut > 0.9, `p after 30 s of refusals: ${shut}`);
      assert.ok(reached < 600, `${reached} of 3000 calls reached a sidecar that refused them all`);
      let recovered = Infinity;
      let throttledAfter10s = 0;
      simulate(throttle, clock, 100, 30_000, 60_000, () => Infinity, (ms, outcome) => {
        if (recovered === Infinity && throttle.rejectionProbability() < 0.01) recovered = ms;
        if (ms >= 40_000 && outcome === "throttled") throttledAfter10s++;
      });
      assert.ok(recovered - 30_000 <= 10_000, `p fell below 0.01 ${(recovered - 30_000) / 1000} s after recovery`);
      clock.ms = 40_000;
      assert.ok(throttle.rejectionProbability() < 0.01);
      assert.ok(throttledAfter10s < 5, `${throttledAfter10s} calls refused here 10 s after the sidecar recovered`);
    });
  }
});
