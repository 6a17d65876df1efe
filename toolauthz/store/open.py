"""Choosing the store by URL: `sqlite://PATH` (`sqlite:///abs/path.db`, or
`sqlite://relative.db`) or `postgresql://user@host:port/dbname?options` (libpq)."""

from __future__ import annotations

from dataclasses import dataclass

from toolauthz.audit.records import DEFAULT_CHAINS
from toolauthz.errors import ToolAuthzError
from toolauthz.store.rules import Store

SQLITE, POSTGRESQL = "sqlite", "postgresql"


@dataclass(frozen=True)
class StoreUrl:
    backend: str  # SQLITE or POSTGRESQL
    url: str
    path: str = ""  # SQLite: the file

    @property
    def shared(self) -> bool:
        """Several sidecars on different machines may share it."""
        return self.backend == POSTGRESQL


def parse_store_url(url: str) -> StoreUrl:
    if url.startswith("sqlite://"):
        path = url[len("sqlite://"):]
        if not path or "?" in path or "#" in path:
            raise ToolAuthzError(f"store `{url}`: a SQLite store is `sqlite:///path/to/file.db`")
        return StoreUrl(SQLITE, url, path)
    if url.startswith(("postgresql://", "postgres://")):
        return StoreUrl(POSTGRESQL, url)
    raise ToolAuthzError("a store URL starts with `sqlite://` or `postgresql://`")


def open_store(url: str, *, pool_size: int = 8, timeout: float = 5.0, migrate: bool = False,
               chains: int = DEFAULT_CHAINS, hang_seconds: float | None = None) -> Store:
    """Raises ToolAuthzError for a URL of no known backend, StoreUnavailable when the
    store cannot be opened (or, for PostgreSQL, its schema is not this code's; with
    `migrate` it is upgraded first). `chains`: the audit chains new records go to.
    `hang_seconds` (PostgreSQL): an operation that has not answered by then is cut."""
    parsed = parse_store_url(url)
    if parsed.backend == SQLITE:
        from toolauthz.store.sqlite import SqliteStore

        return SqliteStore(parsed.path, chains=chains)
    from toolauthz.store.postgres import PostgresStore

    return PostgresStore(url, pool_size=pool_size, timeout=timeout, migrate_schema=migrate, chains=chains,
                         hang_seconds=hang_seconds)


def migrate_store(url: str, *, serving_role: str = "") -> tuple[int, int]:
    """Creates or upgrades the store's schema: (version before, version after)."""
    parsed = parse_store_url(url)
    if parsed.backend == SQLITE:
        from toolauthz.store.sqlite import SqliteStore
        from toolauthz.store.sqlite.unit import SCHEMA_VERSION

        if serving_role:
            raise ToolAuthzError("a SQLite store has no roles: --serving-role is for PostgreSQL")
        SqliteStore(parsed.path).close()  # opening a SQLite file creates or upgrades its schema
        return SCHEMA_VERSION, SCHEMA_VERSION
    from toolauthz.store.postgres import migrate

    done = migrate(url, serving_role=serving_role)
    return done.before, done.after
