/**
 * The Vercel AI SDK adapter with a scripted model (`MockLanguageModelV3` from `ai/test`)
 * against a live sidecar: allowed, denied, a streamed call, and approvals, where a
 * resumed call runs only once a person approved it in toolauthz.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { generateText, jsonSchema, type ModelMessage, streamText, tool, wrapLanguageModel } from "ai";
import { MockLanguageModelV3 } from "ai/test";

import { guardAiTools } from "../src/adapters/vercel-ai.js";
import { AuthzClient } from "../src/client.js";
import { Principal, TrustedContext } from "../src/context.js";
import { type Sidecar, startSidecar } from "./sidecar.js";

const BOB = new TrustedContext("acme", new Principal("User", "bob"), "approval-ui");
const USAGE = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 } };

let sidecar: Sidecar;
let client: AuthzClient;
before(async () => {
  sidecar = await startSidecar();
  client = new AuthzClient(sidecar.target);
});
after(async () => {
  client?.close();
  await sidecar?.stop();
});

function alice(requestId: string): TrustedContext {
  return new TrustedContext("acme", new Principal("User", "alice"), requestId, (call) =>
    ((call.arguments as { order_id?: string } | undefined)?.order_id === "ord_1"
      ? [{ uid: { type: "Order", id: "ord_1" }, parents: [],
        attrs: { owner: { __entity: { type: "User", id: "alice" } }, refundable_cents: 10_000 } }]
      : []));
}

/** A model that proposes one tool call with `input` (the raw text), then answers "done". */
function scriptedModel(toolCallId: string, input: string) {
  return new MockLanguageModelV3({
    doGenerate: async (options) => {
      const answered = options.prompt.some((m) => m.role === "tool"
        && m.content.some((p) => p.type === "tool-result"));
      if (answered) return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: "stop" }, usage: USAGE, warnings: [] };
      return { content: [{ type: "tool-call", toolCallId, toolName: "issue_refund", input }],
        finishReason: { unified: "tool-calls", raw: "tool_use" }, usage: USAGE, warnings: [] };
    },
  });
}

function refundTool(runs: string[]) {
  return tool({
    description: "Refund an order",
    inputSchema: jsonSchema<{ order_id: string; amount_cents: number }>({ type: "object",
      properties: { order_id: { type: "string" }, amount_cents: { type: "number" } }, required: ["order_id", "amount_cents"] }),
    execute: async (args, { toolCallId }) => {
      runs.push(`${toolCallId}:${args.amount_cents}`);
      return { refund_id: `rf_${toolCallId}` };
    },
  });
}

function toolParts(content: readonly { type: string }[]) {
  return content.filter((p) => p.type.startsWith("tool-")).map((p) => p.type);
}

