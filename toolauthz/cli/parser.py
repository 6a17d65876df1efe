"""An argparse parser whose usage errors suggest the closest name: a mistyped command,
choice or option gets `; did you mean `x`?` (argparse itself only lists the choices)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from typing import NoReturn

from toolauthz.bundle.suggest import did_you_mean

_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)$")
_UNRECOGNIZED = re.compile(r"^unrecognized arguments: (-\S+)")


class SuggestingParser(argparse.ArgumentParser):
    """Sub-commands made with `add_subparsers` are of this class too (argparse uses the
    parent's class), so every command and verb suggests."""

    def error(self, message: str) -> NoReturn:
        if found := _INVALID_CHOICE.search(message):
            choices = re.findall(r"'([^']*)'", found.group(2))
            message += did_you_mean(found.group(1), choices)
        elif found := _UNRECOGNIZED.search(message):
            message += did_you_mean(found.group(1).split("=")[0], set(_option_strings(self)))
        super().error(message)


def _option_strings(parser: argparse.ArgumentParser) -> Iterator[str]:
    """Every option of `parser` and of the commands under it."""
    for action in parser._actions:
        yield from (option for option in action.option_strings if option.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _option_strings(sub)
