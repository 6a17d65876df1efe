"""JSON Schema's regexes, read as ECMA-262 (with the `u` flag) by Python's `re`.

A JSON Schema regex (`pattern`, the names of `patternProperties`) is an ECMA-262 regex.
Python's `re` reads the same text differently in ways that let inputs through:

    `$`           ECMA: the end of the input; `re`: also before a final "\\n", so
                  `^ord_[0-9]+$` would accept "ord_1\\n"             -> `\\Z`
    `.`           ECMA: anything but a line terminator (\\n \\r U+2028 U+2029);
                  `re`: anything but \\n                             -> `[^\\n\\r\\u2028\\u2029]`
    `\\d` `\\w`     ECMA: ASCII digits, ASCII word characters; `re`: Unicode ones
                  ("\\u0663" is a digit)                              -> `[0-9]`, `[A-Za-z0-9_]`
    `\\b` `\\B`     ECMA: between ASCII word characters (and `\\B` in an empty text)
                                                                   -> lookarounds on `[A-Za-z0-9_]`
    `\\s`          ECMA's WhiteSpace and LineTerminator list; `re`'s differs (U+001C..U+001F,
                  U+0085 are spaces to it, U+FEFF is not)          -> the list spelled out
    `[^]` `[]`    ECMA: any character, no character; `re`: a syntax error or another class

`python_pattern` rewrites an ECMA regex into a Python one with the same matches, token by
token. What it cannot promise to read as ECMA does is refused (NotEcmaRegex), so a bundle
with it is refused rather than decided by another dialect: backreferences (ECMA matches
a group that took no part as empty, `re` fails), `\\p{...}`, inline flags and modifier
groups, and whatever the `u` flag makes a syntax error (an unknown escape such as `\\Z`,
a lone `{`, `}` or `]`, a quantifier with nothing to repeat).

`ecma_schema` (bundle/ecma_schema.py) applies it to a whole schema.
"""

from __future__ import annotations

import functools
import re

__all__ = ["NotEcmaRegex", "UnknownSchemaPlace", "ecma_regex", "is_ecma_regex", "python_pattern"]

LINE_TERMINATORS = "\n\r\u2028\u2029"
# ECMA-262 WhiteSpace (TAB, VT, FF, SP, NBSP, ZWNBSP, Unicode Zs) and LineTerminator.
_ECMA_SPACE = "\t\x0b\x0c \xa0\ufeff\u1680\u2000-\u200a\u202f\u205f\u3000\n\r\u2028\u2029"
_DIGIT, _WORD = "0-9", "A-Za-z0-9_"
_WORD_BOUNDARY = "(?:(?<=[A-Za-z0-9_])(?![A-Za-z0-9_])|(?<![A-Za-z0-9_])(?=[A-Za-z0-9_]))"
_NOT_WORD_BOUNDARY = "(?:(?<=[A-Za-z0-9_])(?=[A-Za-z0-9_])|(?<![A-Za-z0-9_])(?![A-Za-z0-9_]))"
_CLASS_ESCAPES = {"d": _DIGIT, "w": _WORD, "s": _ECMA_SPACE}
_CONTROL_ESCAPES = {"t": "\t", "n": "\n", "v": "\x0b", "f": "\x0c", "r": "\r"}
_SYNTAX = "^$\\.*+?()[]{}|/"
_QUANTIFIER = re.compile(r"[*+?]|\{([0-9]+)(?:,([0-9]*))?\}")
_GROUP_OPENERS = (("(?:", "(?:"), ("(?=", "(?="), ("(?!", "(?!"), ("(?<=", "(?<="), ("(?<!", "(?<!"))
_GROUP_NAME = re.compile(r"\(\?<([A-Za-z_$][A-Za-z0-9_$]*)>")


class NotEcmaRegex(ValueError):
    """A regex this sidecar cannot read as ECMA-262 reads it; the message says why."""


class UnknownSchemaPlace(ValueError):
    """A `$ref` to a place of the document that is not a schema this module rewrites."""


def _escaped(char: str) -> str:
    return re.escape(char) if char not in LINE_TERMINATORS else f"\\x{ord(char):02x}" if ord(char) < 256 \
        else f"\\u{ord(char):04x}"


