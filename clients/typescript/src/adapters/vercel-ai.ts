/**
 * The Vercel AI SDK (`ai` 6): tool definitions wrapped so that `execute` runs only
 * through the Guard, and the sidecar's APPROVAL_REQUIRED mapped to the SDK's
 * `needsApproval` / `tool-approval-request` flow.
 *
 *     const guarded = guardAiTools(client, context, { issue_refund: tool({ ... }) });
 *     const model = wrapLanguageModel({ model: provider("..."), middleware: guarded.middleware });
 *     await generateText({ model, tools: guarded.tools, prompt });
 *
 * - `execute` becomes Authorize → Verify → your execute → ReportOutcome (the Guard's
 *   rules); anything but `completed` is thrown as a `GuardedCallError` whose message
 *   is the Guard's model-safe text, which the SDK gives the model as the tool's error.
 * - `needsApproval` asks the sidecar: APPROVAL_REQUIRED stops the run with a
 *   `tool-approval-request` (`approvalIdOf(toolCallId)` names the sidecar's approval for
 *   the console). Your own `needsApproval` still applies on top.
 * - A resumed call (a `tool-approval-response` with `approved: true`) runs only when the
 *   sidecar says an approver granted it: the Guard's Authorize replays the decision and
 *   gets a token only once a person approved in toolauthz. The app's own "approved" is
 *   never enough; without the person's approval the call stays `approval_pending`.
 * - `middleware` records each call's raw argument text by call id (the exact bytes the
 *   model sent, never a re-serialization), assembling streamed `tool-input-delta`
 *   fragments with the bounds of `CallAssembly`. Without it, the Guard authorizes
 *   `JSON.stringify(input)` of the SDK's parsed input.
 *
 * Only types are imported from `ai`: this module adds no runtime dependency.
 */
import type { LanguageModelMiddleware, Tool as AiTool, ToolExecutionOptions, ToolSet as AiToolSet } from "ai";

import { type Answer, CallAssembly, type RefusedCall } from "../assembly.js";
import { rawJson } from "../context.js";
import { ProposedCall, type TrustedContext } from "../context.js";
import { Decision } from "../gen/toolauthz/v1/authorizer_pb.js";
import { Guard, type GuardClient, type GuardOptions } from "../guard.js";
import type { CallResult } from "../results.js";
import { ToolSet } from "../tools.js";
import { Bounded } from "./bounded.js";

/** A guarded call that did not complete: `message` is model-safe; `result` is the whole answer. */
export class GuardedCallError extends Error {
  constructor(readonly result: CallResult) {
    super(result.content);
    this.name = "GuardedCallError";
  }
}

export interface GuardedAiTools<T extends AiToolSet> {
  tools: T;
  guard: Guard;
  middleware: LanguageModelMiddleware;
  /** The sidecar's approval id for a call that waits for a person, for the console. */
  approvalIdOf(toolCallId: string): string | undefined;
}

export interface GuardAiToolsOptions extends GuardOptions {
  /** Each tool's `limits.max_input_bytes` (default 64 KiB), for streamed arguments. */
  maxInputBytes?: Record<string, number>;
}

