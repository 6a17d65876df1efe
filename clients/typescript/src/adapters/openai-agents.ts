/**
 * The OpenAI Agents SDK for JavaScript (`@openai/agents`): function tools wrapped so
 * that they run only through the Guard, the sidecar's APPROVAL_REQUIRED mapped to
 * `needsApproval` and the run's interruptions (`RunState`), and a DENY surfaced by a
 * tool input guardrail.
 *
 *     const guarded = guardAgentTools(client, context, [refundTool]);
 *     const agent = new Agent({ name: "support", tools: guarded.tools, model });
 *     let result = await run(agent, "refund order ord_1");
 *     for (const interruption of result.interruptions) result.state.approve(interruption);
 *     result = await run(agent, result.state);   // runs only once a person approved in toolauthz
 *
 * - `invoke` becomes Authorize → Verify → the tool's own invoke → ReportOutcome, with the
 *   raw argument text the model sent (the SDK hands it over as a string). Anything but
 *   `completed` answers the model with the Guard's model-safe text instead of running.
 * - `needsApproval` asks the sidecar; once it asked for a person the call keeps needing
 *   one (the SDK asks again when a saved RunState resumes). The app's `approve()` lets
 *   the SDK invoke the tool, and the Guard's Authorize then replays the sidecar's
 *   decision: the tool runs only if an approver granted it in toolauthz.
 * - The input guardrail rejects a denied call with the refusal text (the Guard reports
 *   the denial as the call's outcome, as for any DENY).
 *
 * Only types are imported from `@openai/agents`: this module adds no runtime dependency.
 */
import type { FunctionTool, RunContext, ToolInputGuardrailDefinition } from "@openai/agents";

import { ProposedCall, type TrustedContext } from "../context.js";
import { Decision } from "../gen/toolauthz/v1/authorizer_pb.js";
import { Guard, type GuardClient, type GuardOptions } from "../guard.js";
import { ToolSet } from "../tools.js";
import { Bounded } from "./bounded.js";

type AnyFunctionTool = FunctionTool<any, any, any>;
type Details = Parameters<AnyFunctionTool["invoke"]>[2];

export interface GuardedAgentTools {
  tools: AnyFunctionTool[];
  guard: Guard;
  /** The sidecar's approval id for a call that waits for a person, for the console. */
  approvalIdOf(callId: string): string | undefined;
}

export function guardAgentTools(client: GuardClient, context: TrustedContext, tools: readonly AnyFunctionTool[],
                                options: GuardOptions = {}): GuardedAgentTools {
  const implementations = new ToolSet();
  const guard = new Guard(client, context, implementations, options);
  const approvals = new Bounded<string, string>();
  const invocations = new Map<string, { runContext: RunContext<any>; details: Details }>();

  async function decision(callId: string, name: string, input: string) {
    const call = new ProposedCall(callId, name, input);
    const ctx = await guard.callContext(call);
    if (ctx === undefined) return undefined;
    return client.authorize(ctx, call, { timeoutMs: options.rpcTimeoutMs });
  }

  const guardrail: ToolInputGuardrailDefinition = {
    type: "tool_input",
    name: "toolauthz",
    run: async ({ toolCall }) => {
      const allow = { behavior: { type: "allow" as const } };
      try {
        const answer = await decision(toolCall.callId, toolCall.name, toolCall.arguments);
        if (answer?.decision !== Decision.DENY) return allow; // invoke runs the Guard, which fails anything else closed
      } catch {
        return allow;
      }
      const result = await guard.run(toolCall.callId, toolCall.name, toolCall.arguments); // replays the DENY, reports it
      return { behavior: { type: "rejectContent" as const, message: result.content }, outputInfo: { code: result.code } };
    },
  };

  const wrapped = tools.map((original): AnyFunctionTool => {
    if (original.type !== "function") return original;
    implementations.register(original.name, async (args, call) => {
      const given = invocations.get(call.callId);
      if (given === undefined) throw new Error("no invocation for this call"); // cannot happen: invoke registers it
      return original.invoke(given.runContext, JSON.stringify(args), { ...given.details, signal: call.signal });
    });
    return {
      ...original,
      needsApproval: async (runContext: RunContext, input: unknown, callId?: string) => {
        if (await original.needsApproval(runContext, input as never, callId)) return true;
        if (callId === undefined) return false; // no call id: invoke's Guard decides alone
        if (approvals.has(callId)) return true;
        try {
          const answer = await decision(callId, original.name, JSON.stringify(input ?? {}));
          if (answer?.decision !== Decision.APPROVAL_REQUIRED) return false;
          approvals.set(callId, answer.approvalId);
          return true;
        } catch {
          return false; // the Guard's own Authorize in invoke fails the call closed
        }
      },
      inputGuardrails: [guardrail, ...(original.inputGuardrails ?? [])],
      invoke: async (runContext: RunContext<any>, input: string, details?: Details) => {
        const callId = details?.toolCall?.callId;
        if (callId === undefined) return "The call has an unusable id and was not executed.";
        invocations.set(callId, { runContext, details });
        try {
          const result = await guard.run(callId, original.name, input, { signal: details?.signal });
          if (result.approvalId) approvals.set(callId, result.approvalId);
          return result.status === "completed" ? result.output : result.content;
        } finally {
          invocations.delete(callId);
        }
      },
    } as AnyFunctionTool;
  });

  return { tools: wrapped, guard, approvalIdOf: (id) => approvals.get(id) };
}
