"""The shared backend: one PostgreSQL database for a fleet of sidecars."""

from __future__ import annotations

from toolauthz.audit.records import DEFAULT_CHAINS
from toolauthz.store.postgres.migrate import MIGRATE_COMMAND, Migrated, check_schema, migrate
from toolauthz.store.postgres.unit import PgUnit, ensure_heads, shown_url
from toolauthz.store.rules import Store


class PostgresStore(Store):
    """The store in a PostgreSQL database whose schema is current (`check_schema`), or
    is made current first with `migrate=True`."""

    def __init__(self, url: str, *, pool_size: int = 8, timeout: float = 5.0, migrate_schema: bool = False,
                 chains: int = DEFAULT_CHAINS, hang_seconds: float | None = None):
        if migrate_schema:
            migrate(url)
        else:
            check_schema(url, timeout=timeout)
        ensure_heads(url, chains, timeout=timeout)
        self.url = url
        super().__init__(PgUnit(url, pool_size=pool_size, timeout=timeout, chains=chains, hang_seconds=hang_seconds))


__all__ = ["MIGRATE_COMMAND", "Migrated", "PgUnit", "PostgresStore", "check_schema", "migrate", "shown_url"]
