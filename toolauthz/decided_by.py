"""Which entities a decision was made on, as its audit record keeps them.

A later reader must be able to tell why a call was decided as it was: the record names
the principal and the resource with their ancestors, and every entity the runtime
supplied. Of a supplied entity only the attributes its tool's `audit.record_entities`
lists for its type are kept (a runtime may send anything: a customer's address, a card
number); every other attribute is left out, and so is anything over the caps below,
with a count of what was left out (a uid too long to read among them).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import rfc8785

from toolauthz.bundle import Bundle
from toolauthz.bundle.catalog import resolve_pointer
from toolauthz.bundle.entity_graph import UID, parents_of
from toolauthz.engine import PreparedCall
from toolauthz.model import TrustedContext

MAX_UIDS = 64  # principal and resource with their ancestors, and the supplied entities
MAX_UID_CHARS = 512  # one uid as text: a runtime's ids have no length limit of their own
MAX_VALUE_CHARS = 256  # one attribute's value, as JSON
_TENANT = "Tenant"


def decided_by(bundle: Bundle, ctx: TrustedContext, prepared: PreparedCall,
               supplied_entities: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """`{"principal": [uid, ancestors...], "resource": [...], "supplied": [{"uid", "attrs"}],
    "omitted": {"uids": n, "attributes": n}}`, each uid as Cedar writes it: `Order::"ord_1"`.
    `supplied_entities`: the runtime's, as request_entities accepted them."""
    supplied = {(e["uid"]["type"], e["uid"]["id"]): e for e in supplied_entities}
    budget = _Budget(MAX_UIDS)
    anchors = (ctx.principal.type, ctx.principal.id), (prepared.resource_type, prepared.resource_id)
    principal, resource = (_texts(budget.take(_lineage(bundle, ctx.tenant, supplied, uid))) for uid in anchors)
    rules = prepared.slice.tool.audit_entities
    omitted_attributes = 0
    recorded = []
    for uid in budget.take(sorted(supplied)):
        attrs, left_out = _allowed_attributes(supplied[uid].get("attrs", {}), rules.get(uid[0], ()))
        omitted_attributes += left_out
        recorded.append({"uid": _text(uid), "attrs": attrs})
    return {"principal": principal, "resource": resource, "supplied": recorded,
            "omitted": {"uids": budget.omitted, "attributes": omitted_attributes}}


class _Budget:
    def __init__(self, size: int):
        self.left, self.omitted = size, 0

    def take(self, uids: Iterable[UID]) -> list[UID]:
        every = list(uids)
        kept = [uid for uid in every if len(_text(uid)) <= MAX_UID_CHARS][:self.left]
        self.left -= len(kept)
        self.omitted += len(every) - len(kept)
        return kept


def _texts(uids: Iterable[UID]) -> list[str]:
    return [_text(uid) for uid in uids]


def _text(uid: UID) -> str:
    """As every audit record writes a uid (its `resource`): the id as given, escaped
    only where a person reads it (display_uid)."""
    return f'{uid[0]}::"{uid[1]}"'


def _lineage(bundle: Bundle, tenant: str, supplied: Mapping[UID, dict[str, Any]], anchor: UID) -> list[UID]:
    """`anchor` and its ancestors, nearest first: through the supplied entities' parents
    and those of the static entities the tenant sees; an anchor is always in its tenant."""
    graph = bundle.static_graph
    order: list[UID] = []
    seen = {anchor}
    queue = [anchor]
    while queue:
        uid = queue.pop(0)
        order.append(uid)
        if uid in supplied:
            parents = parents_of(supplied[uid])
        elif graph.visible(uid, tenant):
            parents = graph.parents(uid)
        else:
            parents = []
        if uid == anchor:
            parents = [*parents, (_TENANT, tenant)]
        for parent in parents:
            if parent not in seen:
                seen.add(parent)
                queue.append(parent)
    return order


def _recordable(value: Any) -> bool:
    """Short enough, and a value the audit's canonical JSON can hold: a Cedar Long past
    2**53 cannot be (RFC 8785 numbers are doubles), and must not fail the decision."""
    try:
        return len(rfc8785.dumps(value)) <= MAX_VALUE_CHARS
    except (rfc8785.CanonicalizationError, ValueError):
        return False


def _allowed_attributes(attrs: Mapping[str, Any], pointers: Iterable[str]) -> tuple[dict[str, Any], int]:
    """The listed attributes (JSON pointers into `attrs`) found with a recordable value,
    and how many were left out: attributes no pointer reaches, and listed values too long
    or not canonical JSON."""
    kept: dict[str, Any] = {}
    too_long = 0
    reached = set()
    for pointer in pointers:
        found, value = resolve_pointer(dict(attrs), pointer)
        if not found:
            continue
        reached.add(pointer.split("/")[1].replace("~1", "/").replace("~0", "~"))
        if _recordable(value):
            kept[pointer] = value
        else:
            too_long += 1
    return kept, too_long + sum(1 for name in attrs if name not in reached)