class _Reader:
    """One pass over an ECMA regex, writing its Python equivalent."""

    def __init__(self, pattern: str):
        self.text, self.at, self.out = pattern, 0, []  # type: tuple[str, int, list[str]]
        self.groups: list[bool] = []  # the open groups: whether each is a lookaround
        self.names: set[str] = set()

    def fail(self, why: str) -> NotEcmaRegex:
        return NotEcmaRegex(f"not read as ECMA-262: {why} (at character {self.at + 1})")

    def peek(self, size: int = 1) -> str:
        return self.text[self.at:self.at + size]

    def translate(self) -> str:
        repeatable = False
        while self.at < len(self.text):
            char = self.text[self.at]
            quantifier = _QUANTIFIER.match(self.text, self.at)
            if quantifier is not None:
                if not repeatable:
                    raise self.fail("a quantifier with nothing to repeat")
                low, high = quantifier.group(1), quantifier.group(2)
                if low is not None and high and int(high) < int(low):
                    raise self.fail("a quantifier whose range is out of order")
                self.out.append(quantifier.group(0))
                self.at = quantifier.end()
                if self.peek() == "?":
                    self.out.append("?")
                    self.at += 1
                repeatable = False
                continue
            repeatable = self.term(char)
        if self.groups:
            raise self.fail("an unclosed group")
        return "".join(self.out)

    def term(self, char: str) -> bool:
        """Writes the term at `self.at`; whether a quantifier may follow it."""
        if char in "{}]":
            raise self.fail(f"a lone `{char}` (escape it)")
        if char == "(":
            return self.group()
        if char == ")":
            if not self.groups:
                raise self.fail("a `)` that closes no group")
            self.out.append(")")
            self.at += 1
            return not self.groups.pop()  # ECMA (u flag) refuses a quantified lookaround
        self.at += 1
        if char == "|":
            self.out.append("|")
            return False
        if char == "^":
            self.out.append("^")
            return False
        if char == "$":
            self.out.append(r"\Z")
            return False
        if char == ".":
            self.out.append(f"[^{_escaped_set(LINE_TERMINATORS)}]")
            return True
        if char == "[":
            self.out.append(self.char_class())
            return True
        if char == "\\":
            return self.escape()
        self.out.append(_escaped(char))
        return True

    def group(self) -> bool:
        for ecma, python in _GROUP_OPENERS:
            if self.text.startswith(ecma, self.at):
                self.out.append(python)
                self.at += len(ecma)
                break
        else:
            named = _GROUP_NAME.match(self.text, self.at)
            if named is not None:
                if "$" in named.group(1) or named.group(1) in self.names:
                    raise self.fail("a group name this sidecar cannot read")
                self.names.add(named.group(1))
                self.out.append(f"(?P<{named.group(1)}>")
                self.at = named.end()
            elif self.peek(2) == "(?":
                raise self.fail("a group modifier or flag ECMA-262 does not have, or this sidecar does not read")
            else:
                self.out.append("(")
                self.at += 1
        self.groups.append(self.out[-1] in ("(?=", "(?!", "(?<=", "(?<!"))
        return False

    def escape(self) -> bool:
        """After a `\\` outside a class."""
        if self.at >= len(self.text):
            raise self.fail("a `\\` at the end")
        char = self.text[self.at]
        if char in "bB":  # spelled out: `re`'s `\\B` never matches in an empty text, ECMA's does
            self.at += 1
            self.out.append(_WORD_BOUNDARY if char == "b" else _NOT_WORD_BOUNDARY)
            return False
        if char in "dws":
            self.at += 1
            self.out.append(f"[{_class_text(_CLASS_ESCAPES[char])}]")
            return True
        if char in "DWS":
            self.at += 1
            self.out.append(f"[^{_class_text(_CLASS_ESCAPES[char.lower()])}]")
            return True
        self.out.append(_escaped(self.character_escape(in_class=False)))
        return True

    def character_escape(self, *, in_class: bool) -> str:
        """The one character a `\\` escape (at `self.at`, after the `\\`) stands for."""
        char = self.text[self.at]
        self.at += 1
        if char in _CONTROL_ESCAPES:
            return _CONTROL_ESCAPES[char]
        if char in _SYNTAX or (char.isascii() and not char.isalnum() and char.isprintable()):
            return char  # `\\-`, `\\#`...: ASCII punctuation stands for itself, as ECMA reads it without `u`
        if char == "0" and not self.peek().isdigit():
            return "\x00"
        if char == "c" and self.peek().isascii() and self.peek().isalpha():
            self.at += 1
            return chr(ord(self.text[self.at - 1]) % 32)
        if char == "x":
            return self.hex_digits(2)
        if char == "u":
            return self.unicode_escape()
        if char.isdigit() or char == "k":
            raise self.fail("a backreference (ECMA and Python differ on a group that took no part)")
        if char in "pP":
            raise self.fail("a Unicode property escape (`\\p{...}`), which this sidecar does not read")
        raise self.fail(f"the escape `\\{char}`, which ECMA-262 refuses with the `u` flag")

    def hex_digits(self, count: int) -> str:
        digits = self.peek(count)
        if len(digits) != count or not all(c in "0123456789abcdefABCDEF" for c in digits):
            raise self.fail("an incomplete hexadecimal escape")
        self.at += count
        return chr(int(digits, 16))

    def unicode_escape(self) -> str:
        if self.peek() == "{":
            end = self.text.find("}", self.at)
            digits = self.text[self.at + 1:end] if end > 0 else ""
            if not digits or not all(c in "0123456789abcdefABCDEF" for c in digits) or int(digits, 16) > 0x10FFFF:
                raise self.fail("a malformed `\\u{...}` escape")
            self.at = end + 1
            return chr(int(digits, 16))
        unit = self.hex_digits(4)
        if 0xD800 <= ord(unit) < 0xDC00 and self.peek(2) == "\\u":  # a surrogate pair is one character
            saved = self.at
            self.at += 2
            low = self.hex_digits(4)
            if 0xDC00 <= ord(low) < 0xE000:
                return chr(0x10000 + ((ord(unit) - 0xD800) << 10) + (ord(low) - 0xDC00))
            self.at = saved
        return unit

    def char_class(self) -> str:
        """After a `[`: the Python spelling of the class, up to and including its `]`."""
        negated = self.peek() == "^"
        self.at += negated
        ranges: list[str] = []  # Python class text, each character escaped
        excluded: list[str] = []  # the sets of `\\D`, `\\W`, `\\S`: everything but them
        while True:
            if self.at >= len(self.text):
                raise self.fail("an unclosed `[`")
            if self.text[self.at] == "]":
                self.at += 1
                break
            low = self.class_atom(ranges, excluded)
            if low is None:
                continue
            if self.peek() != "-" or self.peek(2) == "-]" or self.at + 1 >= len(self.text):
                ranges.append(_escaped(low))
                continue
            self.at += 1  # the `-` of a range
            high = self.class_atom(ranges, excluded)
            if high is None:
                raise self.fail("a range with a class escape at one end")
            if ord(high) < ord(low):
                raise self.fail("a class range out of order")
            ranges.append(f"{_escaped(low)}-{_escaped(high)}")
        alternatives = ([f"[{''.join(ranges)}]"] if ranges else []) + [f"[^{text}]" for text in excluded]
        if not negated:
            if not alternatives:
                return "(?!)"  # `[]`: no character
            return alternatives[0] if len(alternatives) == 1 else f"(?:{'|'.join(alternatives)})"
        if not excluded:
            return f"[^{''.join(ranges)}]" if ranges else "(?s:.)"
        return f"(?:(?!{'|'.join(alternatives)})(?s:.))"

    def class_atom(self, ranges: list[str], excluded: list[str]) -> str | None:
        """One class member: its character, or None for a class escape (added here)."""
        char = self.text[self.at]
        self.at += 1
        if char != "\\":
            return char
        if self.at >= len(self.text):
            raise self.fail("a `\\` at the end")
        escape = self.text[self.at]
        if escape in "dws":
            self.at += 1
            ranges.append(_class_text(_CLASS_ESCAPES[escape]))
            return None
        if escape in "DWS":
            self.at += 1
            excluded.append(_class_text(_CLASS_ESCAPES[escape.lower()]))
            return None
        if escape == "b":
            self.at += 1
            return "\b"
        return self.character_escape(in_class=True)


