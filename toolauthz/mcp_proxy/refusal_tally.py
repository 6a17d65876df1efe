"""The gateway's own refusals that the sidecar audits in aggregate: `upstream_unavailable`.

While an upstream is down every call of its tools is refused before Authorize; an agent
that retries in a loop would otherwise write one audit record per attempt. The rule is
the sidecar's for refused callers (toolauthz/service/refusals.py), per caller, tool and
minute of the gateway's clock:

* the first refusal of a minute is reported at once, `count=1`;
* the others of that minute are reported as one record, `count=N`, once the minute has
  ended: at the next refusal of anyone, at the flusher's next tick, or when the gateway
  stops, whichever comes first. The counts of a minute's records add up to its refusals.

At most `MAX_TALLIES` tallies are open; a new one past that reports the oldest at once.
A record names the last refused call of its count (its run and call id).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from toolauthz.clock import Clock

__all__ = ["RefusalTally", "Report", "WINDOW_SECONDS", "MAX_TALLIES"]

WINDOW_SECONDS = 60.0
MAX_TALLIES = 4096

_Key = tuple[float, str, str, str]  # (minute, caller tag, tool, code)


@dataclass(frozen=True)
class Report:
    """One audit record to send: `what` is whatever the caller passed to `count` (the run
    and call id of the last refusal it counts)."""

    what: object
    tool: str
    code: str
    count: int
    minute: float

    def detail(self) -> str:
        return f"count={self.count} minute={int(self.minute)}"


@dataclass
class _Open:
    what: object
    tool: str
    code: str
    unwritten: int = 0


class RefusalTally:
    def __init__(self, clock: Clock, limit: int = MAX_TALLIES):
        self.clock = clock
        self.limit = limit
        self._open: OrderedDict[_Key, _Open] = OrderedDict()

    def count(self, caller: str, tool: str, code: str, what: object) -> list[Report]:
        """Counts one refusal; the reports to send now (this one's, when it is the first of
        its minute, and those of minutes that have ended)."""
        now = self.clock.now()
        minute = math.floor(now / WINDOW_SECONDS) * WINDOW_SECONDS
        reports = self.flush(ended_before=minute)
        key = (minute, caller, tool, code)
        tally = self._open.get(key)
        if tally is not None:
            tally.unwritten += 1
            tally.what = what
            return reports
        if len(self._open) >= self.limit:
            oldest, dropped = self._open.popitem(last=False)
            if dropped.unwritten:
                reports.append(Report(dropped.what, dropped.tool, dropped.code, dropped.unwritten, oldest[0]))
        self._open[key] = _Open(what, tool, code)
        reports.append(Report(what, tool, code, 1, minute))
        return reports

    def flush(self, ended_before: float | None = None) -> list[Report]:
        """The counts of the minutes that started before `ended_before` (None: of every
        minute, as when the gateway stops), closing their tallies."""
        if ended_before is None:
            ended_before = math.inf
        reports: list[Report] = []
        for key in [k for k in self._open if k[0] < ended_before]:
            tally = self._open.pop(key)
            if tally.unwritten:
                reports.append(Report(tally.what, tally.tool, tally.code, tally.unwritten, key[0]))
        return reports

    def due(self) -> list[Report]:
        """For the flusher's tick: the counts of the minutes that have ended."""
        return self.flush(ended_before=math.floor(self.clock.now() / WINDOW_SECONDS) * WINDOW_SECONDS)

    def __len__(self) -> int:
        return len(self._open)
