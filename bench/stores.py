"""The store comparison (`python -m bench --store postgresql://...`): Authorize at 32 in
flight against one sidecar on SQLite, then one and three replicas on one PostgreSQL
database (a fresh schema of its own, dropped afterwards), each checked afterwards for
one audit record per response."""

from __future__ import annotations

import collections
import pathlib
import secrets
from collections.abc import Callable
from typing import Any

from bench import servers

CONCURRENCY = 32


def fresh_schema(url: str) -> tuple[str, Callable[[], None]]:
    """A URL whose tables live in a new schema, and how to drop it."""
    import psycopg

    from toolauthz.store.postgres import migrate

    schema = f"bench_{secrets.token_hex(4)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    scoped = f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    migrate(scoped)

    def drop() -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')

    return scoped, drop


def audit_check_postgres(url: str, responses: dict[str, list[str]]) -> dict:
    import psycopg

    from bench.stats import compare_records

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT kind, decision_id FROM audit_record "
                            "WHERE kind IN ('authorize', 'verify')").fetchall()
    return compare_records(collections.Counter((str(k), str(d)) for k, d in rows), responses)


def compare(bench: Any, store_url: str) -> None:
    """`bench`: the run's Bench (its plan, bundles, results and closed-loop helper)."""
    from bench.stats import audit_check

    size = bench.default_size
    for label, replicas in (("sqlite", 1), ("postgresql", 1), ("postgresql", 3)):
        settings = bench._settings(size, f"store-{label}-{replicas}")
        drop: Callable[[], None] = lambda: None  # noqa: E731 - nothing to drop for SQLite
        if label == "postgresql":
            settings["store"], drop = fresh_schema(store_url)
        group = servers.start_replicas(settings, replicas)
        responses: dict = {}
        try:
            row = bench._closed(group[0], label=f"{label} x{replicas}", rpc="authorize", concurrency=CONCURRENCY,
                                policies=size, workers=replicas, responses=responses,
                                cpu=lambda g=group: sum(s.cpu_seconds() for s in g))
            row["store"] = label
        finally:
            for server in group:
                server.stop()
        try:
            check = audit_check_postgres(settings["store"], responses) if label == "postgresql" else \
                audit_check(str(pathlib.Path(settings["data_dir"]) / "toolauthz.db"), responses)
        finally:
            drop()
        bench.results.audit.append({"server": f"{label}, {replicas} replica(s)", **check})
