"""Text that came from a model or a runtime, made safe to show a human.

A resource id is taken from the model's arguments; a runtime names principals, call ids
and entities. Printed raw, such a string can carry newlines that forge extra lines of a
table, ANSI escapes that hide the real ones (`ESC[8m`), quotes that close the quoted id
early, or invisible characters (U+200B, bidi overrides) that make two names look alike.
`display` renders every such character visibly, the way a Python or Cedar string
literal would, so that what a person reads is exactly what the sidecar holds.
"""

from __future__ import annotations

import logging
import re
from typing import Any

# A short prefix is enough to recognise a value in a message; a whole value could be
# megabytes (and over gRPC a message above 16 KB no longer fits the trailer).
SHOWN_PREFIX_CHARS = 64
MAX_MESSAGE_CHARS = 1024

_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\", '"': '\\"', "`": "\\`"}
_UID = re.compile(r'([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)::"(.*)"', re.DOTALL)


def _escape_char(char: str, *, quotes: bool) -> str:
    if char in _NAMED_ESCAPES and (quotes or char not in '\\"`'):
        return _NAMED_ESCAPES[char]
    if char.isprintable():
        return char
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def display(text: str, *, quotes: bool = True) -> str:
    """`text` with every control, format, separator or otherwise unprintable character
    escaped (`\\n`, `\\x1b`, `\\u200b`), and with `\\`, `"` and backticks escaped too, so
    that the result never spans lines, never moves the cursor and never closes a quote.
    `quotes=False` keeps backslashes and quotes as they are, for text that is already a
    literal of its own (JSON, a Cedar uid built by `display_uid`)."""
    if text.isprintable() and (not quotes or not any(c in text for c in '\\"`')):
        return text
    return "".join(_escape_char(c, quotes=quotes) for c in text)


def display_uid(text: str) -> str:
    """A `Type::"id"` string with its id escaped as a Cedar string literal is, so that
    a quote inside the id cannot end it; anything else goes through `display`."""
    match = _UID.fullmatch(text)
    if match is None:
        return display(text)
    return f'{match.group(1)}::"{display(match.group(2))}"'


def shown(value: str | bytes, limit: int = SHOWN_PREFIX_CHARS) -> str:
    """A caller's value for an error message: escaped, and only its first `limit`
    characters (the rest is counted, never copied)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if len(value) <= limit:
        return display(value)
    return f"{display(value[:limit])}… ({len(value) - limit} more characters)"


def bounded_message(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """A whole message for a log line or a status detail: unprintable characters
    escaped (quotes kept, the message's own backticks mark values) and cut at `limit`."""
    safe = display(message, quotes=False)
    if len(safe) <= limit:
        return safe
    return safe[:limit] + "… (message cut)"


class EscapingFormatter(logging.Formatter):
    """Log lines that a logged value cannot split or recolour: the message is escaped as
    `bounded_message` does (whole, not cut), and a traceback keeps its lines but has
    every other unprintable character escaped."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return display(super().formatMessage(record), quotes=False)

    def formatException(self, ei: Any) -> str:
        return "\n".join(display(line, quotes=False) for line in super().formatException(ei).split("\n"))

    def formatStack(self, stack_info: str) -> str:
        return "\n".join(display(line, quotes=False) for line in stack_info.split("\n"))


def use_escaping_formatter(level: int, fmt: str) -> None:
    """`logging.basicConfig(level, format)` whose handler escapes its lines. Like
    basicConfig, it leaves a root logger that already has handlers as it is."""
    root = logging.getLogger()
    if root.handlers:
        return
    logging.basicConfig(level=level, format=fmt)
    for handler in root.handlers:
        handler.setFormatter(EscapingFormatter(fmt))