describe("Vercel AI SDK", () => {
  test("an allowed call runs once through the Guard, with the exact text the model sent", async () => {
    const runs: string[] = [];
    const guarded = guardAiTools(client, alice("ai-allow"), { issue_refund: refundTool(runs) });
    const model = wrapLanguageModel({ model: scriptedModel("ai_allow_1", '{"order_id":"ord_1","amount_cents":1500.0}'),
      middleware: guarded.middleware });
    const result = await generateText({ model, tools: guarded.tools, prompt: "refund", stopWhen: () => false });
    assert.deepEqual(runs, ["ai_allow_1:1500"]);
    assert.equal(result.text, "done");
    assert.equal(guarded.guard.result("ai_allow_1")?.status, "completed");
    assert.equal(guarded.guard.result("ai_allow_1")?.reported, "recorded");
  });

  test("a denied call never runs; the model reads the refusal as the tool's error", async () => {
    const runs: string[] = [];
    const guarded = guardAiTools(client, alice("ai-deny"), { issue_refund: refundTool(runs) });
    const model = wrapLanguageModel({ model: scriptedModel("ai_deny_1", '{"order_id":"ord_2","amount_cents":1500}'),
      middleware: guarded.middleware });
    const result = await generateText({ model, tools: guarded.tools, prompt: "refund", stopWhen: () => false });
    assert.deepEqual(runs, []);
    const error = result.steps[0]!.content.find((p) => p.type === "tool-error");
    assert.ok(error, JSON.stringify(toolParts(result.steps[0]!.content)));
    assert.match(String((error as { error: Error }).error.message), /^Not allowed, the call was not executed/);
    assert.equal(guarded.guard.result("ai_deny_1")?.code, "denied");
  });

  test("arguments that differ from what the SDK parsed are refused: duplicate keys never run", async () => {
    const runs: string[] = [];
    const guarded = guardAiTools(client, alice("ai-dup"), { issue_refund: refundTool(runs) });
    const model = wrapLanguageModel({ model: scriptedModel("ai_dup_1", '{"order_id":"ord_1","amount_cents":1,"amount_cents":99999}'),
      middleware: guarded.middleware });
    await generateText({ model, tools: guarded.tools, prompt: "refund", stopWhen: () => false });
    assert.deepEqual(runs, []);
    assert.equal(guarded.guard.result("ai_dup_1")?.code, "invalid_input");
  });

  test("a lone surrogate in the call's text is never repaired into U+FFFD: the sidecar refuses the bytes", async () => {
    const runs: string[] = [];
    const guarded = guardAiTools(client, alice("ai-lone"), { issue_refund: refundTool(runs) });
    const model = wrapLanguageModel({ model: scriptedModel("ai_lone_1", '{"order_id":"ord_1","amount_cents":1,"reason":"\ud83d"}'),
      middleware: guarded.middleware });
    await generateText({ model, tools: guarded.tools, prompt: "refund", stopWhen: () => false });
    assert.deepEqual(runs, []);
    assert.equal(guarded.guard.result("ai_lone_1")?.code, "invalid_input");
  });

  test("streamed: a surrogate pair split between fragments joins and runs; a half left alone is refused invalid_unicode", async () => {
    const runs: string[] = [];
    const guarded = guardAiTools(client, alice("ai-halves"), { issue_refund: refundTool(runs) });
    let calls = 0;
    const model = new MockLanguageModelV3({
      doStream: async () => {
        calls++;
        const parts: unknown[] = calls === 1 ? [
          { type: "tool-input-start", id: "ai_lone_2", toolName: "issue_refund" },
          { type: "tool-input-delta", id: "ai_lone_2", delta: '{"order_id":"ord_1","amount_cents":2,"reason":"\ud83d' },
          { type: "tool-input-delta", id: "ai_lone_2", delta: 'x"}' },
          { type: "tool-input-end", id: "ai_lone_2" },
          { type: "tool-call", toolCallId: "ai_lone_2", toolName: "issue_refund", input: '{"order_id":"ord_1","amount_cents":2,"reason":"\ud83dx"}' },
          { type: "tool-input-start", id: "ai_pair_1", toolName: "issue_refund" },
          { type: "tool-input-delta", id: "ai_pair_1", delta: '{"order_id":"ord_1","amount_cents":3,"reason":"grin \ud83d' },
          { type: "tool-input-delta", id: "ai_pair_1", delta: '\ude00"}' },
          { type: "tool-input-end", id: "ai_pair_1" },
          { type: "tool-call", toolCallId: "ai_pair_1", toolName: "issue_refund", input: '{"order_id":"ord_1","amount_cents":3,"reason":"grin \u{1F600}"}' },
          { type: "finish", finishReason: { unified: "tool-calls", raw: "tool_use" }, usage: USAGE },
        ] : [
          { type: "text-start", id: "t" }, { type: "text-delta", id: "t", delta: "done" }, { type: "text-end", id: "t" },
          { type: "finish", finishReason: { unified: "stop", raw: "stop" }, usage: USAGE },
        ];
        return { stream: new ReadableStream({ start(c) { for (const p of parts) c.enqueue(p); c.close(); } }) } as never;
      },
    });
    const result = streamText({ model: wrapLanguageModel({ model, middleware: guarded.middleware }),
      tools: guarded.tools, prompt: "refund", stopWhen: () => false });
    assert.equal(await result.text, "done");
    assert.deepEqual(runs, ["ai_pair_1:3"]);
    assert.equal(guarded.guard.result("ai_lone_2")?.code, "invalid_unicode");
    assert.equal(guarded.guard.result("ai_pair_1")?.status, "completed");
  });

  test("a streamed call is assembled from its fragments and runs once", async () => {
    const runs: string[] = [];
    const guarded = guardAiTools(client, alice("ai-stream"), { issue_refund: refundTool(runs) });
    let calls = 0;
    const model = new MockLanguageModelV3({
      doStream: async () => {
        calls++;
        const parts: unknown[] = calls === 1 ? [
          { type: "tool-input-start", id: "ai_stream_1", toolName: "issue_refund" },
          { type: "tool-input-delta", id: "ai_stream_1", delta: '{"order_id":' },
          { type: "tool-input-delta", id: "ai_stream_1", delta: '"ord_1","amount_cents":1500}' },
          { type: "tool-input-end", id: "ai_stream_1" },
          { type: "tool-call", toolCallId: "ai_stream_1", toolName: "issue_refund", input: '{"order_id":"ord_1","amount_cents":1500}' },
          { type: "finish", finishReason: { unified: "tool-calls", raw: "tool_use" }, usage: USAGE },
        ] : [
          { type: "text-start", id: "t" }, { type: "text-delta", id: "t", delta: "done" }, { type: "text-end", id: "t" },
          { type: "finish", finishReason: { unified: "stop", raw: "stop" }, usage: USAGE },
        ];
        return { stream: new ReadableStream({ start(c) { for (const p of parts) c.enqueue(p); c.close(); } }) } as never;
      },
    });
    const result = streamText({ model: wrapLanguageModel({ model, middleware: guarded.middleware }),
      tools: guarded.tools, prompt: "refund", stopWhen: () => false });
    assert.equal(await result.text, "done");
    assert.deepEqual(runs, ["ai_stream_1:1500"]);
  });

  test("approval: the run stops with a tool-approval-request; the app's own yes never runs the call", async () => {
    const runs: string[] = [];
    const guarded = guardAiTools(client, alice("ai-approval"), { issue_refund: refundTool(runs) });
    const model = wrapLanguageModel({ model: scriptedModel("ai_approval_1", '{"order_id":"ord_1","amount_cents":6000}'),
      middleware: guarded.middleware });
    const first = await generateText({ model, tools: guarded.tools, prompt: "refund", stopWhen: () => false });
    const request = first.content.find((p) => p.type === "tool-approval-request");
    assert.ok(request, JSON.stringify(toolParts(first.content)));
    const approvalId = guarded.approvalIdOf("ai_approval_1");
    assert.match(approvalId ?? "", /\S/);
    assert.deepEqual(runs, []);
    // The app says yes, but nobody approved in toolauthz: the Guard's Authorize is still pending.
    const messages: ModelMessage[] = [{ role: "user", content: "refund" }, ...first.response.messages,
      { role: "tool", content: [{ type: "tool-approval-response", approvalId: request.approvalId, approved: true }] }];
    const second = await generateText({ model, tools: guarded.tools, messages, stopWhen: () => false });
    assert.deepEqual(runs, []);
    assert.equal(guarded.guard.result("ai_approval_1")?.status, "approval_pending");
    // The model reads the Guard's text as the call's error result.
    const answer = second.response.messages[0];
    assert.equal(answer?.role, "tool");
    const output = (answer!.content as { type: string; output?: { type: string; value: string } }[])[0]?.output;
    assert.equal(output?.type, "error-text");
    assert.match(output!.value, /needs approval by a person/);
  });

  test("approval granted by a person in toolauthz: the resumed call runs once", async () => {
    const runs: string[] = [];
    const guarded = guardAiTools(client, alice("ai-granted"), { issue_refund: refundTool(runs) });
    const model = wrapLanguageModel({ model: scriptedModel("ai_granted_1", '{"order_id":"ord_1","amount_cents":6000}'),
      middleware: guarded.middleware });
    const first = await generateText({ model, tools: guarded.tools, prompt: "refund", stopWhen: () => false });
    const request = first.content.find((p) => p.type === "tool-approval-request");
    assert.ok(request);
    await client.decideApproval(guarded.approvalIdOf("ai_granted_1")!, BOB, "approve", { reason: "checked" });
    const messages: ModelMessage[] = [{ role: "user", content: "refund" }, ...first.response.messages,
      { role: "tool", content: [{ type: "tool-approval-response", approvalId: request.approvalId, approved: true }] }];
    const second = await generateText({ model, tools: guarded.tools, messages, stopWhen: () => false });
    assert.deepEqual(runs, ["ai_granted_1:6000"]);
    assert.equal(second.text, "done");
    assert.equal(guarded.guard.result("ai_granted_1")?.status, "completed");
  });
});
