"""What AuthorizeBatch answers, for both transports: each call's decision, or the status
its own Authorize would have failed with; or, when a failure is not one call's own (the
store unavailable, an internal error), nothing at all: the whole batch fails, and no
call's token leaves the sidecar (a retry replays the decisions that were recorded)."""

from __future__ import annotations

from collections.abc import Sequence

from toolauthz.authorizer import AuthorizeResult
from toolauthz.service.failures import Failure, request_failure


def settle_batch(answers: Sequence[object]) -> list[AuthorizeResult | Failure]:
    """The pump's answers to a batch, each a result or a call's own failure; raises the
    first failure that is not a call's own."""
    settled: list[AuthorizeResult | Failure] = []
    for answer in answers:
        if isinstance(answer, AuthorizeResult):
            settled.append(answer)
            continue
        if not isinstance(answer, Exception):
            raise RuntimeError(f"a batch member answered {type(answer).__name__}")
        failure = request_failure(answer)
        if failure is None:
            raise answer
        settled.append(failure)
    return settled
