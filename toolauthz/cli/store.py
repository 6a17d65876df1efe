"""`toolauthz store ...`: create or upgrade the store's schema, prune ended calls."""

from __future__ import annotations

import argparse
import json
import time

from toolauthz.cli.options import add_anywhere, moment
from toolauthz.cli.output import add_output_option, wants_json
from toolauthz.display.escape import shown
from toolauthz.errors import ToolAuthzError

_YOUNGEST_PRUNED = 3600.0


def add_store_command(sub) -> None:
    store = sub.add_parser("store", help="the store's schema (migrate) and retention (prune)")
    verbs = store.add_subparsers(dest="store_command", required=True)
    migrate = verbs.add_parser("migrate", help="create or upgrade the schema (versioned, idempotent, one "
                                                "transaction)")
    migrate.add_argument("--serving-role", default="",
                         help="PostgreSQL: grant this role what serving needs, and only SELECT and INSERT on "
                              "the audit tables")
    prune = verbs.add_parser("prune", help="remove the ledger rows of calls that ended before a date (never "
                                           "audit records)")
    prune.add_argument("--before", required=True, type=moment,
                       help="a duration ago (`7d`, `12h`, `30m`) or an ISO 8601 date or time (UTC if no zone)")
    prune.add_argument("--batch", type=int, default=1000, help="calls removed per transaction")
    every = [migrate, prune]
    for verb in every:
        add_output_option(verb)
    add_anywhere(store, every, "--store", help="sqlite:///path or postgresql://...; default: "
                                                   "$TOOLAUTHZ_STORE, else the config's, else <data-dir>/toolauthz.db")
    add_anywhere(store, every, "--data-dir")
    add_anywhere(store, every, "--config")
    store.set_defaults(func=run)


def store_url_of(args: argparse.Namespace) -> str:
    """--store, else the settings' (TOOLAUTHZ_STORE, the config file, the data directory)."""
    from toolauthz.server.config import load_settings

    settings = load_settings(getattr(args, "config", None), data_dir=getattr(args, "data_dir", None),
                             store=getattr(args, "store", None))
    return settings.store_url


def run(args: argparse.Namespace) -> int:
    return _prune(args) if args.store_command == "prune" else _migrate(args)


def _prune(args: argparse.Namespace) -> int:
    from toolauthz.store.open import open_store

    if args.batch < 1:
        raise ToolAuthzError("--batch must be at least 1")
    if args.before > time.time() - _YOUNGEST_PRUNED:
        # A call forgotten while its token (lifetime up to 600 s) or its reissue window
        # (up to an hour) lasts could be decided again under the same id.
        raise ToolAuthzError("--before must be at least an hour ago")
    store = open_store(store_url_of(args), pool_size=1)
    try:
        removed = store.prune(args.before, batch=args.batch)
    finally:
        store.close()
    if wants_json(args):
        print(json.dumps({"removed": removed}))
    else:
        print(f"removed the ledger rows of {removed} ended calls (audit records are kept)")
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from toolauthz.store.open import migrate_store
    from toolauthz.store.postgres import shown_url

    url = store_url_of(args)
    before, after = migrate_store(url, serving_role=args.serving_role)
    what = "created" if before == 0 else "already current" if before == after else f"upgraded from {before}"
    if wants_json(args):
        print(json.dumps({"store": shown_url(url), "schema_version": after, "previous_version": before}))
        return 0
    print(f"{shown(shown_url(url))}: schema version {after} ({what})")
    if args.serving_role:
        print(f"granted `{shown(args.serving_role)}` the serving privileges")
    return 0
