"""What a call charges to its tool's usage meters, and what a decision makes of the
meters' values: pure functions of the engine, beside it (no storage, no policy).

A charge's key is the canonical JSON of the meter's `per` values, the tenant always
around it in the store; a `per` argument is pinned by the input schema (checked at
load time), so a model cannot mint a fresh key per call, nor a key that reads as
another. A meter's value past `usage.CEILING`, or one this call would take past it,
saturates and denies: no sum a store or Cedar cannot hold is ever decided on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from toolauthz.bundle.catalog import Tool, resolve_pointer
from toolauthz.canonical import canonical_json
from toolauthz.errors import InputError
from toolauthz.model import Decision, ErrorDetail, TrustedContext, Verdict
from toolauthz.usage.charges import CEILING, Charge, saturated


def charges_of(tool: Tool, ctx: TrustedContext, value: Any, resource: str) -> tuple[Charge, ...]:
    """What a call of `tool` with the validated input `value` on `resource` charges to
    each of the tool's meters. Raises InputError for an amount no meter can hold."""
    charges = []
    for meter in tool.meters:
        amount = 1
        if meter.sum is not None:
            raw = _integral(resolve_pointer(value, meter.sum)[1])
            if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw <= CEILING:
                raise InputError("invalid_input", f"input at `{meter.sum}` must be an integer from 0 to {CEILING}")
            amount = raw
        key = [_key_part(part, ctx, value, resource) for part in meter.per]
        charges.append(Charge(meter.name, canonical_json(key).decode(), amount, meter.window))
    return tuple(charges)


def _key_part(part: str, ctx: TrustedContext, value: Any, resource: str) -> str | int:
    if part == "principal":
        return str(ctx.principal)
    if part == "resource":
        return resource
    if part == "tenant":
        return ctx.tenant
    raw = _integral(resolve_pointer(value, part)[1])
    if isinstance(raw, int) and not isinstance(raw, bool) and abs(raw) <= CEILING:
        return raw
    if isinstance(raw, str):
        return raw
    raise InputError("invalid_input", f"input at `{part}` cannot key a usage meter")


def _integral(raw: Any) -> Any:
    """A whole float as the int it stands for (`integer` accepts 7.0, which must charge
    and key as 7 does); anything else as it is."""
    return int(raw) if isinstance(raw, float) and raw.is_integer() else raw


def usage_context(charges: tuple[Charge, ...], usage: Mapping[str, int]) -> dict[str, int]:
    """`context.usage`: each meter's value before this call (0 when never charged)."""
    return {charge.meter: saturated(usage.get(charge.meter, 0)) for charge in charges}


def over_ceiling(charges: tuple[Charge, ...], usage: Mapping[str, int]) -> Verdict | None:
    """The denial of a call that would take a meter past `CEILING`, or None."""
    for charge in charges:
        if usage.get(charge.meter, 0) + charge.amount > CEILING:
            return Verdict(Decision.DENY, errors=(ErrorDetail(
                "usage_overflow", f"usage meter `{charge.meter}` is at its ceiling; no call may add to it"),))
    return None
