"""`toolauthz store ...`: create or upgrade the store's schema, prune ended calls."""

from __future__ import annotations

import argparse

from sidecar.cli.options import add_anywhere
from sidecar.display import shown


def add_store_command(sub) -> None:
    store = sub.add_parser("store", help="the store's schema (migrate) and retention (prune)")
    verbs = store.add_subparsers(dest="store_command", required=True)
    migrate = verbs.add_parser("migrate", help="create or upgrade the schema (versioned, idempotent, one "
                                                "transaction)")
    migrate.add_argument("--serving-role", default="",
                         help="PostgreSQL: grant this role what serving needs, and only SELECT and INSERT on "
                              "the audit tables")
    add_anywhere(store, [migrate], "--store", help="sqlite:///path or postgresql://...; default: "
                                                   "$TOOLAUTHZ_STORE, else the config's, else <data-dir>/toolauthz.db")
    add_anywhere(store, [migrate], "--data-dir")
    add_anywhere(store, [migrate], "--config")
    store.set_defaults(func=run)


def store_url_of(args: argparse.Namespace) -> str:
    """--store, else the settings' (TOOLAUTHZ_STORE, the config file, the data directory)."""
    from sidecar.server.config import load_settings

    settings = load_settings(getattr(args, "config", None), data_dir=getattr(args, "data_dir", None),
                             store=getattr(args, "store", None))
    return settings.store_url


def run(args: argparse.Namespace) -> int:
    from sidecar.store.open import migrate_store
    from sidecar.store.postgres import shown_url

    url = store_url_of(args)
    before, after = migrate_store(url, serving_role=args.serving_role)
    what = "created" if before == 0 else "already current" if before == after else f"upgraded from {before}"
    print(f"{shown(shown_url(url))}: schema version {after} ({what})")
    if args.serving_role:
        print(f"granted `{shown(args.serving_role)}` the serving privileges")
    return 0
