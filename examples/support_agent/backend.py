"""The support agent's back end: in-memory fakes that count what they do.

`Backend.orders_in(tenant)` is the runtime's own store, scoped to the tenant of the
signed-in session. The runtime uses it for two things, neither of which takes anything
from the model but a selector (`order_id`):

* the trusted Cedar entity of the order the call names (owner, refundable balance),
  sent to the sidecar in `entities_json`: the policy compares `resource.owner` with the
  principal, so another customer's order is denied whatever the model claims;
* the tools themselves, which act through the same scoped store, with the identity
  taken from the trusted context (`call.context`), never from `args`.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from toolauthz.client import ProposedCall, ToolError, ToolInvocation, ToolSet, load_output_schemas, load_side_effects


@dataclass
class Order:
    order_id: str
    owner: str  # a User id
    status: str
    total_cents: int
    refundable_cents: int


@dataclass
class Refund:
    refund_id: str
    order_id: str
    amount_cents: int
    idempotency_key: str  # the tool-use id


@dataclass
class Backend:
    orders: dict[str, dict[str, Order]] = field(default_factory=dict)  # tenant -> order id -> order
    refunds: list[Refund] = field(default_factory=list)
    executions: Counter = field(default_factory=Counter)  # tool name -> times its implementation ran
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def demo(cls) -> Backend:
        backend = cls()
        backend.orders["acme"] = {
            "ord_1001": Order("ord_1001", "alice", "shipped", 12_000, 10_000),
            "ord_2002": Order("ord_2002", "carol", "delivered", 5_000, 5_000),
        }
        backend.orders["globex"] = {"ord_3003": Order("ord_3003", "alice", "delivered", 900, 900)}
        return backend

    def orders_in(self, tenant: str) -> dict[str, Order]:
        return self.orders.get(tenant, {})

    # -- trusted entities ---------------------------------------------------------------

    def entities_for(self, tenant: str):
        """The entities provider of a run in `tenant` (given to TrustedContext)."""

        def provide(call: ProposedCall) -> list[dict]:
            args = call.arguments
            if call.name not in ("lookup_order", "issue_refund") or not isinstance(args, dict):
                return []
            order_id = args.get("order_id")
            order = self.orders_in(tenant).get(order_id) if isinstance(order_id, str) else None
            if order is None:
                return []  # no such order in this tenant: the policy has nothing to permit
            return [{"uid": {"type": "Order", "id": order.order_id},
                     "attrs": {"owner": {"__entity": {"type": "User", "id": order.owner}},
                               "refundable_cents": order.refundable_cents},
                     "parents": []}]

        return provide

    # -- the tools ------------------------------------------------------------------------

    def tools(self, bundle_dir) -> ToolSet:
        tools = ToolSet(output_schemas=load_output_schemas(bundle_dir), side_effects=load_side_effects(bundle_dir))

        @tools.tool("lookup_order")
        def lookup_order(args: dict, call: ToolInvocation) -> dict:
            self.executions["lookup_order"] += 1
            order = self._own_order(call, args["order_id"])
            return {"order_id": order.order_id, "status": order.status, "total_cents": order.total_cents,
                    "refundable_cents": order.refundable_cents}

        @tools.tool("issue_refund")
        def issue_refund(args: dict, call: ToolInvocation) -> dict:
            self.executions["issue_refund"] += 1
            with self._lock:
                order = self._own_order(call, args["order_id"])
                for refund in self.refunds:  # the downstream idempotency key: the tool-use id
                    if refund.idempotency_key == call.call_id:
                        return {"refund_id": refund.refund_id}
                if args["amount_cents"] > order.refundable_cents:
                    raise ToolError("exceeds_refundable", "the amount exceeds what the order can still refund")
                refund = Refund(f"rf_{len(self.refunds) + 1}", order.order_id, args["amount_cents"], call.call_id)
                self.refunds.append(refund)
                order.refundable_cents -= refund.amount_cents
            return {"refund_id": refund.refund_id}

        return tools

    def _own_order(self, call: ToolInvocation, order_id: str) -> Order:
        """The scoped client: the signed-in customer's orders in their tenant, nothing else."""
        order = self.orders_in(call.context.tenant).get(order_id)
        if order is None or order.owner != call.context.principal.id:
            raise ToolError("not_found", "no such order for this customer")
        return order
