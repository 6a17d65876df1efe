"""How a command prints: `--output text|json` everywhere, and the spellings that came
before it (`--json`, `--format`) kept as aliases."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_output_option(command: argparse.ArgumentParser, *, json_alias: bool = False, default: str = "text",
                      help: str | None = None) -> None:
    """`--output text|json` (default text); with `json_alias`, `--json` means `--output json`."""
    command.add_argument("--output", "-o", choices=["text", "json"], default=default,
                         help=help or f"text for people or JSON for programs (default {default})")
    if json_alias:
        command.add_argument("--json", dest="output", action="store_const", const="json",
                             help="the same as `--output json`")


def add_json_only_output(command: argparse.ArgumentParser, what: str) -> None:
    """`--output json` for a command whose output is JSON already: accepted so that a
    script may say it everywhere; `--output text` is refused by argparse (exit 2)."""
    command.add_argument("--output", "-o", choices=["json"], default="json",
                         help=f"json only: {what} is JSON (there is no text form)")


def print_json(value: Any) -> None:
    """One JSON document on standard output, keys sorted, as the `--output json` commands print."""
    print(json.dumps(value, sort_keys=True))


def wants_json(args: argparse.Namespace) -> bool:
    return getattr(args, "output", "text") == "json"


def renamed_option(command: argparse.ArgumentParser, new: str, old: str, **options: Any) -> None:
    """`new`, with the old spelling `old` still accepted: it warns on standard error and
    means the same."""
    base = argparse._AppendAction if options.get("action") == "append" else argparse._StoreAction
    options.pop("action", None)

    class Deprecated(base):  # type: ignore[misc,valid-type]
        def __call__(self, parser, namespace, values, option_string=None):
            if option_string == old:
                print(f"toolauthz: warning: `{old}` is deprecated here; use `{new}`", file=sys.stderr)
            super().__call__(parser, namespace, values, option_string)

    command.add_argument(new, old, action=Deprecated, **options)
