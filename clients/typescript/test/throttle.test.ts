/**
 * The adaptive throttle on its own (src/throttle.ts), with a hand-moved clock and a
 * scripted or seeded random source: the law's back-off and recovery, its decay, the floor,
 * the window, which answers are signals; then its dynamics against a simulated sidecar.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { RpcError } from "../src/client.js";
import { AdaptiveThrottle, formatG, ThrottledError, ThrottlePolicy } from "../src/throttle.js";
import { seeded } from "./support.js";

const MARK = 0.8; // on a mark, the share let through becomes 0.8 times its share when the call was sent
const REFUSAL = 0.5; // on a refusal, half of it
const RECOVERY = 0.01; // each other answer lowers p by this

/** A throttle whose clock is `clock.ms` and whose random source is `clock.random` (1: never refuses). */
function counting(init: ConstructorParameters<typeof ThrottlePolicy>[0] = {}) {
  const clock = { ms: 0, random: 1 };
  const throttle = new AdaptiveThrottle(new ThrottlePolicy(init), { clockMs: () => clock.ms,
    random: () => clock.random });
  return { clock, throttle };
}

/** `count` admitted calls, each answered at once with `code` (null: a response), `congested` or not. */
function fill(throttle: AdaptiveThrottle, count: number, code: string | null, congested = false): void {
  for (let i = 0; i < count; i++) {
    const sentAt = throttle.admit();
    throttle.answered(code, congested, sentAt);
  }
}

/** The p a signal (a refusal unless told) sets for a call sent at `sentAt`, from a p that is lower. */
function backedOff(sentAt: number, backoff = REFUSAL): number {
  return Math.min(0.999, 1 - (1 - sentAt) * backoff);
}

/**
 * p after `signals` calls answered at once with a signal (refusals unless told), from 0 with a
 * frozen clock: the first 20 (minRequests) were sent at 0 and set 1 - backoff once together;
 * each later one is sent at the p the one before set, so they compound: 1 - backoff^(n - 19),
 * up to 0.999.
 */
function raised(signals: number, backoff = REFUSAL): number {
  let p = 0;
  for (let i = 1; i <= signals; i++) p = Math.max(p, backedOff(i <= 20 ? 0 : p, backoff));
  return p;
}

function near(actual: number, expected: number, tolerance: number, message?: string): void {
  assert.ok(Math.abs(actual - expected) <= tolerance, `${message ?? ""} ${actual} is not within ${tolerance} of ${expected}`);
}

describe("ThrottlePolicy", () => {
  test("the defaults are the Python SDK's", () => {
    const policy = new ThrottlePolicy();
    assert.equal(policy.markBackoff, 0.8);
    assert.equal(policy.refusalBackoff, 0.5);
    assert.equal(policy.recovery, 0.01);
    assert.equal(policy.windowSeconds, 10);
    assert.equal(policy.minRequests, 20);
    assert.equal(policy.halfLifeSeconds, 5);
    assert.deepEqual(Object.keys(policy).sort(), ["halfLifeSeconds", "markBackoff", "minRequests", "recovery",
      "refusalBackoff", "windowSeconds"]);
    assert.ok(Object.isFrozen(policy));
  });

  test("bad values throw; the edges of the ranges are allowed", () => {
    for (const backoff of [0, 1, -0.5, 1.5, NaN, Infinity]) {
      assert.throws(() => new ThrottlePolicy({ markBackoff: backoff }), /markBackoff must be above 0 and below 1/,
        `markBackoff ${backoff}`);
      assert.throws(() => new ThrottlePolicy({ refusalBackoff: backoff }), /refusalBackoff must be above 0 and below 1/,
        `refusalBackoff ${backoff}`);
      assert.throws(() => new ThrottlePolicy({ markBackoff: backoff }), RangeError);
    }
    for (const recovery of [0, -0.005, 1.01, NaN, Infinity]) {
      assert.throws(() => new ThrottlePolicy({ recovery }), /recovery must be above 0 and at most 1/,
        `recovery ${recovery}`);
      assert.throws(() => new ThrottlePolicy({ recovery }), RangeError);
    }
    for (const windowSeconds of [0, -1, 3600.5, NaN, Infinity]) {
      assert.throws(() => new ThrottlePolicy({ windowSeconds }), RangeError, `windowSeconds ${windowSeconds}`);
    }
    for (const minRequests of [-1, 1.5, NaN, Infinity]) {
      assert.throws(() => new ThrottlePolicy({ minRequests }), RangeError, `minRequests ${minRequests}`);
    }
    for (const halfLifeSeconds of [0, -5, 3600.5, NaN, Infinity]) {
      assert.throws(() => new ThrottlePolicy({ halfLifeSeconds }), /halfLifeSeconds must be between 0 and 3600/,
        `halfLifeSeconds ${halfLifeSeconds}`);
      assert.throws(() => new ThrottlePolicy({ halfLifeSeconds }), RangeError);
    }
    const edges = new ThrottlePolicy({ markBackoff: 0.999, refusalBackoff: 0.999, recovery: 1, windowSeconds: 3600, minRequests: 0,
      halfLifeSeconds: 3600 });
    assert.deepEqual([edges.markBackoff, edges.refusalBackoff, edges.recovery, edges.windowSeconds, edges.minRequests,
      edges.halfLifeSeconds], [0.999, 0.999, 1, 3600, 0, 3600]);
    const small = new ThrottlePolicy({ markBackoff: 1e-9, refusalBackoff: 1e-9, recovery: 1e-9, halfLifeSeconds: 1e-9 });
    assert.deepEqual([small.markBackoff, small.refusalBackoff, small.recovery, small.halfLifeSeconds],
      [1e-9, 1e-9, 1e-9, 1e-9]);
    assert.throws(() => new AdaptiveThrottle({ markBackoff: 0.8, refusalBackoff: 0.5, recovery: 0.005, windowSeconds: 1, minRequests: 0,
      halfLifeSeconds: 5 } as ThrottlePolicy), TypeError);
  });
});

