/**
 * The OpenAI Agents SDK adapter with a plain-object scripted model against a live
 * sidecar: allowed, denied (the input guardrail), and an approval that interrupts the
 * run and, resumed from its RunState, runs the tool only once a person approved it.
 */
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Agent, type Model, type ModelRequest, type ModelResponse, run, setTracingDisabled, tool, Usage } from "@openai/agents";
import { z } from "zod";

import { guardAgentTools } from "../src/adapters/openai-agents.js";
import { AuthzClient } from "../src/client.js";
import { Principal, TrustedContext } from "../src/context.js";
import { type Sidecar, startSidecar } from "./sidecar.js";

const BOB = new TrustedContext("acme", new Principal("User", "bob"), "approval-ui");
setTracingDisabled(true);

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

/** Proposes one function call with `args` (the raw text), then answers with the tool's output. */
function scriptedModel(callId: string, args: string): Model {
  return {
    async getResponse(request: ModelRequest): Promise<ModelResponse> {
      const items = Array.isArray(request.input) ? request.input : [];
      const answered = items.find((item) => item.type === "function_call_result");
      if (answered) {
        const output = JSON.stringify((answered as { output: unknown }).output);
        return { usage: new Usage(), output: [{ type: "message", role: "assistant", status: "completed",
          content: [{ type: "output_text", text: `tool said: ${output}` }] }] };
      }
      return { usage: new Usage(), output: [{ type: "function_call", callId, name: "issue_refund", arguments: args,
        status: "completed" }] };
    },
    async *getStreamedResponse() {
      throw new Error("this scripted model does not stream");
    },
  };
}

function refundTool(runs: string[]) {
  return tool({
    name: "issue_refund",
    description: "Refund an order",
    parameters: z.object({ order_id: z.string(), amount_cents: z.number() }),
    execute: async (args) => {
      runs.push(`${args.order_id}:${args.amount_cents}`);
      return `refunded ${args.amount_cents}`;
    },
  });
}

describe("OpenAI Agents SDK", () => {
  test("an allowed call runs once through the Guard", async () => {
    const runs: string[] = [];
    const guarded = guardAgentTools(client, alice("ag-allow"), [refundTool(runs)]);
    const agent = new Agent({ name: "support", instructions: "help", tools: guarded.tools,
      model: scriptedModel("ag_allow_1", '{"order_id":"ord_1","amount_cents":1500}') });
    const result = await run(agent, "refund ord_1");
    assert.deepEqual(runs, ["ord_1:1500"]);
    assert.match(String(result.finalOutput), /refunded 1500/);
    assert.equal(guarded.guard.result("ag_allow_1")?.reported, "recorded");
  });

  test("a denied call is rejected by the input guardrail, never runs, and its outcome is reported", async () => {
    const runs: string[] = [];
    const guarded = guardAgentTools(client, alice("ag-deny"), [refundTool(runs)]);
    const agent = new Agent({ name: "support", instructions: "help", tools: guarded.tools,
      model: scriptedModel("ag_deny_1", '{"order_id":"ord_2","amount_cents":1500}') });
    const result = await run(agent, "refund ord_2");
    assert.deepEqual(runs, []);
    assert.match(String(result.finalOutput), /Not allowed, the call was not executed/);
    const denied = guarded.guard.result("ag_deny_1");
    assert.deepEqual([denied?.code, denied?.reported], ["denied", "recorded"]);
  });

  test("approval: an interruption; approve() alone never runs it; a person's approval does, once", async () => {
    const runs: string[] = [];
    const guarded = guardAgentTools(client, alice("ag-approval"), [refundTool(runs)]);
    const agent = new Agent({ name: "support", instructions: "help", tools: guarded.tools,
      model: scriptedModel("ag_approval_1", '{"order_id":"ord_1","amount_cents":6000}') });
    const first = await run(agent, "refund ord_1");
    assert.equal(first.interruptions.length, 1);
    const approvalId = guarded.approvalIdOf("ag_approval_1");
    assert.match(approvalId ?? "", /\S/);
    assert.deepEqual(runs, []);

    // The RunState survives a round trip through a string (a durable approval), as the SDK intends.
    const { RunState } = await import("@openai/agents");
    const saved = first.state.toString();
    const state = await RunState.fromString(agent, saved);
    state.approve(state.getInterruptions()[0]!);
    const early = await run(agent, state);
    assert.deepEqual(runs, []); // nobody approved in toolauthz yet
    assert.match(String(early.finalOutput), /needs approval by a person/);
    assert.equal(guarded.guard.result("ag_approval_1")?.status, "approval_pending");

    // Same call id, approved by a person this time: the Guard resumes the pending call.
    const again = await RunState.fromString(agent, saved);
    again.approve(again.getInterruptions()[0]!);
    await client.decideApproval(approvalId!, BOB, "approve", { reason: "checked" });
    const done = await run(agent, again);
    assert.deepEqual(runs, ["ord_1:6000"]);
    assert.match(String(done.finalOutput), /refunded 6000/);
    assert.equal(guarded.guard.result("ag_approval_1")?.status, "completed");
  });
});
