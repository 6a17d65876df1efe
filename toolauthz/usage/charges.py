"""Usage meters as values: what one call charges to a meter, and the meters' ceiling.

A tool file declares named meters (`usage:`, parsed by `bundle/meters.py`); the engine
works out what a call would charge to each (`engine.charges_of`); the ledger stores the
charges of allowed calls and of calls waiting for approval, in the transaction that
records the call, and sums a meter's charges over its sliding window for the next
decision (`store/`). This module is what those layers share, so none imports another's.
"""

from __future__ import annotations

from dataclasses import dataclass

# The largest value a meter holds and the largest a call may charge: JSON's safe
# integers. A meter's sum plus a call's charge (at most 2 * CEILING) then never
# overflows Cedar's 64-bit Long in `context.usage.m + context.input.amount`, nor any
# store's integer sum; a decision that would take a meter past it is denied.
CEILING = (1 << 53) - 1
MAX_WINDOW_SECONDS = 90 * 86400  # the longest window a meter may have


@dataclass(frozen=True)
class Charge:
    """What one call adds to one meter: `amount` to the value kept under `key` (the
    canonical JSON of the meter's `per` values) of `meter`, counted for `window` seconds
    from the call's decision (a sliding window)."""

    meter: str
    key: str
    amount: int
    window: int

    @property
    def lock_key(self) -> str:
        """What names this meter's value among the store's row keys (with the tenant)."""
        return f"{self.meter}\x00{self.key}"


def saturated(value: int) -> int:
    """A meter's value as a decision sees it: never past the ceiling."""
    return min(max(value, 0), CEILING)
