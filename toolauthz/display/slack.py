"""Text for Slack's mrkdwn, where a model-written string must stay inert.

Slack's grammar has no backslash escape: `\\` shows as a backslash, and inside a code
span nothing can escape a backtick, so one in a value would end the span and let the
rest format as bold, open a link or mention a channel. So every value a model, a
runtime or a bundle supplied goes into a code span of its own, written for that grammar:

- `&`, `<` and `>` as the entities Slack documents (no `<!channel>`, no `<url|text>`);
- a backtick as U+02CB (ˋ), which looks like one and cannot close the span;
- control characters as their Control Pictures (U+2400 block: a newline is ␊, ESC is ␛),
  and other unprintable or invisible ones (U+200B, bidi overrides) as `⟨U+200B⟩`, so a
  value never spans lines and two values never look alike;
- an empty value as `⟨empty⟩`, since an empty span shows its backticks.

Nothing here adds a backslash: what a person reads is the value, not an escape syntax.
"""

from __future__ import annotations

from typing import Any

_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_BACKTICK = "\u02cb"
_DEL_PICTURE = "\u2421"


def _slack_char(char: str) -> str:
    if char in _ENTITIES:
        return _ENTITIES[char]
    if char == "`":
        return _BACKTICK
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)
    if code == 0x7F:
        return _DEL_PICTURE
    if char.isprintable():
        return char
    return f"⟨U+{code:04X}⟩"


def slack_code(value: Any) -> str:
    """`value` as one inline code span that no character of it can end or escape."""
    text = str(value)
    if not text:
        return "`⟨empty⟩`"
    return "`" + "".join(_slack_char(c) for c in text) + "`"
