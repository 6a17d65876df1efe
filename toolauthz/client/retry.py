"""Which RPCs may be retried, and how (bounded exponential backoff with full jitter).

Only `UNAVAILABLE` is ever retried: the server did not handle the request (it was down,
or its store was unusable and it said "no decision was made"). `DEADLINE_EXCEEDED` is
never retried: the server may have acted. Per RPC:

    GetKeys, GetStatus, GetCatalog, ListVisible, ListApprovals, GetApproval, QueryDecisions
                  read-only: up to `RetryPolicy.max_attempts`.
    ReportOutcome up to `max_attempts`: a second report of the same call is answered
                  ALREADY_EXISTS, which after a retried attempt means "our first attempt
                  was recorded" and is returned as success (`already_recorded=True`).
                  The client cannot tell that the recorded outcome is the one it sent
                  (the response carries no outcome); within one Guard it always is,
                  because a Guard reports each call once.
    ReportRefusal up to `max_attempts`: it writes one audit record and nothing else, so a
                  retry after a lost response at worst records the refusal twice.
    Authorize     at most ONE retry, only on UNAVAILABLE (no response was received).
                  Authorize is idempotent by design: the sidecar keeps one decision per
                  (tenant, call_id) and answers the same call (same digest) with the
                  original decision (`replayed`), issuing a token only while the call
                  has not been executed. So a retry can neither produce a second
                  decision nor a second execution. One retry, not more, because a
                  sidecar that is down twice in a row should surface quickly.
    AuthorizeBatch as Authorize, for the same reason: each call id of the batch replays
                  its decision, so a retry decides nothing twice.
    Verify        NEVER: it consumes the token. If the response was lost, the token may
                  be spent; a retry would answer `already_used` and hide that the first
                  attempt succeeded. The Guard treats a failed Verify as "not executed".
    DecideApproval, WatchApproval
                  never retried by the client: a decision is a person's action (a
                  second REJECT is FAILED_PRECONDITION), and a watch is a stream the
                  Guard re-reads with GetApproval/Authorize when it breaks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc

__all__ = ["RetryPolicy", "NO_RETRY"]


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3  # total attempts for the retryable RPCs, first included
    initial_backoff: float = 0.05  # seconds before the first retry
    max_backoff: float = 1.0
    multiplier: float = 2.0
    jitter: bool = True  # full jitter: sleep uniform(0, backoff)

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= 10:
            raise ValueError("max_attempts must be between 1 and 10")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError("backoff values must be non-negative and multiplier >= 1")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number `retry` (1-based)."""
        backoff = min(self.max_backoff, self.initial_backoff * self.multiplier ** (retry - 1))
        return random.uniform(0, backoff) if self.jitter else backoff


NO_RETRY = RetryPolicy(max_attempts=1)
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


def attempts_for(policy: RetryPolicy, method: str) -> int:
    if method in ("Verify", "DecideApproval"):
        return 1
    if method in ("Authorize", "AuthorizeBatch"):
        return min(2, policy.max_attempts)
    return policy.max_attempts
