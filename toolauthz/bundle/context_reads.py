"""Which parts of a tool's Cedar context its policies can read, found once at load time,
so that every request hands Cedar only those parts.

Cedar parses the whole context of every request before it evaluates anything, and that
parse is the larger part of an evaluation: with one policy, 99 µs for a context of five
attributes against 30 µs for an empty one (docs/performance.md). A policy can observe the
context only through expressions in its text: `context.a.b`, `context has a`, or
`context` (or a part of it) used as a whole value. A part that no policy of a tool's
slice names can therefore be left out without changing any answer, and a part a policy
names but the request lacks is absent either way. Anything this reader does not
recognise counts as a use of the whole value it stands on: unknown means keep.

A read set is a tree: `None` for "the whole value", or a dict of attribute -> read set
(an empty dict: only whether the value is there, which a record keeps as `{}`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from toolauthz.bundle.cedar_schema import CedarType

Reads = dict[str, "Reads"] | None
_CONTEXT = {"Var": "context"}


def context_reads(policy_ests: Iterable[dict[str, Any]]) -> Reads:
    """The parts of the context that the `when`/`unless` conditions of these policies
    (Cedar's JSON form) can read."""
    reads = _ReadSet()
    for est in policy_ests:
        _visit(est.get("conditions", []), reads)
    return reads.tree


def narrowed(t: CedarType, reads: Reads) -> CedarType:
    """`t` (a record type) keeping only what `reads` names; projecting a value through
    the result (cedar_schema.project) drops the rest."""
    if reads is None or not (isinstance(t, tuple) and t[0] == "Record"):
        return t
    return ("Record", {name: (narrowed(sub, reads[name]), required)
                       for name, (sub, required) in t[1].items() if name in reads})


class _ReadSet:
    def __init__(self) -> None:
        self.tree: Reads = {}

    def add(self, path: list[str], whole: bool = True) -> None:
        """The value at `path` (a list of attributes under `context`) is read: all of
        it, or (`whole=False`) only whether it is there."""
        if self.tree is None:
            return
        if not path:
            if whole:
                self.tree = None
            return
        node = self.tree
        for attr in path[:-1]:
            if attr in node and node[attr] is None:
                return  # already read whole
            node = node.setdefault(attr, {})  # type: ignore[assignment]  # a None here returned above
        if whole:
            node[path[-1]] = None
        else:
            node.setdefault(path[-1], {})


def _path(expr: Any) -> list[str] | None:
    """The attributes an expression reads from `context` by a chain of `.` accesses
    (`context.input.qty` -> ["input", "qty"], `context` -> []); None if it is not one."""
    attrs: list[str] = []
    while isinstance(expr, dict):
        if expr == _CONTEXT:
            return attrs[::-1]
        access = expr.get(".") if len(expr) == 1 else None
        if not (isinstance(access, dict) and isinstance(access.get("attr"), str)):
            return None
        attrs.append(access["attr"])
        expr = access.get("left")
    return None


def _visit(node: Any, reads: _ReadSet) -> None:
    if isinstance(node, list):
        for item in node:
            _visit(item, reads)
        return
    if not isinstance(node, dict):
        return
    path = _path(node)
    if path is not None:  # a chain used as a value: all of it is read
        reads.add(path)
        return
    test = node.get("has") if len(node) == 1 else None
    if isinstance(test, dict) and isinstance(test.get("attr"), str):
        base = _path(test.get("left"))
        if base is not None:  # `context... has a`: only whether `a` is there
            reads.add(base + [test["attr"]], whole=False)
            return
    for value in node.values():
        _visit(value, reads)
