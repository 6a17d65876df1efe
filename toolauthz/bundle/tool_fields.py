"""What the parsers of a tool file's blocks share: JSON pointers into the input schema,
the pinning of values that become keys (a resource id, a meter's key), and durations."""

from __future__ import annotations

import re
from typing import Any

# Keywords that pin a string to a known shape (see `pinned_key_problem`).
_PINNING_KEYWORDS = ("pattern", "enum", "const")
_PINNING_FORMATS = ("uuid",)

DURATION = re.compile(r"^([1-9][0-9]{0,5})([smhd])\Z")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_RETENTION_SECONDS = 90 * 86400


def schema_at(schema: dict[str, Any], pointer: str) -> tuple[dict[str, Any] | None, bool]:
    """The sub-schema a JSON pointer into an *instance* lands on, and whether every step
    is a required property (so the pointer always resolves on a valid input)."""
    node, always = schema, True
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        props = node.get("properties") if isinstance(node, dict) else None
        if not isinstance(props, dict) or token not in props:
            return None, False
        always = always and token in node.get("required", [])
        node = props[token]
    return node, always


def pinned_key_problem(input_schema: dict[str, Any], pointer: str, what: str) -> str | None:
    """Why the argument at `pointer` cannot name `what` (a resource, a meter's key), or
    None: it must be present on every valid input and be an integer or a string whose
    shape the schema pins. The value comes from the model; unpinned it can hold anything
    (newlines, quotes, terminal escapes) that an approver or auditor is later shown, or
    a new key per call that no limit ever sees twice."""
    sub, always = schema_at(input_schema, pointer)
    if sub is None:
        return f"the input schema cannot produce `{pointer}`"
    if not always:
        return f"`{pointer}` is not required at every level, so the {what} could be missing"
    if sub.get("type") not in ("string", "integer"):
        return f"`{pointer}` must be a string or integer property"
    if sub.get("type") == "string" and not _pins_its_shape(sub):
        return (f"`{pointer}` is a string without a `pattern`, `enum`, `const` or `format: uuid`: "
                f"the {what} comes from the model, and unpinned it can hold anything (newlines, quotes, "
                "terminal escapes) that an approver or auditor is later shown")
    return None


def _pins_its_shape(schema: dict[str, Any]) -> bool:
    return any(key in schema for key in _PINNING_KEYWORDS) or schema.get("format") in _PINNING_FORMATS


def parse_duration(text: str) -> int | None:
    """`30m`, `12h`, `7d` as seconds, or None when it is not such a duration."""
    found = DURATION.match(text) if isinstance(text, str) else None
    return int(found.group(1)) * _UNIT_SECONDS[found.group(2)] if found else None
