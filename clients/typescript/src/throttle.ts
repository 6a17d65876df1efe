/**
 * Adaptive throttling of new decisions in the client; the same rules and defaults as the
 * Python SDK's toolauthz/client/throttle.py.
 *
 * Why in the client: a sidecar refuses an excess call (RESOURCE_EXHAUSTED) in its Python
 * gRPC process, and that refusal costs about what a no-op RPC costs, a fifth to a half of
 * a decision. Offered 2.5 times what it can decide, a sidecar spends a third of its core
 * refusing. A client that refuses part of its own calls while the sidecar is refusing them
 * keeps that work off the sidecar.
 *
 * The signal: the sidecar refusing a call (RESOURCE_EXHAUSTED), or marking a successful
 * answer as congested (trailing metadata `toolauthz-congested: 1`, CONGESTED_METADATA). It
 * marks a share of its answers that grows with its decision queue, from none at a tenth of
 * the queue's bound to all at the bound, so a client slows down before the sidecar has to
 * refuse, as ECN marks tell TCP to.
 *
 * How: the client refuses a new call itself with a probability `p`; `1 - p` is the share it
 * lets through. On a signal, that share becomes `backoff` times what it was when the client
 * sent the call that got it, unless it is lower already: `p = max(p, 1 - (1 - sentAt) *
 * backoff)`, where `backoff` is `markBackoff` (0.8) for a mark and `refusalBackoff` (0.5)
 * for a refusal, which says the queue is at its bound (TCP backs off less on an ECN mark
 * than on a loss for the same reason, RFC 8511). The answers to the calls sent at one setting all describe the sidecar before
 * the client reacted, so together they lower the share once, not once each (TCP reduces its
 * window once per round trip for the same reason). Each other answer lowers `p` by
 * `recovery`, and `p` halves every `halfLifeSeconds` whatever happens, so a client that
 * sends little is never shut out for long, and when the sidecar recovers its answers and
 * the decay bring `p` to 0 within seconds. While fewer than `minRequests` calls were asked
 * of the client in the last `windowSeconds`, nothing is refused here (and a call sent then
 * was sent at 0): a client that sends a few calls a second cannot overload anyone.
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
 * The sidecar's shedding. Every other answer, a DENY or INVALID_ARGUMENT included, is an
 * accept: the sidecar did the work. So is UNAVAILABLE (a sidecar that is down is not
 * overloaded, and its callers should see UNAVAILABLE, not a throttle) and DEADLINE_EXCEEDED
 * (a sidecar that cannot decide in time sheds the call itself; a deadline that passed may
 * be the caller's own, too short).
 */
export const OVERLOAD_CODES: ReadonlySet<string> = new Set(["RESOURCE_EXHAUSTED"]);

/** The trailing metadata key by which the sidecar marks a successful answer congested (value "1"). */
export const CONGESTED_METADATA = "toolauthz-congested";

const BUCKETS = 10;
const MOST = 0.999; // never refuse every call: the calls let through see the sidecar recover

export interface ThrottlePolicyInit {
  markBackoff?: number; // on a mark, the share let through becomes this times its share when sent (default 0.8)
  refusalBackoff?: number; // ... on a refusal (default 0.5)
  recovery?: number; // how far each other answer lowers the probability (default 0.01)
  windowSeconds?: number; // seconds over which calls are counted (minRequests) (default 10)
  minRequests?: number; // below this many requests in the window, nothing is refused here (default 20)
  halfLifeSeconds?: number; // seconds in which the probability halves by itself (default 5)
}

export class ThrottlePolicy {
  readonly markBackoff: number;
  readonly refusalBackoff: number;
  readonly recovery: number;
  readonly windowSeconds: number;
  readonly minRequests: number;
  readonly halfLifeSeconds: number;

  constructor(init: ThrottlePolicyInit = {}) {
    this.markBackoff = init.markBackoff ?? 0.8;
    this.refusalBackoff = init.refusalBackoff ?? 0.5;
    this.recovery = init.recovery ?? 0.01;
    this.windowSeconds = init.windowSeconds ?? 10;
    this.minRequests = init.minRequests ?? 20;
    this.halfLifeSeconds = init.halfLifeSeconds ?? 5;
    // 1 would never back off; 0 would shut the client out at the first signal.
    for (const [name, backoff] of [["markBackoff", this.markBackoff], ["refusalBackoff", this.refusalBackoff]] as const) {
      if (!(Number.isFinite(backoff) && backoff > 0 && backoff < 1)) {
        throw new RangeError(`${name} must be above 0 and below 1`);
      }
    }
    if (!(Number.isFinite(this.recovery) && this.recovery > 0 && this.recovery <= 1)) {
      throw new RangeError("recovery must be above 0 and at most 1");
    }
    if (!(Number.isFinite(this.windowSeconds) && this.windowSeconds > 0 && this.windowSeconds <= 3600)) {
      throw new RangeError("windowSeconds must be between 0 and 3600 seconds");
    }
    // An integer, as the Python SDK's `min_requests: int`; NaN would silently disable the floor.
    if (!(Number.isInteger(this.minRequests) && this.minRequests >= 0)) {
      throw new RangeError("minRequests must be an integer >= 0");
    }
    if (!(Number.isFinite(this.halfLifeSeconds) && this.halfLifeSeconds > 0 && this.halfLifeSeconds <= 3600)) {
      throw new RangeError("halfLifeSeconds must be between 0 and 3600 seconds");
    }
    Object.freeze(this);
  }
}

