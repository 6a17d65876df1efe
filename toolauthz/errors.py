"""The error tree. Every error the package raises on purpose derives from ToolAuthzError.

    ToolAuthzError
    ├── BundleError          a policy bundle cannot be loaded (carries every Problem)
    ├── RequestError         the trusted part of a request is missing or malformed
    ├── InputError           the model's arguments are unusable (becomes a DENY, not a failure)
    ├── KeyFileError         a signing or audit key is missing, of the wrong type or too open
    ├── StoreUnavailable     the ledger, token store or audit log cannot be used (deny)
    ├── ConflictError / NotFoundError   a state transition that is not allowed
    ├── ForbiddenError       the caller may not do this (self-approval, another tenant)
    ├── PreconditionError    not in a state that allows it (an expired approval)
    └── ResourceExhaustedError  a bounded resource is full (open approval watches)

Only the service layer turns these into status codes (service/failures.py). Messages follow Cedar's
style: lowercase start, no final period, user input in backticks.
"""

from __future__ import annotations

from dataclasses import dataclass


class ToolAuthzError(Exception):
    """Root of every error raised on purpose by toolauthz."""


@dataclass(frozen=True)
class Problem:
    """One reason a bundle was refused, located as precisely as the source allows."""

    file: str
    message: str
    line: int = 0
    col: int = 0
    pointer: str = ""  # JSON pointer, for catalog and schema problems
    excerpt: str = ""  # the source line at `line`, when the file is text toolauthz read
    span: int = 0  # characters of the offending text from `col`

    def __str__(self) -> str:
        where = self.file
        if self.line:
            where += f":{self.line}:{self.col or 1}"
        if self.pointer:
            return f"{where}: at `{self.pointer}`: {self.message}"
        return f"{where}: {self.message}"

    def render(self) -> str:
        """`str(self)`, then the source line and a caret line under the offending text, as
        Cedar's own CLI shows them. Control characters of the line are shown as `?` so
        that the carets stay under what they mark and the terminal draws nothing else."""
        if not self.excerpt or not self.col:
            return str(self)
        shown = "".join(c if c.isprintable() else "?" for c in self.excerpt)
        gutter = " " * len(str(self.line))
        return (f"{self}\n {self.line} | {shown}\n {gutter} | "
                f"{' ' * (self.col - 1)}{'^' * max(self.span, 1)}")


class BundleError(ToolAuthzError):
    def __init__(self, problems: list[Problem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class RequestError(ToolAuthzError):
    """The runtime sent a request without a usable trusted context or call envelope."""


class InputError(ToolAuthzError):
    """The model's arguments cannot be used; `code` is stable, `message` is model-safe."""

    def __init__(self, code: str, message: str):
        self.code = code
        self.message = message
        super().__init__(f"{code}: {message}")


class KeyFileError(ToolAuthzError):
    """A key file is missing, of the wrong type, or readable by group or others."""


class StoreUnavailable(ToolAuthzError):
    """The store cannot be reached or written: every caller must deny."""

    @classmethod
    def caused_by(cls, cause: BaseException) -> StoreUnavailable:
        """A new instance per caller: one instance raised in many threads (or coroutines)
        would share, and garble, one traceback."""
        error = cls(str(cause))
        error.__cause__ = cause
        return error


class ConflictError(ToolAuthzError):
    """The request conflicts with recorded state (for example a second terminal outcome)."""


class NotFoundError(ToolAuthzError):
    """The named object (call, approval, ...) is not known."""


class ForbiddenError(ToolAuthzError):
    """The caller may not do this (e.g. approve their own call, or another tenant's)."""


class PreconditionError(ToolAuthzError):
    """The object is not in a state that allows this (e.g. an expired approval). `code`,
    when set, is a stable machine code that leads the message (`policy_changed: ...`)."""

    def __init__(self, message: str, code: str = ""):
        self.code = code
        super().__init__(f"{code}: {message}" if code else message)


class ResourceExhaustedError(ToolAuthzError):
    """A bounded resource (such as the open approval watches of a caller) is full; the
    caller may try again once some of its own uses have ended."""
