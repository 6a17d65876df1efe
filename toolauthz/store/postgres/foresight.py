"""What a replica knows of the rows its decisions read, so that a batch of reservations
is one round trip to PostgreSQL: its reads are predicted here instead of waited for, and
checked by the database in the same pipeline as the writes and the COMMIT.

A reservation reads its call (is it new?), its run's counts, its meters' values and,
at the end, the heads of the audit chains it appends to. Before this, each was a round
trip: the reads, then the heads locked, then the commit. A replica that wrote those rows
last already knows them: the call is new (a call id is used once), the run's counts and
the meters are what its last transaction left, the heads are the ones it wrote. So the
transaction (`ForeseenTransaction`) takes them from here, sends everything in one
pipeline, and asks the database to check each prediction under the transaction's locks
before anything is written (`toolauthz_expect`, schema version 8): a prediction that
does not hold fails the transaction, which committed nothing, and the batch runs again
the long way (`PgTransaction`: reads under the locks, then the heads, then the commit),
which teaches this what the rows really hold.

The predictions are only ever a guess checked by the database: a wrong one costs round
trips, never correctness. Unknown runs and meters are guessed at zero (a new run, an
unused meter), unknown chain heads are read under their lock (one more round trip).
The maps are bounded (least recently used first out).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from typing import Any

from toolauthz.store.ledger import CallEntry, Standing

RunKey = tuple[str, str]  # tenant, request_id
ToolKey = tuple[str, str, str]  # tenant, request_id, tool
MeterKey = tuple[str, str, str, int]  # tenant, meter, key, window
# The most runs and meter keys remembered (each a few hundred bytes).
MAX_REMEMBERED = 20_000
# The foreseen path is left for the long one while it misses more than this often over
# the last batches (another writer shares the rows), and tried again every PROBE_EVERY.
MISS_RATE_LIMIT = 0.5
RECENT = 32
PROBE_EVERY = 16

# SQLSTATE of a prediction the database found wrong (raised by toolauthz_expect).
MISPREDICTED = "TZ001"


class _Bounded(OrderedDict):  # type: ignore[type-arg]
    def remember(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > MAX_REMEMBERED:
            self.popitem(last=False)


class Foresight:
    """One process's knowledge of the rows its transactions last read or wrote.
    Thread-safe: the group commit's leader writes, any thread reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: _Bounded = _Bounded()  # a run's calls that hold a share of its budget
        self._tools: _Bounded = _Bounded()  # and those of one tool
        self._meters: _Bounded = _Bounded()
        self._heads: dict[str, tuple[int, str]] = {}
        self._recent: deque[bool] = deque(maxlen=RECENT)
        self._skipped = 0

    # -- what a batch is predicted to read --

    def standing(self, entries: Sequence[CallEntry]) -> list[Standing]:
        with self._lock:
            return [Standing(*self._counts(e), tuple(self._meters.get(meter_key(e.tenant, c), 0) for c in e.charges))
                    for e in entries]

    def counts(self, entry: CallEntry) -> tuple[int, int]:
        with self._lock:
            return self._counts(entry)

    def _counts(self, entry: CallEntry) -> tuple[int, int]:
        return int(self._runs.get(run_key(entry), 0)), int(self._tools.get(tool_key(entry), 0))

    def _remember_counts(self, tenant: str, request_id: str, tool: str, counts: tuple[int, int]) -> None:
        self._runs.remember((tenant, request_id), int(counts[0]))
        self._tools.remember((tenant, request_id, tool), int(counts[1]))

    def meter(self, key: MeterKey) -> int:
        with self._lock:
            value: int = self._meters.get(key, 0)
            return value

    def heads(self, chains: Iterable[str]) -> dict[str, tuple[int, str]]:
        """The heads known of `chains` (those unknown are left out)."""
        with self._lock:
            return {name: self._heads[name] for name in chains if name in self._heads}

    # -- what a transaction leaves behind --

    def learn(self, counts: dict[tuple[str, str, str, float], tuple[int, int]],
              usage: dict[tuple[str, str, str, float, int], int], heads: dict[str, tuple[int, str]]) -> None:
        """What a committed transaction read and wrote (ReadAhead's maps, keyed with the
        time each was read at, and the heads it left)."""
        with self._lock:
            for (tenant, request_id, tool, _at), value in counts.items():
                self._remember_counts(tenant, request_id, tool, value)
            for (tenant, meter, key, _at, window), amount in usage.items():
                self._meters.remember((tenant, meter, key, window), amount)
            self._heads.update(heads)

    def learn_counts(self, entries: Sequence[CallEntry], rows: Sequence[tuple[Any, ...]]) -> None:
        with self._lock:
            for entry, (calls, tool_calls) in zip(entries, rows, strict=True):
                self._remember_counts(entry.tenant, entry.request_id, entry.tool, (calls, tool_calls))

    def learn_meters(self, keys: Sequence[MeterKey], rows: Sequence[tuple[Any, ...]]) -> None:
        with self._lock:
            for key, (value,) in zip(keys, rows, strict=True):
                self._meters.remember(key, int(value))

    def learn_heads(self, rows: Iterable[tuple[Any, ...]]) -> None:
        with self._lock:
            self._heads.update({str(c): (int(s), str(h)) for c, s, h in rows if c is not None})

    # -- whether to foresee at all --

    def worth_trying(self) -> bool:
        """False while recent batches mostly missed (another writer shares their rows),
        but after PROBE_EVERY batches the long way, which finds out whether that is
        still so."""
        with self._lock:
            return (len(self._recent) < RECENT // 4 or self._skipped >= PROBE_EVERY
                    or self._recent.count(False) <= MISS_RATE_LIMIT * len(self._recent))

    def tally(self, hit: bool) -> None:
        with self._lock:
            self._recent.append(hit)
            self._skipped = 0

    def skipped(self) -> None:
        """A batch went the long way because foreseeing was not worth trying."""
        with self._lock:
            self._skipped += 1


def run_key(entry: CallEntry) -> RunKey:
    return entry.tenant, entry.request_id


def tool_key(entry: CallEntry) -> ToolKey:
    return entry.tenant, entry.request_id, entry.tool


def meter_key(tenant: str, charge: Any) -> MeterKey:
    return tenant, charge.meter, charge.key, charge.window
