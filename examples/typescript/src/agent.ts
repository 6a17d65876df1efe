/**
 * A support agent on the Vercel AI SDK whose refund tool runs only as the toolauthz
 * sidecar allows. The model is scripted (MockLanguageModelV3, offline): in three turns
 * it asks for a small refund (allowed), a refund of someone else's order (denied) and a
 * large refund (a person from finance must approve it first; then it runs, once).
 *
 *     npm start -- HOST:PORT        (the sidecar's gRPC address; default 127.0.0.1:50051)
 *
 * The large refund waits for a person: approve it in the console, or with
 * `toolauthz approvals approve ID --as 'User::"bob"' --tenant acme`. With
 * TOOLAUTHZ_EXAMPLE_APPROVER=bob the script approves it itself as that person, through
 * the Approvals service (what the console does), so that it runs unattended.
 */
import { randomUUID } from "node:crypto";

import { AuthzClient, Principal, TrustedContext } from "@toolauthz/client";
import { guardAiTools } from "@toolauthz/client/vercel-ai";
import { generateText, jsonSchema, type ModelMessage, tool, wrapLanguageModel } from "ai";
import { MockLanguageModelV3 } from "ai/test";

const target = process.argv[2] ?? "127.0.0.1:50051";
const approver = process.env.TOOLAUTHZ_EXAMPLE_APPROVER;
const run = randomUUID().slice(0, 8); // fresh call ids on every run: a call id is decided once

// The runtime's own session: who the agent acts for. Never from the model.
const ORDERS: Record<string, { owner: string; refundable_cents: number }> = {
  ord_1: { owner: "alice", refundable_cents: 10_000 },
  ord_2: { owner: "carol", refundable_cents: 10_000 },
};
const context = new TrustedContext("acme", new Principal("User", "alice"), `run-${run}`, (call) => {
  const orderId = (call.arguments as { order_id?: string } | undefined)?.order_id ?? "";
  const order = Object.hasOwn(ORDERS, orderId) ? ORDERS[orderId] : undefined; // the argument selects; it never describes
  return order === undefined ? [] : [{ uid: { type: "Order", id: orderId }, parents: [],
    attrs: { owner: { __entity: { type: "User", id: order.owner } }, refundable_cents: order.refundable_cents } }];
});

const refunds: string[] = []; // what the tool actually did
const issueRefund = tool({
  description: "Refund part or all of an order to the customer who placed it.",
  inputSchema: jsonSchema<{ order_id: string; amount_cents: number }>({ type: "object",
    properties: { order_id: { type: "string" }, amount_cents: { type: "integer" } }, required: ["order_id", "amount_cents"] }),
  execute: async ({ order_id, amount_cents }, { toolCallId }) => {
    refunds.push(`${order_id}: ${amount_cents}`);
    return { refund_id: `rf_${toolCallId}` };
  },
});

// The scripted model: each turn proposes one call, then reads its result.
const turns = [
  { id: `call_${run}_small`, input: '{"order_id": "ord_1", "amount_cents": 1500}' },
  { id: `call_${run}_other`, input: '{"order_id": "ord_2", "amount_cents": 1500}' },
  { id: `call_${run}_large`, input: '{"order_id": "ord_1", "amount_cents": 6000}' },
];
let turn = 0;
const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 }, outputTokens: { total: 1, text: 1, reasoning: 0 } };
const scripted = new MockLanguageModelV3({
  doGenerate: async ({ prompt }) => {
    const last = prompt.at(-1);
    if (last?.role === "tool") {
      const part = last.content.find((p) => p.type === "tool-result");
      const output = part?.type === "tool-result" ? part.output : undefined;
      const said = output && "value" in output ? JSON.stringify(output.value) : "nothing";
      return { content: [{ type: "text", text: `The tool said ${said}` }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] };
    }
    const call = turns[turn++]!;
    return { content: [{ type: "tool-call", toolCallId: call.id, toolName: "issue_refund", input: call.input }],
      finishReason: { unified: "tool-calls", raw: "tool_use" }, usage, warnings: [] };
  },
});

const client = new AuthzClient(target);
// approvalWaitMs: a resumed call waits up to 10 minutes for the person's decision.
const guarded = guardAiTools(client, context, { issue_refund: issueRefund }, { approvalWaitMs: 600_000 });
const model = wrapLanguageModel({ model: scripted, middleware: guarded.middleware });
const tools = guarded.tools;

try {
  for (const ask of ["Refund 15.00 on ord_1", "Refund 15.00 on ord_2", "Refund 60.00 on ord_1"]) {
    const messages: ModelMessage[] = [{ role: "user", content: ask }];
    let result = await generateText({ model, tools, messages, stopWhen: () => false });
    const request = result.content.find((p) => p.type === "tool-approval-request");
    if (request !== undefined) {
      const approvalId = guarded.approvalIdOf(request.toolCall.toolCallId)!;
      console.log(`${ask}: waiting for approval ${approvalId} (the console, or: toolauthz approvals approve ${approvalId} --as 'User::"bob"' --tenant acme)`);
      if (approver !== undefined) {
        await client.decideApproval(approvalId, new TrustedContext("acme", new Principal("User", approver), "approvals"), "approve",
          { reason: "checked the parcel" });
      }
      // Resume: the app says yes, and the tool runs only once the sidecar says a person approved.
      messages.push(...result.response.messages,
        { role: "tool", content: [{ type: "tool-approval-response", approvalId: request.approvalId, approved: true }] });
      result = await generateText({ model, tools, messages, stopWhen: () => false });
    }
    const outcome = guarded.guard.result(turns[turn - 1]!.id);
    console.log(`${ask}: ${outcome?.status}${outcome?.code ? ` (${outcome.code})` : ""} -> ${result.text}`);
  }
  console.log(`refunds made: ${refunds.join(", ")}`);
  if (refunds.length !== 2 || !refunds.includes("ord_1: 1500") || !refunds.includes("ord_1: 6000")) {
    throw new Error("expected exactly the small and the approved large refund");
  }
} finally {
  client.close();
}
