"""How a tool's arguments are shown to a person: the `display` block of a tool file.

    display:
      /amount_cents: {label: Amount, money: EUR, minor_units: 2}   # 7500 -> "75.00 EUR"
      /reason: {label: "Model's reason", show: true}

Each key is a JSON pointer to a property of the input schema. `label` names the field
for people; `money` (an ISO 4217 code) and `minor_units` (0-4, default 2) render an
integer amount in major units; `show: true` allow-lists the field for approvers (the
console, the CLI and notifications), beside the `audit.record` fields, which approvers
see too. A field neither lists is never shown to anyone. The console, the CLI and the
notifications all render through `shown_value`, so a value reads the same everywhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from toolauthz.display.escape import display

_CURRENCY = re.compile(r"^[A-Z]{3}\Z")
_KEYS = {"label", "money", "minor_units", "show"}
MAX_LABEL_CHARS = 64
MAX_SHOWN_CHARS = 512


@dataclass(frozen=True)
class DisplayHint:
    label: str = ""
    money: str = ""  # ISO 4217 currency code: the value is an integer in minor units
    minor_units: int = 2
    show: bool = False


def parse_display(raw: Any, property_at: Callable[[str], dict[str, Any] | None],
                  bad: Callable[[str, str], None]) -> dict[str, DisplayHint]:
    """The hints of a tool file's `display` block; each problem goes to `bad(pointer,
    message)`. `property_at(pointer)` is the input schema's subschema there, or None."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        bad("/display", "display must map JSON pointers such as `/amount_cents` to hints")
        return {}
    hints: dict[str, DisplayHint] = {}
    for pointer, hint in raw.items():
        where = "/display/" + str(pointer).replace("~", "~0").replace("/", "~1")
        if not isinstance(pointer, str) or not pointer.startswith("/"):
            bad(where, f"`{display(str(pointer))}` is not a JSON pointer such as `/amount_cents`")
            continue
        schema = property_at(pointer)
        if schema is None:
            bad(where, f"the input schema has no property at `{display(pointer)}`")
            continue
        if not isinstance(hint, dict):
            bad(where, "a display hint is a mapping of label, money, minor_units and show")
            continue
        for key in sorted(set(hint) - _KEYS, key=str):
            bad(f"{where}/{key}", f"unknown display key `{display(str(key))}`; expected one of "
                                  f"{', '.join(sorted(_KEYS))}")
        label, money, units, show = (hint.get("label", ""), hint.get("money", ""), hint.get("minor_units", 2),
                                     hint.get("show", False))
        if not isinstance(label, str) or len(label) > MAX_LABEL_CHARS or not label.isprintable():
            bad(f"{where}/label", f"label must be printable text of at most {MAX_LABEL_CHARS} characters")
            continue
        if not isinstance(money, str) or (money and not _CURRENCY.fullmatch(money)):
            bad(f"{where}/money", "money must be an ISO 4217 currency code such as `EUR`")
            continue
        if money and schema.get("type") != "integer":
            bad(f"{where}/money", "money needs an integer property (an amount in minor units)")
            continue
        if not isinstance(units, int) or isinstance(units, bool) or not 0 <= units <= 4:
            bad(f"{where}/minor_units", "minor_units must be an integer from 0 to 4")
            continue
        if not isinstance(show, bool):
            bad(f"{where}/show", "show must be true or false")
            continue
        hints[pointer] = DisplayHint(label, money, units, show)
    return hints


def money(value: int, currency: str, minor_units: int) -> str:
    scale = 10 ** minor_units
    sign = "-" if value < 0 else ""
    whole, part = divmod(abs(value), scale)
    return f"{sign}{whole:,}.{part:0{minor_units}d} {currency}" if minor_units else f"{sign}{whole:,} {currency}"


def shown_value(value: Any, hint: DisplayHint | None) -> str:
    """A value as a person reads it: an amount in major units, a string escaped, anything
    else as compact JSON, escaped and cut to MAX_SHOWN_CHARS."""
    if hint is not None and hint.money and isinstance(value, int) and not isinstance(value, bool):
        return money(value, hint.money, hint.minor_units)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                                                           sort_keys=True)
    text = display(text, quotes=False)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + "…"


def labelled(fields: Mapping[str, Any], hints: Mapping[str, DisplayHint]) -> dict[str, str]:
    """Allow-listed fields (`{pointer: value}`) as `{label: shown value}`: those with a
    hint in the order the tool file lists them, then the others by pointer."""
    out: dict[str, str] = {}
    for pointer in [p for p in hints if p in fields] + sorted(p for p in fields if p not in hints):
        hint = hints.get(pointer)
        out[(hint.label if hint and hint.label else pointer)] = shown_value(fields[pointer], hint)
    return out


def shown_usage(usage: Mapping[str, int], hints: Mapping[str, DisplayHint | None]) -> dict[str, str]:
    """Usage meters' values as `{meter: shown value}`, in name order; `hints`: by meter, the
    hint of the argument a sum meter adds (its amounts are shown alike)."""
    return {name: shown_value(usage[name], hints.get(name)) for name in sorted(usage)}
