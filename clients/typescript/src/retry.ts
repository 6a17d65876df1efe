/**
 * Which RPCs may be retried, and how: the rules of docs/sdk.md ("Retries and
 * deadlines"), the same as the Python SDK's toolauthz/client/retry.py.
 *
 * Only UNAVAILABLE is ever retried (the server did not handle the request);
 * DEADLINE_EXCEEDED never is (the server may have acted). Authorize and AuthorizeBatch
 * get at most one retry (each call id replays its decision, so nothing is decided
 * twice); Verify and DecideApproval none (Verify consumes the token: a retry after a
 * lost response would answer `already_used` and hide that the first attempt succeeded);
 * the read-only RPCs and ReportOutcome up to `maxAttempts`.
 */

export interface RetryPolicyInit {
  maxAttempts?: number; // total attempts for the retryable RPCs, the first included
  initialBackoffMs?: number;
  maxBackoffMs?: number;
  multiplier?: number;
  jitter?: boolean; // full jitter: wait uniform(0, backoff)
}

export class RetryPolicy {
  readonly maxAttempts: number;
  readonly initialBackoffMs: number;
  readonly maxBackoffMs: number;
  readonly multiplier: number;
  readonly jitter: boolean;

  constructor(init: RetryPolicyInit = {}) {
    this.maxAttempts = init.maxAttempts ?? 3;
    this.initialBackoffMs = init.initialBackoffMs ?? 50;
    this.maxBackoffMs = init.maxBackoffMs ?? 1000;
    this.multiplier = init.multiplier ?? 2;
    this.jitter = init.jitter ?? true;
    if (!Number.isInteger(this.maxAttempts) || this.maxAttempts < 1 || this.maxAttempts > 10) {
      throw new RangeError("maxAttempts must be an integer from 1 to 10");
    }
    if (this.initialBackoffMs < 0 || this.maxBackoffMs < 0 || this.multiplier < 1) {
      throw new RangeError("backoff values must be non-negative and multiplier >= 1");
    }
    Object.freeze(this);
  }

  /** Milliseconds to wait before retry number `retry` (1-based). */
  delayMs(retry: number): number {
    const backoff = Math.min(this.maxBackoffMs, this.initialBackoffMs * this.multiplier ** (retry - 1));
    return this.jitter ? Math.random() * backoff : backoff;
  }
}

export const NO_RETRY = new RetryPolicy({ maxAttempts: 1 });
export const RETRYABLE: ReadonlySet<string> = new Set(["UNAVAILABLE"]);

export function attemptsFor(policy: RetryPolicy, method: string): number {
  if (method === "Verify" || method === "DecideApproval" || method === "WatchApproval") return 1;
  if (method === "Authorize" || method === "AuthorizeBatch") return Math.min(2, policy.maxAttempts);
  return policy.maxAttempts;
}