describe("AdaptiveThrottle: the controller", () => {
  test("nothing is refused while the window holds fewer than minRequests", () => {
    const { clock, throttle } = counting();
    clock.random = 0; // refuses whenever p > 0
    fill(throttle, 19, "RESOURCE_EXHAUSTED"); // 19 admitted, all refused by the sidecar
    assert.equal(throttle.rejectionProbability(), 0); // p is 0.2 inside, but the window is below the floor
    assert.equal(throttle.admit(), 0); // p taken from 19 requests: 0, admitted although the sidecar refused everything
    throttle.answered("RESOURCE_EXHAUSTED", false, 0);
    assert.equal(throttle.rejectionProbability(), raised(20)); // 20 requests: the floor is reached
    assert.throws(() => throttle.admit(), ThrottledError);
  });

  test("the probability is taken before the new request is counted, and admit returns it", () => {
    const { clock, throttle } = counting({ minRequests: 1 });
    throttle.answered("RESOURCE_EXHAUSTED"); // p = 0.2, but no request in the window yet
    clock.random = 0;
    assert.equal(throttle.admit(), 0); // from 0 requests: p = 0; counting first would refuse it
    assert.throws(() => throttle.admit(), ThrottledError);
    clock.random = 0.5;
    assert.equal(throttle.admit(), backedOff(0)); // let through at p = 0.2: it says so
  });

  test("a signal for a call sent at p = s sets p to 1 - (1 - s) * backoff, at most 0.999", () => {
    for (const [sentAt, expected] of [[0, 0.2], [0.2, 0.36], [0.5, 0.6], [0.9, 0.92], [0.99, 0.992], [0.999, 0.999],
      [1, 0.999]] as const) {
      const { throttle } = counting({ minRequests: 0 });
      throttle.answered(null, true, sentAt); // a mark: 0.8
      near(throttle.rejectionProbability(), expected, 1e-12, `marked, sent at ${sentAt}`);
    }
    for (const [sentAt, expected] of [[0, 0.5], [0.2, 0.6], [0.5, 0.75], [0.999, 0.999]] as const) {
      const { throttle } = counting({ minRequests: 0 });
      throttle.answered("RESOURCE_EXHAUSTED", false, sentAt); // a refusal: 0.5, the queue at its bound
      near(throttle.rejectionProbability(), expected, 1e-12, `refused, sent at ${sentAt}`);
    }
    const { throttle } = counting({ minRequests: 0, markBackoff: 0.5, refusalBackoff: 0.25 });
    throttle.answered(null, true, 0.2);
    near(throttle.rejectionProbability(), 0.6, 1e-12, "the policy's markBackoff"); // 1 - 0.8 * 0.5
    throttle.answered("RESOURCE_EXHAUSTED", false, 0.6);
    near(throttle.rejectionProbability(), 0.9, 1e-12, "the policy's refusalBackoff"); // 1 - 0.4 * 0.25
  });

  test("signals for calls sent at one setting raise p once, not once each", () => {
    const { throttle } = counting({ minRequests: 0 });
    const first = Array.from({ length: 10 }, () => throttle.admit()); // 10 calls in flight, sent at 0
    assert.deepEqual(new Set(first), new Set([0]));
    for (const sentAt of first) throttle.answered("RESOURCE_EXHAUSTED", false, sentAt);
    near(throttle.rejectionProbability(), 0.5, 1e-12); // once: 0.5, not 1 - 0.5^10
    const second = Array.from({ length: 10 }, () => throttle.admit()); // sent at 0.5 (random 1: all let through)
    for (const sentAt of second) throttle.answered(null, true, sentAt);
    near(throttle.rejectionProbability(), 0.6, 1e-12); // the next round, marked: once more, 1 - 0.5 * 0.8
  });

  test("a signal for a call sent at a lower p than the current one does not lower p", () => {
    const { throttle } = counting({ minRequests: 0 });
    throttle.answered("RESOURCE_EXHAUSTED", false, 0.5); // p = 0.75
    for (const sentAt of [0, 0.1, 0.4, 0.5]) {
      throttle.answered("RESOURCE_EXHAUSTED", false, sentAt); // 0.5, 0.55, 0.7, 0.75: none above 0.75
      near(throttle.rejectionProbability(), 0.75, 1e-12, `sent at ${sentAt}`);
    }
    throttle.answered("RESOURCE_EXHAUSTED", false, 0.55); // 0.775: above, so it counts
    near(throttle.rejectionProbability(), 0.775, 1e-12);
  });

  test("sentAt unknown: the signal backs off from the current, decayed p, so each one compounds", () => {
    const { clock, throttle } = counting({ minRequests: 0 });
    for (let n = 1; n <= 8; n++) { // 1 - 0.5^8 = 0.996, under the 0.999 cap
      throttle.answered("RESOURCE_EXHAUSTED");
      near(throttle.rejectionProbability(), 1 - REFUSAL ** n, 1e-12, `${n} signals`);
    }
    clock.ms = 5_000; // p halves
    const decayed = (1 - REFUSAL ** 8) / 2;
    near(throttle.rejectionProbability(), decayed, 1e-9);
    throttle.answered("RESOURCE_EXHAUSTED");
    near(throttle.rejectionProbability(), backedOff(decayed), 1e-9);
  });

  test("sentAt must be a probability: NaN would stick in p", () => {
    const { clock, throttle } = counting({ minRequests: 0 });
    for (const sentAt of [NaN, -0.1, 1.1, Infinity]) {
      assert.throws(() => throttle.answered("RESOURCE_EXHAUSTED", false, sentAt), /sentAt must be between 0 and 1/);
      assert.throws(() => throttle.answered(null, false, sentAt), RangeError);
    }
    assert.equal(throttle.rejectionProbability(), 0);
    throttle.answered("RESOURCE_EXHAUSTED", false, 0);
    clock.random = 0;
    assert.throws(() => throttle.admit(), (e: ThrottledError) => e.refused === 1 && e.answered === 1); // none counted
  });

  test("a congestion mark on a response raises p, more gently than a refusal, and counts as a signal", () => {
    const { clock, throttle } = counting();
    fill(throttle, 25, null, true); // responses, every one marked
    assert.equal(throttle.rejectionProbability(), raised(25, MARK));
    clock.random = 0;
    assert.throws(() => throttle.admit(), (e: ThrottledError) => e.details === "throttled by the client: the sidecar "
      + "refused or marked congested 25 of the 25 calls it answered in the last 10 s (adaptive throttling); retry later");
    const unmarked = counting();
    fill(unmarked.throttle, 25, null, false);
    assert.equal(unmarked.throttle.rejectionProbability(), 0);
  });

  test("a mark counts on a response only: with a failure's code it is an ordinary answer", () => {
    for (const code of ["DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED", "INVALID_ARGUMENT", "INTERNAL"]) {
      const { throttle } = counting();
      fill(throttle, 30, "RESOURCE_EXHAUSTED");
      const before = throttle.rejectionProbability();
      throttle.answered(code, true, 0);
      near(throttle.rejectionProbability(), before - RECOVERY, 1e-12, code);
      const fresh = counting();
      fill(fresh.throttle, 30, code, true);
      assert.equal(fresh.throttle.rejectionProbability(), 0, code);
    }
    const { throttle } = counting(); // a marked refusal is one signal, as an unmarked one
    fill(throttle, 30, "RESOURCE_EXHAUSTED", true);
    assert.equal(throttle.rejectionProbability(), raised(30));
  });

  test("each other answer lowers p by recovery, and never below 0", () => {
    const { throttle } = counting();
    fill(throttle, 30, "RESOURCE_EXHAUSTED");
    const before = throttle.rejectionProbability();
    fill(throttle, 1, null);
    near(throttle.rejectionProbability(), before - RECOVERY, 1e-12);
    fill(throttle, 10, null);
    near(throttle.rejectionProbability(), before - 11 * RECOVERY, 1e-12);
    fill(throttle, 1000, null); // far more than enough to reach 0
    assert.equal(throttle.rejectionProbability(), 0);
    throttle.answered("RESOURCE_EXHAUSTED"); // from 0, not from below it
    near(throttle.rejectionProbability(), 0.5, 1e-15);
    const custom = counting({ recovery: 0.1 });
    fill(custom.throttle, 30, "RESOURCE_EXHAUSTED");
    fill(custom.throttle, 3, null);
    near(custom.throttle.rejectionProbability(), raised(30) - 0.3, 1e-12, "the policy's recovery");
  });

  test("p halves every halfLifeSeconds by itself", () => {
    const { clock, throttle } = counting({ windowSeconds: 60 }); // the requests stay in the window
    fill(throttle, 40, "RESOURCE_EXHAUSTED");
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
      fill(throttle, 30, "RESOURCE_EXHAUSTED");
      const before = throttle.rejectionProbability();
      fill(throttle, 3, code);
      near(throttle.rejectionProbability(), before - 3 * RECOVERY, 1e-12, String(code));
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
    fill(throttle, 10, null); // 20 requests, all sent at 0: p = 0.5 - 10 * RECOVERY
    const p = throttle.rejectionProbability();
    near(p, 0.5 - 10 * RECOVERY, 1e-12);
    clock.random = p - 1e-9; // below p: refused
    assert.throws(() => throttle.admit(), ThrottledError);
    assert.equal(throttle.rejectionProbability(), p); // a refusal here does not move p
    clock.random = p; // not below p: let through
    assert.equal(throttle.admit(), p);
  });

  test("buckets expire after the window; p decays on its own clock", () => {
    const { clock, throttle } = counting(); // 10 s window, 1 s buckets
    fill(throttle, 30, "RESOURCE_EXHAUSTED");
    clock.ms = 9_999; // still the same window
    near(throttle.rejectionProbability(), raised(30) * 0.5 ** (9.999 / 5), 1e-9);
    clock.ms = 10_000; // the first bucket fell out: the floor applies again
    assert.equal(throttle.rejectionProbability(), 0);
    clock.random = 0;
    for (let i = 0; i < 20; i++) throttle.admit(); // 20 admitted from an empty window
    assert.throws(() => throttle.admit(), ThrottledError); // p (decayed to ~0.23) applies again
  });

  test("only the buckets older than the window expire", () => {
    const { clock, throttle } = counting({ halfLifeSeconds: 3600 }); // next to no decay
    fill(throttle, 15, "RESOURCE_EXHAUSTED"); // at 0 s, all sent at 0: p = 0.5
    clock.ms = 5_000;
    fill(throttle, 10, null); // at 5 s: 25 requests in the window
    assert.ok(throttle.rejectionProbability() > 0);
    clock.ms = 10_500; // the 0 s bucket is gone: 10 requests, below the floor
    assert.equal(throttle.rejectionProbability(), 0);
    fill(throttle, 10, null); // 20 again, p still what the controller made of it
    const decay = (seconds: number) => 0.5 ** (seconds / 3600);
    near(throttle.rejectionProbability(), ((0.5 * decay(5)) - 10 * RECOVERY) * decay(5.5) - 10 * RECOVERY, 1e-12);
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
      assert.equal(e.details, "throttled by the client: the sidecar refused or marked congested 18 of the 25 "
        + "calls it answered in the last 10 s (adaptive throttling); retry later");
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
      + "refused or marked congested 20 of the 20 calls it answered in the last 2.5 s (adaptive throttling); retry later");
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
 * whole second and refuses the rest, answering each at once (with the p it was sent at).
 * `onTick` sees the time and what happened.
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
    let sentAt: number;
    try {
      sentAt = throttle.admit();
    } catch (error) {
      assert.ok(error instanceof ThrottledError);
      onTick(ms, "throttled");
      continue;
    }
    if (budget > 0) {
      budget--;
      throttle.answered(null, false, sentAt);
      onTick(ms, "accepted");
    } else {
      throttle.answered("RESOURCE_EXHAUSTED", false, sentAt);
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
    test(`1000 calls/s, a sidecar that accepts 400/s: at most about 1.1 times that is sent; then it recovers within 1.5 s (seed ${seed})`, () => {
      // Expected, per second: p starts high (the share let through, x, small); each accept
      // adds 0.01 to x, so x grows as e^(10 t) and is 1 within ~0.4 s; the other accepts
      // follow at full rate. Then each refusal halves x: over the rest of the second,
      // dx/dt = -0.5 x^2 per ms sends 2 ln(1 + 0.5 * 600) = ~11 calls that are refused, a few
      // more with the decay: about 1.03 sent per accepted.
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
      assert.ok(ratio > 1.0 && ratio <= 1.1, `sent/accepted over the last 10 s: ${sent}/${accepted} = ${ratio}`);
      // Not starved either: the sidecar gets nearly all it can take (4000), the rest is refused here.
      assert.ok(accepted > 3900, `the sidecar accepted ${accepted} in the last 10 s, it can take 4000`);
      assert.ok(throttled > 5000, `${throttled} of 10000 calls refused here in the last 10 s`);
      let recovered = Infinity;
      let late = 0; // ticks from 1.5 s after recovery on with p at 0.01 or more
      simulate(throttle, clock, 1000, 20_000, 40_000, () => Infinity, (ms) => {
        const p = throttle.rejectionProbability();
        if (recovered === Infinity && p < 0.01) recovered = ms;
        if (ms >= 21_500 && p >= 0.01) late++;
      });
      // From x ~ 0.03, e^(5 t) reaches 0.99 in ~0.7 s.
      assert.ok(recovered - 20_000 <= 1_500, `p fell below 0.01 ${(recovered - 20_000) / 1000} s after recovery`);
      assert.equal(late, 0, "p rose to 0.01 or more again while the sidecar accepted everything");
    });
  }

  for (const seed of [1, 2, 3]) {
    test(`a sidecar that refuses everything for 30 s, then accepts all, 100 calls/s: back within 5 s (seed ${seed})`, () => {
      // Expected: the first 20 calls, sent at 0, set p to 0.5 once; after that each call that
      // reaches the sidecar halves x (dx/dt = -50 x^2 per s at 100 calls/s) while the decay
      // gives back ln(2)/5 (1 - x) per s: x settles near sqrt(0.139 / 50) = 0.053, p near
      // 0.95, 5.3 calls/s: ~180 calls reach the sidecar in 30 s.
      const { clock, throttle } = simulated(seed);
      let reached = 0;
      simulate(throttle, clock, 100, 0, 30_000, () => 0, (_ms, outcome) => {
        if (outcome !== "throttled") reached++;
      });
      const shut = throttle.rejectionProbability();
      assert.ok(shut > 0.8, `p after 30 s of refusals: ${shut}`);
      assert.ok(reached > 150 && reached < 400, `${reached} of 3000 calls reached a sidecar that refused them all`);
      // Then dp/dt = -(ln(2)/5) p - 100 * 0.01 (1 - p): from 0.95, below 0.01 after ~2 s.
      let recovered = Infinity;
      let at5s = NaN;
      let throttledAfter5s = 0;
      simulate(throttle, clock, 100, 30_000, 60_000, () => Infinity, (ms, outcome) => {
        if (recovered === Infinity && throttle.rejectionProbability() < 0.01) recovered = ms;
        if (ms === 35_000) at5s = throttle.rejectionProbability();
        if (ms >= 35_000 && outcome === "throttled") throttledAfter5s++;
      });
      assert.ok(recovered - 30_000 <= 5_000, `p fell below 0.01 ${(recovered - 30_000) / 1000} s after recovery`);
      assert.equal(at5s, 0); // the accepts took it the rest of the way
      assert.equal(throttledAfter5s, 0, `${throttledAfter5s} calls refused here 5 s after the sidecar recovered`);
    });
  }
});
