"""The static entities (entities.json) as a graph, so that a request is evaluated with the
static entities it can reach, not a copy of all of them.

A clone of the whole static set per request, merged with the runtime's entities and
checked against the schema as a whole, would cost a request more as entities.json grows
(1-2 ms more per decision at 1,000 static users, 24-27 ms at 10,000;
docs/performance.md), and a cache of such clones would grow as fast. Cedar can only look at an entity it reaches from
the request: the principal, the resource, an entity a policy names, and from any of
those their parents (for `in`) and the entities their attributes and tags refer to. The
closure of those over the static graph is all that evaluation can observe; the
ancestors Cedar computes for an entity come from parents, which the closure follows,
so they are the same too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

UID = tuple[str, str]
MAX_CACHED_REACHES = 4096


def references(value: Any) -> Iterator[UID]:
    """Every entity a JSON value names: any object with a string `type` and `id` (a
    parent, an `__entity` escape, a reference typed by the schema, a policy's scope or
    literal). Taking a plain record of that shape for a reference only keeps more."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            kind, name = item.get("type"), item.get("id")
            if isinstance(kind, str) and isinstance(name, str):
                yield kind, name
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def entity_references(entity: dict[str, Any]) -> Iterator[UID]:
    """What one entity (Cedar's JSON form) leads to: its parents, and the entities its
    attributes and tags refer to."""
    return references([entity.get("parents", []), entity.get("attrs", {}), entity.get("tags", {})])


class StaticGraph:
    def __init__(self, entities: list[dict[str, Any]]):
        self._json: dict[UID, dict[str, Any]] = {}
        for entity in entities:
            self._json[(entity["uid"]["type"], entity["uid"]["id"])] = entity
        self._next = {uid: tuple({r for r in entity_references(e) if r in self._json and r != uid})
                      for uid, e in self._json.items()}
        self._reach_cache: dict[tuple[frozenset[UID], frozenset[UID]], frozenset[UID]] = {}

    def __len__(self) -> int:
        return len(self._json)

    @property
    def uids(self) -> frozenset[UID]:
        return frozenset(self._json)

    def closure(self, seeds: Iterable[UID]) -> frozenset[UID]:
        """The static entities reachable from `seeds` (those of them that are static
        included)."""
        seen: set[UID] = set()
        stack = [s for s in seeds if s in self._json]
        while stack:
            uid = stack.pop()
            if uid not in seen:
                seen.add(uid)
                stack.extend(self._next[uid])
        return frozenset(seen)

    def reach(self, base: frozenset[UID], seeds: Iterable[UID]) -> frozenset[UID]:
        """`base` (already closed, as a slice's policy_reach is) plus the closure of
        `seeds`. Cached by the static seeds: most requests bring none, or the same few."""
        found = frozenset(s for s in seeds if s in self._json)
        if found <= base:
            return base
        key = (base, found)
        cached = self._reach_cache.get(key)
        if cached is None:
            if len(self._reach_cache) >= MAX_CACHED_REACHES:
                self._reach_cache.clear()  # bounded; a sweep of new principals just refills it
            cached = self._reach_cache[key] = base | self.closure(found)
        return cached

    def entities_json(self, uids: Iterable[UID]) -> str:
        """Cedar's JSON of these static entities, in a fixed order."""
        return json.dumps([self._json[uid] for uid in sorted(uids)])
