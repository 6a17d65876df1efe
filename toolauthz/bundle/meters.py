"""A tool file's usage meters (`usage:`): named sums or counts over a sliding window,
kept per principal, resource, tenant or pinned argument, which policies read in
`context.usage.<meter>` as their value before the call being decided.

    usage:
      refund_cents_24h: {sum: /amount_cents, per: [principal], window: 24h}
      external_emails_1h: {count: true, per: [principal, /domain], window: 1h}

Windows slide: a meter's value is the sum of the charges made in the `window` before
the decision, so "500.00 a day" never admits 1,000.00 around a midnight as a fixed
window would. Every input here is a security team's, checked at load time; the values
the meters are keyed and summed on are the model's, so they must be pinned by the
input schema like a resource id (`tool_fields.pinned_key_problem`), and a summed
argument must be an integer the schema keeps non-negative (a negative charge would
refund the budget).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolauthz.bundle.tool_fields import parse_duration, pinned_key_problem, schema_at
from toolauthz.usage.charges import CEILING, MAX_WINDOW_SECONDS

METER_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")
MAX_METERS = 8  # per tool: each is read and locked on every decision of the tool
# What a meter may be kept per, besides a pinned argument (a JSON pointer).
SCOPES = ("principal", "resource", "tenant")
_KEYS = {"sum", "count", "per", "window"}

Complain = Callable[[str, str], None]  # (JSON pointer, message)


@dataclass(frozen=True)
class Meter:
    """`sum`: the JSON pointer of the argument each call adds (None: each call adds 1);
    `per`: what the value is kept for, each a scope of SCOPES or a pointer; `window`:
    seconds a charge counts for."""

    name: str
    sum: str | None
    per: tuple[str, ...]
    window: int


def parse_usage(raw: Any, input_schema: dict[str, Any] | None, bad: Complain) -> tuple[Meter, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        bad("/usage", "usage must map meter names to meters such as `{sum: /amount, per: [principal], window: 24h}`")
        return ()
    if len(raw) > MAX_METERS:
        bad("/usage", f"a tool has at most {MAX_METERS} meters")
        return ()
    meters = []
    for name, spec in raw.items():
        where = f"/usage/{str(name).replace('~', '~0').replace('/', '~1')}"
        if not isinstance(name, str) or not METER_NAME.fullmatch(name):
            bad(where, "a meter name must match `^[a-z][a-z0-9_]{0,63}$`")
            continue
        meter = _parse_meter(name, spec, input_schema, _under(where, bad))
        if meter is not None:
            meters.append(meter)
    return tuple(meters)


def _under(where: str, bad: Complain) -> Complain:
    """`bad`, for pointers relative to `where`."""
    return lambda pointer, message: bad(where + pointer, message)


def _parse_meter(name: str, spec: Any, input_schema: dict[str, Any] | None, bad: Complain) -> Meter | None:
    if not isinstance(spec, dict):
        bad("", "a meter is a mapping with `sum` or `count`, `per` and `window`")
        return None
    problems = 0

    def fail(pointer: str, message: str) -> None:
        nonlocal problems
        problems += 1
        bad(pointer, message)

    for key in sorted(set(spec) - _KEYS):
        fail(f"/{key}", f"unknown meter field `{key}`; expected sum or count, per and window")
    summed = _parse_amount(spec, input_schema, fail)
    per = _parse_per(spec.get("per"), input_schema, fail)
    window = parse_duration(spec.get("window", ""))
    if window is None or window > MAX_WINDOW_SECONDS:
        fail("/window", "window must be a duration such as `1h`, `24h` or `7d`, at most 90d")
    if problems or window is None:
        return None
    return Meter(name, summed, per, window)


def _parse_amount(spec: dict[str, Any], input_schema: dict[str, Any] | None, fail: Complain) -> str | None:
    """The summed argument's pointer, or None for a count."""
    if ("sum" in spec) == ("count" in spec):
        fail("", "a meter has exactly one of `sum: /argument` and `count: true`")
        return None
    if "count" in spec:
        if spec["count"] is not True:
            fail("/count", "count must be `true`")
        return None
    pointer = spec["sum"]
    if not isinstance(pointer, str) or not pointer.startswith("/"):
        fail("/sum", "sum must be a JSON pointer into the input, such as `/amount_cents`")
        return None
    if input_schema is None:
        return pointer
    sub, always = schema_at(input_schema, pointer)
    if sub is None:
        fail("/sum", f"the input schema cannot produce `{pointer}`")
    elif not always:
        fail("/sum", f"`{pointer}` is not required at every level, so a call could charge nothing")
    elif sub.get("type") != "integer":
        fail("/sum", f"`{pointer}` must be an integer property (Cedar has no fractions: use cents)")
    elif not _non_negative(sub):
        fail("/sum", f"`{pointer}` must declare `minimum: 0` or more: a negative charge would refund the budget")
    elif isinstance(sub.get("maximum"), (int, float)) and sub["maximum"] > CEILING:
        fail("/sum", f"`{pointer}` must have a `maximum` of at most {CEILING}")
    return pointer


def _non_negative(schema: dict[str, Any]) -> bool:
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    return isinstance(low, (int, float)) and not isinstance(low, bool) and low >= 0


def _parse_per(raw: Any, input_schema: dict[str, Any] | None, fail: Complain) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) for p in raw):
        fail("/per", "per must be a non-empty list of `principal`, `resource`, `tenant` or JSON pointers")
        return ()
    if len(set(raw)) != len(raw):
        fail("/per", "per names each key once")
    for i, item in enumerate(raw):
        if item in SCOPES:
            continue
        if not item.startswith("/"):
            fail(f"/per/{i}", f"`{item}` is not `principal`, `resource`, `tenant` or a JSON pointer")
        elif input_schema is not None and (problem := pinned_key_problem(input_schema, item, "meter key")):
            fail(f"/per/{i}", problem)
    return tuple(raw)
