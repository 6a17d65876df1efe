"""Keeping Python's garbage collector off the request path of a serving process.

A full collection walks every tracked object. The parsed bundle is most of them: at
10,000 policies one full collection took 120-140 ms, and every request in flight waited
for it (a p99 of 150-230 ms at 32 in flight against 85 ms at 1,000 policies:
docs/performance.md). Freezing moves the objects alive now out of the collector's reach;
they are still freed by reference counting when dropped, and a replaced bundle holds no
reference cycles (tests/test_heap.py), so a reload frees the bundle it replaces.
"""

from __future__ import annotations

import gc


def freeze_long_lived() -> None:
    """Exempt what is alive now from future collections. A young collection first keeps
    the short-lived cycles of requests in flight out of the frozen set."""
    gc.collect(1)
    gc.freeze()


def keep_bundles_frozen(sidecar) -> None:
    """For a process that serves: freeze now, and again after each bundle swap."""
    freeze_long_lived()
    reloader = getattr(sidecar, "reloader", None)
    if reloader is not None:
        reloader.after_swap = freeze_long_lived
