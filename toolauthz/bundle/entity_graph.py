"""The static entities (entities.json) as a graph, so that a request is evaluated with the
static entities it can reach instead of a copy of all of them, and only with those of
its own tenant.

A clone of the whole static set per request, merged with the runtime's entities and
checked against the schema as a whole, would cost a request more as entities.json grows
(1-2 ms more per decision at 1,000 static users, 24-27 ms at 10,000;
docs/performance.md), and a cache of such clones would grow as fast. Cedar can only look at an entity it reaches from
the request: the principal, the resource, an entity a policy names, and from any of
those their parents (for `in`) and the entities their attributes and tags refer to. The
closure of those over the static graph is all that evaluation can observe; the
ancestors Cedar computes for an entity come from parents, which the closure follows,
so they are the same too.

Tenancy: a static entity with `Tenant::"X"` among its ancestors (or that is
`Tenant::"X"`) belongs to tenant X; one with no tenant ancestor is shared. An entity of
tenant X is visible to X's requests only: the closure for a request of tenant Y never
enters it, as if it did not exist. The ancestors of a shared entity are shared and those
of X's entity are X's or shared, so a visible entity's ancestors are all visible; only an
attribute can point from a visible entity to an invisible one, and the closure stops there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

UID = tuple[str, str]
MAX_CACHED_REACHES = 4096
TENANT = "Tenant"
# A Cedar entity type name, possibly namespaced. Cedar itself refuses anything else (no
# whitespace, no comments), and a check must read a type exactly as Cedar will.
ENTITY_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*")
ENTITY_KEYS = frozenset({"uid", "attrs", "parents", "tags"})
MAX_SHOWN = 64


def show_uid(uid: UID) -> str:
    """A uid for a message: Cedar's syntax, with the id JSON-escaped (quotes, control
    characters and non-ASCII made visible) and cut short; it may come from a runtime."""
    kind, name = uid
    shown_kind = kind if ENTITY_TYPE_NAME.fullmatch(kind[:MAX_SHOWN]) else json.dumps(kind[:MAX_SHOWN])
    shown_name = json.dumps(name[:MAX_SHOWN])
    if len(name) > MAX_SHOWN:
        shown_name = shown_name[:-1] + '..."'
    return f"{shown_kind}::{shown_name}"


def parse_reference(value: Any) -> UID:
    """The uid Cedar reads from an entity reference in either of its JSON forms,
    `{"type": T, "id": I}` or `{"__entity": {"type": T, "id": I}}`. Anything else is
    refused, extra keys included: Cedar ignores some of them, and a check that read a key
    Cedar ignores (or the other way round) would check another uid than Cedar evaluates."""
    if isinstance(value, dict) and value.keys() == {"__entity"}:
        value = value["__entity"]
    if not (isinstance(value, dict) and value.keys() == {"type", "id"}):
        raise ValueError('an entity reference must be {"type": ..., "id": ...} '
                         'or {"__entity": {"type": ..., "id": ...}}')
    kind, name = value["type"], value["id"]
    if not (isinstance(kind, str) and isinstance(name, str)):
        raise ValueError("an entity reference needs a string `type` and a string `id`")
    if not ENTITY_TYPE_NAME.fullmatch(kind):
        raise ValueError(f"{json.dumps(kind[:MAX_SHOWN])} is not an entity type name")
    return kind, name


def normalize_entity(entity: Any) -> dict[str, Any]:
    """One entity of Cedar's JSON format, parsed as Cedar parses it and written back with
    its uid and parents in the `{"type", "id"}` form (duplicate parents dropped). This is
    the form that is both checked and handed to Cedar, so the two cannot disagree.
    Raises ValueError naming the entity."""
    if not isinstance(entity, dict) or "uid" not in entity or not entity.keys() <= ENTITY_KEYS:
        raise ValueError("each entity must be an object with a `uid` and optional `attrs`, `parents` and `tags`")
    try:
        uid = parse_reference(entity["uid"])
    except ValueError as exc:
        raise ValueError(f"entity uid: {exc}") from None
    attrs, parents = entity.get("attrs", {}), entity.get("parents", [])
    if not isinstance(attrs, dict) or not isinstance(entity.get("tags", {}), dict):
        raise ValueError(f"entity `{show_uid(uid)}`: `attrs` and `tags` must be objects")
    if not isinstance(parents, list):
        raise ValueError(f"entity `{show_uid(uid)}`: `parents` must be a list of entity references")
    try:
        parent_uids = list(dict.fromkeys(parse_reference(p) for p in parents))
    except ValueError as exc:
        raise ValueError(f"entity `{show_uid(uid)}`: parent: {exc}") from None
    if _has_expr_escape([attrs, entity.get("tags", {})]):
        # Cedar's deprecated `{"__expr": "T::\"i\""}` spelling of a reference: refused, so
        # that every reference a check reads is one of the two forms above.
        raise ValueError(f"entity `{show_uid(uid)}`: `__expr` escapes are not accepted")
    normal = {"uid": {"type": uid[0], "id": uid[1]}, "attrs": attrs,
              "parents": [{"type": kind, "id": name} for kind, name in parent_uids]}
    if "tags" in entity:
        normal["tags"] = entity["tags"]
    return normal


def uid_of(entity: dict[str, Any]) -> UID:
    """The uid of an entity that normalize_entity wrote."""
    return entity["uid"]["type"], entity["uid"]["id"]


def parents_of(entity: dict[str, Any]) -> list[UID]:
    """The parents of an entity that normalize_entity wrote."""
    return [(parent["type"], parent["id"]) for parent in entity["parents"]]


def _has_expr_escape(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if "__expr" in item:
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


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
    """Raises ValueError for entities Cedar would not read as written, an entity defined
    twice, or one that belongs to more than one tenant."""

    def __init__(self, entities: Any):
        if not isinstance(entities, list):
            raise ValueError("entities.json must be a JSON array of entities")
        self._json: dict[UID, dict[str, Any]] = {}
        for entity in entities:
            normal = normalize_entity(entity)
            uid = uid_of(normal)
            if uid in self._json:
                raise ValueError(f"entity `{show_uid(uid)}` is defined twice")
            self._json[uid] = normal
        self._next = {uid: tuple({r for r in entity_references(e) if r in self._json and r != uid})
                      for uid, e in self._json.items()}
        self._parents = {uid: parents_of(e) for uid, e in self._json.items()}
        self._tenant: dict[UID, str | None] = self._tenants()
        self._reach_cache: dict[tuple[str, frozenset[UID], frozenset[UID]], frozenset[UID]] = {}

    def __len__(self) -> int:
        return len(self._json)

    def __contains__(self, uid: UID) -> bool:
        return uid in self._json

    @property
    def uids(self) -> frozenset[UID]:
        return frozenset(self._json)

    def parents(self, uid: UID) -> list[UID]:
        """The parents a static entity names (none for a uid no static entity has)."""
        return list(self._parents.get(uid, ()))

    def tenant_of(self, uid: UID) -> str | None:
        """The tenant a static entity belongs to; None for a shared one (or no static entity)."""
        return self._tenant.get(uid)

    def visible(self, uid: UID, tenant: str) -> bool:
        """A static entity that a request of `tenant` sees: a shared one or one of its own."""
        return uid in self._json and self._tenant[uid] in (None, tenant)

    def _tenants(self) -> dict[UID, str | None]:
        memo: dict[UID, frozenset[str]] = {}
        owners: dict[UID, str | None] = {}
        conflicts = []
        for uid in self._json:
            tenants = self._tenants_above(uid, memo)
            if len(tenants) > 1:
                conflicts.append(f"entity `{show_uid(uid)}` belongs to tenants {', '.join(sorted(tenants))} "
                                 f"through its parents")
            owners[uid] = min(tenants) if tenants else None
        if conflicts:
            more = f" (and {len(conflicts) - 5} more)" if len(conflicts) > 5 else ""
            raise ValueError("; ".join(conflicts[:5]) + more + "; an entity may belong to one tenant at most")
        return owners

    def _tenants_above(self, uid: UID, memo: dict[UID, frozenset[str]]) -> frozenset[str]:
        """The tenants among `uid` and its ancestors (parents need not be static)."""
        found: set[str] = set()
        seen, stack = {uid}, [uid]
        while stack:
            current = stack.pop()
            if current != uid and current in memo:
                found |= memo[current]
                continue
            if current[0] == TENANT:
                found.add(current[1])
            for parent in self._parents.get(current, ()):
                if parent not in seen:
                    seen.add(parent)
                    stack.append(parent)
        memo[uid] = frozenset(found)
        return memo[uid]

    def closure(self, seeds: Iterable[UID], tenant: str | None = None) -> frozenset[UID]:
        """The static entities reachable from `seeds` (those of them that are static
        included); with a `tenant`, only through the entities visible to it."""
        def allowed(uid: UID) -> bool:
            return tenant is None or self._tenant[uid] in (None, tenant)

        seen: set[UID] = set()
        stack = [s for s in seeds if s in self._json and allowed(s)]
        while stack:
            uid = stack.pop()
            if uid not in seen:
                seen.add(uid)
                stack.extend(n for n in self._next[uid] if allowed(n))
        return frozenset(seen)

    def reach(self, base: frozenset[UID], seeds: Iterable[UID], tenant: str) -> frozenset[UID]:
        """What a request of `tenant` reaches: the closure of `base` (a slice's
        policy_reach, closed over every tenant) and of `seeds`, through the entities
        visible to the tenant. Cached by tenant and static seeds: most requests bring
        none, or the same few; the tenant in the key keeps one tenant's set from ever
        serving another."""
        found = frozenset(s for s in seeds if self.visible(s, tenant))
        key = (tenant, base, found)
        cached = self._reach_cache.get(key)
        if cached is None:
            if len(self._reach_cache) >= MAX_CACHED_REACHES:
                self._reach_cache.clear()  # bounded; a sweep of new principals just refills it
            cached = self._reach_cache[key] = self.closure(base | found, tenant)
        return cached

    def entities_json(self, uids: Iterable[UID]) -> str:
        """Cedar's JSON of these static entities, in a fixed order."""
        return json.dumps([self._json[uid] for uid in sorted(uids)])

    def in_tenant(self, uid: UID, tenant: str) -> dict[str, Any]:
        """A shared static entity as the principal or resource of a request of `tenant`:
        with `Tenant::"<tenant>"` added to its parents."""
        entity = self._json[uid]
        return {**entity, "parents": [*entity["parents"], {"type": TENANT, "id": tenant}]}