export function guardAiTools<T extends AiToolSet>(client: GuardClient, context: TrustedContext, tools: T,
                                                  options: GuardAiToolsOptions = {}): GuardedAiTools<T> {
  const raw = new Bounded<string, Uint8Array>();
  const refused = new Bounded<string, RefusedCall>();
  const executions = new Map<string, ToolExecutionOptions>();
  const approvals = new Bounded<string, string>();
  const implementations = new ToolSet();
  const wrapped: Record<string, AiTool> = {};
  const guard = new Guard(client, context, implementations, options);
  const rawOf = (toolCallId: string, input: unknown) => raw.get(toolCallId) ?? JSON.stringify(input ?? {});

  for (const [name, original] of Object.entries(tools)) {
    const execute = original.execute;
    if (execute === undefined) {
      wrapped[name] = original;
      continue;
    }
    implementations.register(name, async (args, call) => {
      const given = executions.get(call.callId);
      const result = execute(args, { toolCallId: call.callId, messages: given?.messages ?? [],
        experimental_context: given?.experimental_context, abortSignal: call.signal });
      return isAsyncIterable(result) ? lastOf(result) : result;
    });
    wrapped[name] = {
      ...original,
      needsApproval: async (input: unknown, approval: { toolCallId: string; messages: unknown[] }) => {
        const own = original.needsApproval;
        if (own === true) return true;
        if (typeof own === "function" && await own(input, approval as never)) return true;
        // Once the sidecar asked for a person, the call keeps needing one: the SDK asks again
        // on resume, and the sidecar's replay (ALLOW once approved) must not turn the
        // approval into "not needed" (which the SDK treats as denied).
        if (approvals.has(approval.toolCallId)) return true;
        if (refused.get(approval.toolCallId) !== undefined) return false; // execute answers it, authorizing nothing
        try {
          const call = new ProposedCall(approval.toolCallId, name, rawOf(approval.toolCallId, input));
          const context = await guard.callContext(call);
          if (context === undefined) return false; // execute fails it closed (context_error)
          const answer = await client.authorize(context, call, { timeoutMs: options.rpcTimeoutMs });
          if (answer.decision !== Decision.APPROVAL_REQUIRED) return false;
          approvals.set(approval.toolCallId, answer.approvalId);
          return true;
        } catch {
          return false; // the Guard's own Authorize in execute fails the call closed
        }
      },
      execute: async (input: unknown, execution: ToolExecutionOptions) => {
        const id = execution.toolCallId;
        const refusal = refused.take(id);
        const result = refusal !== undefined ? guard.refuse(id, name, refusal.refused, refusal.content)
          : await run(id, name, input, execution);
        if (result.status === "completed") return result.output;
        if (result.approvalId) approvals.set(id, result.approvalId);
        throw new GuardedCallError(result);
      },
    } as AiTool;
  }

  async function run(id: string, name: string, input: unknown, execution: ToolExecutionOptions): Promise<CallResult> {
    executions.set(id, execution);
    try {
      return await guard.run(id, name, raw.take(id) ?? JSON.stringify(input ?? {}),
        { signal: execution.abortSignal });
    } finally {
      executions.delete(id);
    }
  }

  const middleware: LanguageModelMiddleware = {
    specificationVersion: "v3",
    wrapGenerate: async ({ doGenerate }) => {
      const result = await doGenerate();
      for (const part of result.content) {
        // rawJson, not TextEncoder: a lone surrogate stays the bytes it is (the sidecar
        // refuses them) instead of being repaired into U+FFFD and authorized
        if (part.type === "tool-call" && !part.providerExecuted) raw.set(part.toolCallId, rawJson(part.input));
      }
      return result;
    },
    wrapStream: async ({ doStream }) => {
      const result = await doStream();
      const assembly = new CallAssembly(options.maxInputBytes ?? {});
      const keep = (answers: Answer[]) => {
        for (const answer of answers) {
          if ("refused" in answer) refused.set(answer.callId, answer as RefusedCall);
          else raw.set(answer.callId, answer.inputJson);
        }
      };
      const stream = result.stream.pipeThrough(new TransformStream({
        transform(part, controller) {
          if (part.type === "tool-input-start" && !part.providerExecuted) keep(assembly.open(part.id, part.id, part.toolName));
          else if (part.type === "tool-input-delta" && assembly.isOpen(part.id)) keep(assembly.append(part.id, part.delta));
          else if (part.type === "tool-call" && !part.providerExecuted) {
            if (!assembly.isOpen(part.toolCallId)) keep(assembly.open(part.toolCallId, part.toolCallId, part.toolName));
            keep(assembly.end(part.toolCallId, part.input));
          } else if (part.type === "finish") keep(assembly.close());
          controller.enqueue(part);
        },
        flush() {
          keep(assembly.close());
        },
      }));
      return { ...result, stream };
    },
  };

  return { tools: wrapped as T, guard, middleware, approvalIdOf: (id) => approvals.get(id) };
}

function isAsyncIterable(value: unknown): value is AsyncIterable<unknown> {
  return typeof value === "object" && value !== null && Symbol.asyncIterator in value;
}

/** A streaming execute's final value (the SDK's own rule for preliminary results). */
async function lastOf(values: AsyncIterable<unknown>): Promise<unknown> {
  let last: unknown;
  for await (const value of values) last = value;
  return last;
}