/** A call this client refused itself while the sidecar was refusing calls. */
export class ThrottledError extends RpcError {
  /** The sidecar's signals (refusals and congestion marks) and answers in the window when it was refused. */
  constructor(readonly refused: number, readonly answered: number, readonly windowSeconds: number) {
    super("RESOURCE_EXHAUSTED", `throttled by the client: the sidecar refused or marked congested ${refused} of the `
      + `${answered} calls it answered in the last ${formatG(windowSeconds)} s (adaptive throttling); retry later`);
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
 * One client's refusal probability, and its calls counted in 10 buckets over the window.
 * No lock: Node runs each method to its end before any other code of this process runs.
 */
export class AdaptiveThrottle {
  readonly policy: ThrottlePolicy;
  private readonly clockMs: () => number;
  private readonly random: () => number;
  private readonly widthMs: number;
  private readonly requests = new Array<number>(BUCKETS).fill(0); // calls asked of the client, refused here or not
  private readonly signals = new Array<number>(BUCKETS).fill(0); // ... that the sidecar refused or marked
  private readonly answers = new Array<number>(BUCKETS).fill(0); // ... that the sidecar answered
  private epoch: number; // the newest bucket's number (time / bucket width)
  private p = 0; // the refusal probability, decayed to `at`
  private at: number; // when p was last decayed (ms)

  constructor(policy: ThrottlePolicy = new ThrottlePolicy(), sources: ThrottleSources = {}) {
    if (!(policy instanceof ThrottlePolicy)) throw new TypeError("policy must be a ThrottlePolicy");
    this.policy = policy;
    this.clockMs = sources.clockMs ?? (() => performance.now());
    this.random = sources.random ?? Math.random;
    this.widthMs = (policy.windowSeconds * 1000) / BUCKETS;
    const now = this.clockMs();
    this.epoch = Math.floor(now / this.widthMs);
    this.at = now;
  }

  /** The probability that the next call is refused here. */
  rejectionProbability(): number {
    this.advance();
    return this.probability();
  }

  /**
   * Counts a call the application asked for; throws `ThrottledError` if it is refused here.
   * Returns the probability the call was sent at, for `answered`'s `sentAt`.
   */
  admit(): number {
    const newest = this.advance();
    const p = this.probability(); // taken before this call counts
    this.requests[newest]! += 1;
    if (this.random() < p) throw new ThrottledError(sum(this.signals), sum(this.answers), this.policy.windowSeconds);
    return p;
  }

  /**
   * Counts the sidecar's answer to an admitted call: its gRPC status name, or null for a
   * response; `congested`: the response carried the congestion mark (a mark on a failure
   * means nothing: the sidecar sets it on responses only); `sentAt`: what `admit` returned
   * for the call (unknown: the current probability).
   */
  answered(code: string | null, congested = false, sentAt?: number): void {
    // NaN would stick in p and silently turn the throttle off.
    if (sentAt !== undefined && !(sentAt >= 0 && sentAt <= 1)) throw new RangeError("sentAt must be between 0 and 1");
    const newest = this.advance();
    this.answers[newest]! += 1;
    if ((code !== null && OVERLOAD_CODES.has(code)) || (code === null && congested)) {
      this.signals[newest]! += 1;
      const sent = sentAt ?? this.p;
      const backoff = code === null ? this.policy.markBackoff : this.policy.refusalBackoff;
      this.p = Math.min(MOST, Math.max(this.p, 1 - (1 - sent) * backoff));
    } else {
      this.p = Math.max(0, this.p - this.policy.recovery);
    }
  }

  private probability(): number {
    return sum(this.requests) >= this.policy.minRequests ? this.p : 0;
  }

  /**
   * Lets the probability decay to now and empties the buckets that fell out of the
   * window; returns the newest bucket's index.
   */
  private advance(): number {
    const nowMs = this.clockMs();
    if (nowMs > this.at) {
      this.p *= 0.5 ** ((nowMs - this.at) / 1000 / this.policy.halfLifeSeconds);
      this.at = nowMs;
    }
    const now = Math.floor(nowMs / this.widthMs);
    if (now - this.epoch >= BUCKETS) {
      this.requests.fill(0);
      this.signals.fill(0);
      this.answers.fill(0);
    } else {
      for (let epoch = this.epoch + 1; epoch <= now; epoch++) {
        this.requests[slot(epoch)] = 0;
        this.signals[slot(epoch)] = 0;
        this.answers[slot(epoch)] = 0;
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

/** A number as Python's `format(x, "g")` writes it: 6 significant digits, no trailing zeros (internal). */
export function formatG(x: number): string {
  if (!Number.isFinite(x)) return Number.isNaN(x) ? "nan" : x > 0 ? "inf" : "-inf";
  if (x === 0) return Object.is(x, -0) ? "-0" : "0";
  const [mantissa, exponentText] = x.toExponential(5).split("e") as [string, string];
  const exponent = Number(exponentText);
  if (exponent >= -4 && exponent < 6) {
    return trimZeros(x.toFixed(Math.max(0, 5 - exponent)));
  }
  return `${trimZeros(mantissa)}e${exponent < 0 ? "-" : "+"}${String(Math.abs(exponent)).padStart(2, "0")}`;
}

function trimZeros(fixed: string): string {
  return fixed.includes(".") ? fixed.replace(/0+$/, "").replace(/\.$/, "") : fixed;
}
