/**
 * The same support agent on the OpenAI Agents SDK for JavaScript (`@openai/agents`), with
 * a plain-object scripted model (offline): a small refund (allowed), a refund of someone
 * else's order (denied by the tool input guardrail), and a large refund that interrupts
 * the run until a person from finance approves it in toolauthz; the resumed RunState then
 * runs the refund once.
 *
 *     npm run agents -- HOST:PORT      (default 127.0.0.1:50051; TOOLAUTHZ_EXAMPLE_APPROVER as in agent.ts)
 */
import { randomUUID } from "node:crypto";

import { approvals, AuthzClient, Principal, TrustedContext } from "@toolauthz/client";
import { guardAgentTools } from "@toolauthz/client/openai-agents";
import { Agent, type Model, type ModelRequest, type ModelResponse, run, setTracingDisabled, tool, Usage } from "@openai/agents";
import { z } from "zod";

setTracingDisabled(true); // offline: no trace export
const target = process.argv[2] ?? "127.0.0.1:50051";
const approver = process.env.TOOLAUTHZ_EXAMPLE_APPROVER;
const runId = randomUUID().slice(0, 8);

const ORDERS: Record<string, { owner: string; refundable_cents: number }> = {
  ord_1: { owner: "alice", refundable_cents: 10_000 },
  ord_2: { owner: "carol", refundable_cents: 10_000 },
};
const context = new TrustedContext("acme", new Principal("User", "alice"), `agents-${runId}`, (call) => {
  const orderId = (call.arguments as { order_id?: string } | undefined)?.order_id ?? "";
  const order = Object.hasOwn(ORDERS, orderId) ? ORDERS[orderId] : undefined;
  return order === undefined ? [] : [{ uid: { type: "Order", id: orderId }, parents: [],
    attrs: { owner: { __entity: { type: "User", id: order.owner } }, refundable_cents: order.refundable_cents } }];
});

const refunds: string[] = [];
const issueRefund = tool({
  name: "issue_refund",
  description: "Refund part or all of an order to the customer who placed it.",
  parameters: z.object({ order_id: z.string(), amount_cents: z.number().int() }),
  execute: async ({ order_id, amount_cents }) => {
    refunds.push(`${order_id}: ${amount_cents}`);
    return `refunded ${amount_cents} on ${order_id}`;
  },
});

/** Proposes `args` as one call, then repeats what the tool said. */
function scripted(callId: string, args: string): Model {
  return {
    async getResponse(request: ModelRequest): Promise<ModelResponse> {
      const items = Array.isArray(request.input) ? request.input : [];
      const result = items.find((item) => item.type === "function_call_result") as { output?: unknown } | undefined;
      if (result !== undefined) {
        const text = `The tool said ${JSON.stringify(result.output)}`;
        return { usage: new Usage(), output: [{ type: "message", role: "assistant", status: "completed",
          content: [{ type: "output_text", text }] }] };
      }
      return { usage: new Usage(), output: [{ type: "function_call", callId, name: "issue_refund", arguments: args, status: "completed" }] };
    },
    async *getStreamedResponse() {
      throw new Error("this scripted model does not stream");
    },
  };
}

const client = new AuthzClient(target);
const guarded = guardAgentTools(client, context, [issueRefund]);
const asks: [string, string, string][] = [
  ["Refund 15.00 on ord_1", `call_${runId}_small`, '{"order_id": "ord_1", "amount_cents": 1500}'],
  ["Refund 15.00 on ord_2", `call_${runId}_other`, '{"order_id": "ord_2", "amount_cents": 1500}'],
  ["Refund 60.00 on ord_1", `call_${runId}_large`, '{"order_id": "ord_1", "amount_cents": 6000}'],
];
try {
  for (const [ask, callId, args] of asks) {
    const agent = new Agent({ name: "support", instructions: "Help the customer.", tools: guarded.tools, model: scripted(callId, args) });
    let result = await run(agent, ask);
    if (result.interruptions.length > 0) {
      const approvalId = guarded.approvalIdOf(callId)!;
      console.log(`${ask}: waiting for approval ${approvalId} (the console, or: toolauthz approvals approve ${approvalId} --as 'User::"bob"' --tenant acme)`);
      if (approver !== undefined) {
        await client.decideApproval(approvalId, new TrustedContext("acme", new Principal("User", approver), "approvals"), "approve",
          { reason: "checked the parcel" });
      }
      // Wait for the person's decision in toolauthz (WatchApproval), then resume the saved run.
      for await (const approval of client.watchApproval(approvalId, context, { timeoutMs: 600_000 })) {
        if (approval.status === approvals.ApprovalStatus.APPROVED) break;
        if (approval.status !== approvals.ApprovalStatus.PENDING) throw new Error("the approval was not granted");
      }
      for (const interruption of result.interruptions) result.state.approve(interruption);
      result = await run(agent, result.state);
    }
    const outcome = guarded.guard.result(callId);
    console.log(`${ask}: ${outcome?.status}${outcome?.code ? ` (${outcome.code})` : ""} -> ${result.finalOutput}`);
  }
  console.log(`refunds made: ${refunds.join(", ")}`);
  if (refunds.length !== 2 || !refunds.includes("ord_1: 1500") || !refunds.includes("ord_1: 6000")) {
    throw new Error("expected exactly the small and the approved large refund");
  }
} finally {
  client.close();
}
