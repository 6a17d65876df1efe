"""Did-you-mean for every name a bundle checks, and the source line under a problem.

The candidates are the names the generated schema and the catalog define: entity types,
each entity type's attributes, the `tool:<name>` actions (and `approve`), and each tool
context's attributes (`context.input.<...>`, typed from the tool's JSON Schema).
Cedar's validator names the unknown name in backticks; `for_cedar_message` reads it
from there and adds `; did you mean `x`?` when a candidate is close (difflib).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass

from toolauthz.bundle.catalog import Tool
from toolauthz.bundle.cedar_schema import APPROVE_ACTION, CedarType, tool_context_type
from toolauthz.errors import Problem

_ENTITY = re.compile(r"\bentity\s+([A-Za-z_][A-Za-z0-9_]*(?:\s*,\s*[A-Za-z_][A-Za-z0-9_]*)*)"
                     r"(?:\s+in\s*\[[^\]]*\])?\s*(?:=\s*)?(\{)?")
_ATTRIBUTE = re.compile(r'"?([A-Za-z_][A-Za-z0-9_]*)"?\s*\??\s*:')
_CONTEXT_ATTRIBUTE = re.compile(r'^attribute `([^`]+)` in context for Action::"([^"]+)" not found')
_ENTITY_ATTRIBUTE = re.compile(r"^attribute `([^`]+)` on entity type `([^`]+)` not found")
_ENTITY_TYPE = re.compile(r"^unrecognized entity type `([^`]+)`")
_ACTION = re.compile(r'^unrecognized action `Action::"([^"]+)"`')
_TOKEN = re.compile(r"[A-Za-z0-9_]+(?::[A-Za-z0-9_]+)?")


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`; did you mean `x`?` for the closest candidate, or "" when none is close."""
    close = closest(name, candidates)
    return f"; did you mean `{close}`?" if close else ""


def closest(name: str, candidates: Iterable[str]) -> str:
    """The candidate closest to `name` (other than itself), or "" when none is close."""
    close = difflib.get_close_matches(name, sorted(set(candidates) - {name}), n=1, cutoff=0.6)
    return close[0] if close else ""


@dataclass(frozen=True)
class Names:
    """What a bundle defines, for suggestions."""

    entity_types: frozenset[str]
    entity_attributes: dict[str, frozenset[str]]
    tools: dict[str, Tool]

    @property
    def actions(self) -> list[str]:
        return [f"tool:{name}" for name in self.tools] + [APPROVE_ACTION]

    def for_cedar_message(self, message: str) -> str:
        """The suggestion for one of Cedar's validation messages, or ""."""
        if found := _CONTEXT_ATTRIBUTE.match(message):
            *path, name = found.group(1).split(".")
            tool = self.tools.get(found.group(2).removeprefix("tool:"))
            record = _record_at(tool_context_type(tool), path) if tool is not None else None
            return did_you_mean(name, record or ())
        if found := _ENTITY_ATTRIBUTE.match(message):
            return did_you_mean(found.group(1).split(".")[-1], self.entity_attributes.get(found.group(2), ()))
        if found := _ENTITY_TYPE.match(message):
            return did_you_mean(found.group(1), self.entity_types)
        if found := _ACTION.match(message):
            return did_you_mean(found.group(1), self.actions)
        return ""


def names_of(user_schema: str, generated_types: Iterable[str], tools: dict[str, Tool]) -> Names:
    """The entity types and attributes of `user_schema` (read for suggestions only: Cedar
    parses the schema itself), plus the types toolauthz generates."""
    types, attributes = set(generated_types), {"Approval": frozenset({"tool", "group", "tenant", "requester"})}
    for found in _ENTITY.finditer(user_schema):
        declared = [name.strip() for name in found.group(1).split(",")]
        types.update(declared)
        if found.group(2):
            body = _braced(user_schema, found.end(2) - 1)
            for name in declared:
                attributes[name] = frozenset(_ATTRIBUTE.findall(body))
    return Names(frozenset(types), attributes, tools)


def _braced(text: str, start: int) -> str:
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
    return text[start:]


def _record_at(t: CedarType, path: list[str]) -> list[str] | None:
    """The attribute names of the record at `path` inside the context type."""
    for step in path:
        if isinstance(t, tuple) and t[0] == "Record" and step in t[1]:
            t = t[1][step][0]
        else:
            return None
    return list(t[1]) if isinstance(t, tuple) and t[0] == "Record" else None


def with_excerpts(problems: list[Problem], sources: dict[str, str]) -> list[Problem]:
    """Each located problem of a file in `sources` with its source line and the length of
    the name at its column, for the caret line `Problem.render` draws under it."""
    out = []
    for problem in problems:
        text = sources.get(problem.file)
        lines = text.splitlines() if text is not None else []
        if problem.excerpt or not problem.line or problem.line > len(lines):
            out.append(problem)
            continue
        line = lines[problem.line - 1]
        col = max(problem.col, 1)
        token = _TOKEN.match(line, col - 1)
        span = len(token.group()) if token else 1
        out.append(Problem(problem.file, problem.message, problem.line, col, problem.pointer, line, span))
    return out
