/**
 * Adaptive throttling of new decisions in the client (Site Reliability Engineering,
 * "Handling Overload": client-side throttling); the same rules and defaults as the
 * Python SDK's toolauthz/client/throttle.py.
 *
 * Why in the client: a sidecar refuses an excess call (RESOURCE_EXHAUSTED) in its Python
 * gRPC process, and that refusal costs about what a no-op RPC costs, a fifth to a half of
 * a decision. Offered 2.5 times what it can decide, a sidecar spends a third of its core
 * refusing. A client that refuses part of its own calls while the sidecar is refusing them
 * keeps that work off the sidecar.
 *
 * How: over the last `windowSeconds`, `requests` (every call the application asked for,
 * those refused here included) and `accepts` (calls the sidecar answered with anything but
 * an overload). A new call is refused here with probability
 *
 *     p = max(0, (requests - multiplier * accepts) / (requests + 1))
 *
 * computed from the counts before the new call is counted, so that about `multiplier`
 * times what the sidecar accepts still reaches it: when it recovers, those calls see it,
 * accepts rise and p falls to 0. While the window holds fewer than `minRequests`, nothing
 * is refused here: a client that sends a few calls a second cannot overload anyone, and
 * one refusal must not shut it out.
 *
 * Only the calls that start a decision are throttled (Authorize, AuthorizeBatch): a Verify
 * or ReportOutcome completes a decision already made, and refusing it would waste that.
 * A call refused here fails closed, as one the sidecar refused: `ThrottledError`, an
 * `RpcError` with code RESOURCE_EXHAUSTED, safe to retry later, no token.
 */
import { RpcError } from "./rpc-error.js";

/** The RPCs that start a decision: the only ones the throttle sees. */
export const THROTTLED_METHODS: ReadonlySet<string> = new Set(["Authorize", "AuthorizeBatch"]);

/**
 * The answers that say "the sidecar did not decide this in time": its shedding, or a call
 * that waited past its deadline. Every other answer, a DENY or INVALID_ARGUMENT included,
 * is an accept: the sidecar did the work. UNAVAILABLE is one too: a sidecar that is down
 * is not overloaded, and its callers should see UNAVAILABLE, not a throttle, when it is back.
 */
export const OVERLOAD_CODES: ReadonlySet<string> = new Set(["RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"]);

const BUCKETS = 10;

export interface ThrottlePolicyInit {
  multiplier?: number; // calls let through per call the sidecar accepts, while it refuses (default 1.1)
  windowSeconds?: number; // seconds of history (default 10)
  minRequests?: number; // below this many requests in the window, nothing is refused here (default 20)
}

export class ThrottlePolicy {
  readonly multiplier: number;
  readonly windowSeconds: number;
  readonly minRequests: number;

  constructor(init: ThrottlePolicyInit = {}) {
    this.multiplier = init.multiplier ?? 1.1;
    this.windowSeconds = init.windowSeconds ?? 10;
    this.minRequests = init.minRequests ?? 20;
    if (!(Number.isFinite(this.multiplier) && this.multiplier >= 1)) {
      throw new RangeError("multiplier must be a finite number >= 1");
    }
    if (!(Number.isFinite(this.windowSeconds) && this.windowSeconds > 0 && this.windowSeconds <= 3600)) {
      throw new RangeError("windowSeconds must be between 0 and 3600 seconds");
    }
    // An integer, as the Python SDK's `min_requests: int`; NaN would silently disable the floor.
    if (!(Number.isInteger(this.minRequests) && this.minRequests >= 0)) {
      throw new RangeError("minRequests must be an integer >= 0");
    }
    Object.freeze(this);
  }
}

/** A call this client refused itself while the sidecar was refusing calls. */
export class ThrottledError extends RpcError {
  /** The counts in the window when the call was refused (before counting it). */
  constructor(readonly requests: number, readonly accepts: number) {
    super("RESOURCE_EXHAUSTED", `throttled by the client: the sidecar accepted ${accepts} of the last ${requests} `
      + "calls (adaptive throttling); retry later");
    this.name = "ThrottledError";
  }
}

/** Test hooks: a clock and a random source to replace the real ones. */
export interface ThrottleSources {
  /** Milliseconds on a monotonic clock (default `performance.now()`). */
  clockMs?: () => number;
  /** A number in [0, 1) (default `Math.random()`); a call is refused when it is below p. */
  random?: () => number;
}

/**
 * The request and accept counts of one client, in 10 buckets over the window. No lock:
 * Node runs each method to its end before any other code of this process runs.
 */
export class AdaptiveThrottle {
  readonly policy: ThrottlePolicy;
  private readonly clockMs: () => number;
  private readonly random: () => number;
  private readonly widthMs: number;
  private readonly requests = new Array<number>(BUCKETS).fill(0);
  private readonly accepts = new Array<number>(BUCKETS).fill(0);
  private epoch: number; // the newest bucket's number (time / bucket width)

  constructor(policy: ThrottlePolicy = new ThrottlePolicy(), sources: ThrottleSources = {}) {
    if (!(policy instanceof ThrottlePolicy)) throw new TypeError("policy must be a ThrottlePolicy");
    this.policy = policy;
    this.clockMs = sources.clockMs ?? (() => performance.now());
    this.random = sources.random ?? Math.random;
    this.widthMs = (policy.windowSeconds * 1000) / BUCKETS;
    this.epoch = Math.floor(this.clockMs() / this.widthMs);
  }

  /** The probability that the next call is refused here. */
  rejectionProbability(): number {
    this.advance();
    return this.probability(sum(this.requests), sum(this.accepts));
  }

  /** Counts a call the application asked for; throws `ThrottledError` if it is refused here. */
  admit(): void {
    const newest = this.advance();
    const requests = sum(this.requests);
    const accepts = sum(this.accepts);
    this.requests[newest]! += 1;
    if (this.random() < this.probability(requests, accepts)) throw new ThrottledError(requests, accepts);
  }

  /** Counts the sidecar's answer to an admitted call: its gRPC status name, or null for a response. */
  answered(code: string | null): void {
    if (code !== null && OVERLOAD_CODES.has(code)) return;
    this.accepts[this.advance()]! += 1;
  }

  private probability(requests: number, accepts: number): number {
    if (requests < this.policy.minRequests) return 0;
    return Math.max(0, (requests - this.policy.multiplier * accepts) / (requests + 1));
  }

  /** Empties the buckets that fell out of the window; returns the newest one's index. */
  private advance(): number {
    const now = Math.floor(this.clockMs() / this.widthMs);
    if (now - this.epoch >= BUCKETS) {
      this.requests.fill(0);
      this.accepts.fill(0);
    } else {
      for (let epoch = this.epoch + 1; epoch <= now; epoch++) {
        this.requests[slot(epoch)] = 0;
        this.accepts[slot(epoch)] = 0;
      }
    }
    this.epoch = Math.max(this.epoch, now); // a clock that steps back reuses the newest bucket
    return slot(this.epoch);
  }
}

function slot(epoch: number): number {
  return ((epoch % BUCKETS) + BUCKETS) % BUCKETS; // an injected clock may be negative
}

function sum(counts: readonly number[]): number {
  return counts.reduce((total, count) => total + count, 0);
}
