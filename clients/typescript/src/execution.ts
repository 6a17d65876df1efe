/**
 * Running one tool implementation under a deadline and the caller's AbortSignal, and
 * what its run means for the call. JavaScript cannot stop a function: when the deadline
 * passes or the signal aborts after the start, the Guard stops waiting, aborts the
 * tool's own signal and discards a late result (`outcome_unknown`).
 */
import { debuglog } from "node:util";

import type { TrustedContext } from "./context.js";
import type { ProposedCall } from "./context.js";
import { type Attempt, cancelled, completed, type End, fail, unknown } from "./ends.js";
import { OutputProblem, type Tool, ToolError, type ToolInvocation } from "./tools.js";

const log = debuglog("toolauthz");

export type Ran = { output: unknown } | { error: unknown } | { cut: "timeout" | "cancelled_after_start" }
  | { notStarted: true };

export async function execute(tool: Tool, call: ProposedCall, att: Attempt, context: TrustedContext, ms: number,
                              signal: AbortSignal | undefined): Promise<Ran> {
  if (signal?.aborted) return { notStarted: true };
  const controller = new AbortController();
  const invocation: ToolInvocation = Object.freeze({ callId: call.callId, name: call.name, context,
    signal: controller.signal, deadline: Date.now() + ms, decisionId: att.decisionId, approvalId: att.approvalId });
  let timer: NodeJS.Timeout | undefined;
  let onAbort: (() => void) | undefined;
  const cut = new Promise<Ran>((resolve) => {
    timer = setTimeout(() => resolve({ cut: "timeout" }), ms);
    onAbort = () => resolve({ cut: "cancelled_after_start" });
    signal?.addEventListener("abort", onAbort, { once: true });
  });
  att.started = true;
  let running: Promise<Ran>;
  try {
    running = Promise.resolve(tool.fn(call.arguments!, invocation)).then((output) => ({ output }),
      (error: unknown) => ({ error }));
  } catch (error) {
    running = Promise.resolve({ error });
  }
  try {
    const ran = await Promise.race([running, cut]);
    if ("cut" in ran) controller.abort(); // ask the tool to stop; its late result is discarded
    return ran;
  } finally {
    clearTimeout(timer);
    if (onAbort) signal?.removeEventListener("abort", onAbort);
  }
}

/** The call's End after its run: the output checked, a ToolError's code, or cut short. */
export function endOfRun(call: ProposedCall, att: Attempt, tool: Tool, ran: Ran): End {
  if ("notStarted" in ran) return cancelled(call, att, true);
  if ("cut" in ran) return unknown(call, att, ran.cut);
  if ("error" in ran) {
    if (ran.error instanceof ToolError) return fail(call, att, ran.error.code, { content: ran.error.message });
    log("tool %s failed in call %s: %s", call.name, call.callId, ran.error);
    const kind = ran.error instanceof Error ? ran.error.name : typeof ran.error;
    return fail(call, att, "execution_error", { detail: { exception: kind } });
  }
  let content: string;
  let digest: string;
  try {
    [content, digest] = tool.checkOutput(ran.output);
  } catch (problem) {
    const why = problem instanceof OutputProblem ? problem.message : "the output could not be checked";
    log("tool %s returned invalid output for call %s: %s", call.name, call.callId, why);
    return fail(call, att, "invalid_output", { detail: { why } });
  }
  return completed(call, att, content, ran.output, digest);
}
