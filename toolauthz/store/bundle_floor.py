"""The bundle revision floor: the highest signed revision any process sharing the store
activated, so that a restart, a new replica or a fresh pod cannot serve an older one.

One row. Activating a revision raises the floor in one statement that answers the floor
as it then stands (an upsert taking the greater value): two replicas activating
together cannot both think they are the newest, and one activating below a floor another
just raised learns it from the same statement. Only `lower` (the audited operator action
`toolauthz bundle allow-rollback`) ever moves it down, in the transaction of its audit
record. Storage runs no policy: whether a bundle may serve is the caller's comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from toolauthz.store.backend_rows import BackendRows

FLOOR_TABLE = "bundle_floor"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    revision BIGINT NOT NULL CHECK (revision >= 0),
    digest TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
"""


@dataclass(frozen=True)
class Floor:
    revision: int
    digest: str  # the snapshot digest of the bundle that raised it (or '' after a rollback)
    updated_at: float


@dataclass(frozen=True)
class FloorSql:
    """The statements, with the backend's placeholder."""

    read: str
    lift: str
    lower: str

    @classmethod
    def with_mark(cls, m: str) -> FloorSql:
        return cls(
            read=f"SELECT revision, digest, updated_at FROM {FLOOR_TABLE} WHERE id = 1",
            lift=(f"INSERT INTO {FLOOR_TABLE} (id, revision, digest, updated_at) VALUES (1, {m}, {m}, {m}) "
                  f"ON CONFLICT (id) DO UPDATE SET "
                  # The first bundle activated at a revision names it (after a rollback too,
                  # which leaves the digest empty).
                  f"digest = CASE WHEN excluded.revision > {FLOOR_TABLE}.revision OR "
                  f"({FLOOR_TABLE}.digest = '' AND excluded.revision = {FLOOR_TABLE}.revision) "
                  f"THEN excluded.digest ELSE {FLOOR_TABLE}.digest END, "
                  f"updated_at = CASE WHEN excluded.revision > {FLOOR_TABLE}.revision THEN excluded.updated_at "
                  f"ELSE {FLOOR_TABLE}.updated_at END, "
                  f"revision = CASE WHEN excluded.revision > {FLOOR_TABLE}.revision THEN excluded.revision "
                  f"ELSE {FLOOR_TABLE}.revision END "
                  f"RETURNING revision, digest, updated_at"),
            lower=(f"INSERT INTO {FLOOR_TABLE} (id, revision, digest, updated_at) VALUES (1, {m}, '', {m}) "
                   f"ON CONFLICT (id) DO UPDATE SET revision = excluded.revision, digest = '', "
                   f"updated_at = excluded.updated_at"),
        )


class FloorRows(BackendRows):
    """The floor's reads and writes over a backend's statements (a mixin of each backend's
    transaction, which sets `_floor_sql`)."""

    _floor_sql: FloorSql

    def bundle_floor(self) -> Floor | None:
        rows = self._rows(self._floor_sql.read, ())
        return _floor_of(rows[0]) if rows else None

    def lift_bundle_floor(self, revision: int, digest: str, now: float) -> Floor:
        """Raises the floor to `revision` unless it is higher already; the floor after."""
        return _floor_of(self._rows(self._floor_sql.lift, (revision, digest, now))[0])

    def lower_bundle_floor(self, revision: int, now: float) -> None:
        self._write(self._floor_sql.lower, (revision, now))


def _floor_of(row: Sequence[object]) -> Floor:
    revision, digest, updated_at = row
    assert isinstance(revision, int) and isinstance(digest, str)  # the schema's types
    return Floor(revision, digest, float(updated_at))  # type: ignore[arg-type]

