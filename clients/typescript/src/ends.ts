/**
 * How a guarded call ends: what a run of it got to (`Attempt`), and the results the
 * Guard builds, each with what to report for it (the rules of docs/sdk.md: which
 * outcomes go to the sidecar's ledger and which do not).
 */
import type { OutcomeName } from "./client.js";
import type { ProposedCall } from "./context.js";
import * as r from "./results.js";
import { CallResult } from "./results.js";

/** What one run of a call has got to (read when it is cut short). */
export class Attempt {
  authorizeSent = false;
  decision = "";
  decisionId = "";
  approvalId = "";
  started = false; // the implementation was entered
}

/** A result, and what to report for it: [status, error code, output digest], or undefined: nothing. */
export interface End {
  result: CallResult;
  report?: [OutcomeName, string, string];
}

type Call = Pick<ProposedCall, "callId" | "name">;

/** A proposal refused without touching the call it names: never reported. */
export function rejected(call: Call, code: string): CallResult {
  return new CallResult({ callId: call.callId, name: call.name, status: "rejected", code,
    content: r.MESSAGES[code], replayed: true });
}

export function resultOf(call: Call, att: Attempt, status: r.Status, code: string, content: string,
                         extra: Partial<r.CallResultInit> = {}): CallResult {
  return new CallResult({ callId: call.callId, name: call.name, status, code,
    content: content || (r.MESSAGES[code] ?? ""), decision: att.decision, decisionId: att.decisionId,
    approvalId: att.approvalId, ...extra });
}

export function fail(call: Call, att: Attempt, code: string,
                     options: { report?: boolean; content?: string; detail?: Record<string, unknown> } = {}): End {
  const result = resultOf(call, att, "failed", code, options.content ?? "", { executed: att.started,
    detail: options.detail });
  return { result, report: options.report === false ? undefined : ["failed", code, ""] };
}

export function cancelled(call: Call, att: Attempt, report: boolean): End {
  return { result: resultOf(call, att, "cancelled", "cancelled", ""),
    report: report ? ["cancelled", "cancelled", ""] : undefined };
}

export function unknown(call: Call, att: Attempt, code: string): End {
  return { result: resultOf(call, att, "outcome_unknown", code, "", { executed: true }),
    report: ["outcome_unknown", code, ""] };
}

/** Waiting for a person: not terminal, nothing reported. */
export function pendingApproval(call: Call, att: Attempt): End {
  return { result: resultOf(call, att, "approval_pending", "approval_pending", r.approvalPending(att.approvalId)) };
}

export function completed(call: Call, att: Attempt, content: string, output: unknown, digest: string): End {
  return { result: resultOf(call, att, "completed", "", content, { output, executed: true }),
    report: ["completed", "", digest] };
}
