"""Congestion marks, on either transport: while a connection's calls queue long (the
decision pump's `congestion`, server/admission.py), a share of its successful Authorize and
AuthorizeBatch answers carry `toolauthz-congested: 1`, gRPC trailing metadata or an HTTP
header, which the SDKs' throttles slow down on before the queue's bound refuses
(client/throttle.py). A mark is advice: the answer is as valid as any other."""

from __future__ import annotations

import random
from collections.abc import Callable

from toolauthz.telemetry import metrics

CONGESTED_METADATA = "toolauthz-congested"  # the SDKs name it alike (client/throttle.py, throttle.ts)


def drawn(share: float, draw: Callable[[], float] = random.random) -> bool:
    """Whether this answer is marked, with probability `share`; counted in
    toolauthz_congestion_marks_total."""
    if share > 0 and draw() < share:
        metrics.CONGESTION_MARKS.inc()
        return True
    return False
