"""How a command prints: `--output text|json` everywhere, and the spellings that came
before it (`--json`, `--format`) kept as aliases."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def add_output_option(command: argparse.ArgumentParser, *, json_alias: bool = False, default: str = "text") -> None:
    """`--output text|json` (default text); with `json_alias`, `--json` means `--output json`."""
    command.add_argument("--output", "-o", choices=["text", "json"], default=default,
                         help=f"text for people or JSON for programs (default {default})")
    if json_alias:
        command.add_argument("--json", dest="output", action="store_const", const="json",
                             help="the same as `--output json`")


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