def _class_text(members: str) -> str:
    """A set written with literal characters and `a-b` ranges, escaped for a Python class."""
    out, index = [], 0
    while index < len(members):
        if index + 2 < len(members) and members[index + 1] == "-":
            out.append(f"{_escaped(members[index])}-{_escaped(members[index + 2])}")
            index += 3
        else:
            out.append(_escaped(members[index]))
            index += 1
    return "".join(out)


def _escaped_set(chars: str) -> str:
    return "".join(_escaped(c) for c in chars)


@functools.lru_cache(maxsize=4096)
def python_pattern(pattern: str) -> str:
    """The Python `re` pattern that matches what the ECMA-262 regex `pattern` (of a
    schema) matches; NotEcmaRegex when it cannot promise that."""
    return _python_pattern(pattern)


def is_ecma_regex(value: object) -> bool:
    """`format: regex`, read as ECMA-262: True for a value that is not a string (as
    every format check); raises NotEcmaRegex (the reason) for a string that is not an
    ECMA-262 regex this sidecar reads. Not cached: an input's text can be large."""
    if isinstance(value, str):
        _python_pattern(value)
    return True


def _python_pattern(pattern: str) -> str:
    translated = _Reader(pattern).translate()
    try:
        re.compile(translated)
    except re.error as exc:  # a lookbehind of no fixed width, say: ECMA reads it, `re` cannot
        raise NotEcmaRegex(f"not read as ECMA-262: Python cannot run it as ECMA-262 reads it ({exc.msg})") from None
    return translated


@functools.lru_cache(maxsize=4096)
def ecma_regex(pattern: str) -> re.Pattern[str]:
    """`pattern` (ECMA-262) compiled to match as ECMA-262 does."""
    return re.compile(python_pattern(pattern))
