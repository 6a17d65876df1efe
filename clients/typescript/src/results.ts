/**
 * The result of one guarded call, and the model-safe texts it carries: the same
 * statuses, codes and texts as the Python SDK (toolauthz/client/results.py), which
 * tests/conformance/sdk/ checks in both languages.
 *
 *     completed        the tool ran and returned valid output
 *     failed           it did not run (refused, not verified, ...) or it ran and failed
 *     cancelled        cancelled before the tool started: nothing ran
 *     outcome_unknown  cancelled or timed out after the tool started: it may have acted
 *     approval_pending waits for a person; running the same call id again resumes it
 *     rejected         this proposal was refused without touching the call it names
 */
import { TOOL_NAME } from "./context.js";

export type Status = "completed" | "failed" | "cancelled" | "outcome_unknown" | "approval_pending" | "rejected";
export type Reported = "recorded" | "already_recorded" | "not_in_ledger" | "not_reported" | "conflict"
  | "report_failed";
export const TERMINAL: ReadonlySet<Status> = new Set(["completed", "failed", "cancelled", "outcome_unknown"]);


export const MESSAGES: Readonly<Record<string, string>> = Object.freeze({
  cancelled: "The call was cancelled before it started; it was not executed.",
  cancelled_after_start: "The call was interrupted after it started; whether it took effect is unknown. "
    + "Do not retry it; it will be reconciled.",
  timeout: "The tool did not finish in time; whether it took effect is unknown. "
    + "Do not retry it; it will be reconciled.",
  execution_error: "The tool failed while running.",
  invalid_output: "The tool returned output that does not match its declared shape; the output was withheld.",
  authorization_unavailable: "The call could not be authorized right now and was not executed; try again later.",
  authorization_error: "The call could not be authorized and was not executed.",
  verification_unavailable: "The call's authorization could not be verified right now; it was not executed.",
  verification_failed: "The call's authorization could not be verified; it was not executed.",
  already_executed: "This call was already executed; it was not run again.",
  call_in_progress: "This call is already running; it was not started again.",
  call_id_reused: "This call id was already used for a different call; it was not executed.",
  approval_rejected: "A person reviewed this call and rejected it; it was not executed.",
  approval_expired: "The approval request for this call expired; it was not executed.",
  approval_unavailable: "The call was approved but could not be authorized to run; it was not executed.",
  context_error: "The call could not be prepared and was not executed.",
  invalid_call_id: "The call has an unusable id and was not executed.",
  internal_error: "The call could not be completed because of an internal error.",
});

export function toolUnavailable(name: string): string {
  const shown = TOOL_NAME.test(name ?? "") ? `\`${name}\` ` : "";
  return `The tool ${shown}is not available here; the call was not executed.`;
}

export function approvalPending(approvalId: string): string {
  return "This call needs approval by a person before it can run; an approval request is open "
    + `(reference ${approvalId}). It has not been executed. Tell the user it is waiting for approval.`;
}

/** A DENY: the sidecar's model-safe messages, and the ids of forbid policies. */
export function refused(messages: readonly string[], reasons: readonly string[]): string {
  const parts = messages.filter((m) => m).map((m) => m.replace(/\.+$/, ""));
  if (reasons.length) parts.push("refused by policy " + reasons.map((r) => `\`${r}\``).join(", "));
  return "Not allowed, the call was not executed: " + (parts.join("; ") || "refused by policy") + ".";
}

/** The provider tool result (Messages API shape) of a call. */
export interface ToolResultBlock {
  type: "tool_result";
  tool_use_id: string;
  content: string;
  is_error: boolean;
}

export interface CallResultInit {
  callId: string;
  name: string;
  status: Status;
  code?: string;
  content?: string;
  output?: unknown;
  executed?: boolean;
  decision?: string;
  decisionId?: string;
  approvalId?: string;
  reported?: Reported;
  replayed?: boolean;
  detail?: Readonly<Record<string, unknown>>;
}

/** One call's answer. `content` is always model-safe; `detail` is for operators only. */
export class CallResult {
  readonly callId: string;
  readonly name: string;
  readonly status: Status;
  readonly code: string;
  readonly content: string;
  readonly output: unknown;
  readonly executed: boolean;
  readonly decision: string;
  readonly decisionId: string;
  readonly approvalId: string;
  readonly reported: Reported;
  readonly replayed: boolean;
  readonly detail: Readonly<Record<string, unknown>>;

  constructor(init: CallResultInit) {
    this.callId = init.callId;
    this.name = init.name;
    this.status = init.status;
    this.code = init.code ?? "";
    this.content = init.content ?? "";
    this.output = init.output;
    this.executed = init.executed ?? false;
    this.decision = init.decision ?? "";
    this.decisionId = init.decisionId ?? "";
    this.approvalId = init.approvalId ?? "";
    this.reported = init.reported ?? "not_reported";
    this.replayed = init.replayed ?? false;
    this.detail = Object.freeze({ ...(init.detail ?? {}) });
    Object.freeze(this);
  }

  get terminal(): boolean {
    return TERMINAL.has(this.status);
  }

  /** Everything but `completed`: a pending approval too, because its content is not the tool's output. */
  get isError(): boolean {
    return this.status !== "completed";
  }

  with(changes: Partial<CallResultInit>): CallResult {
    return new CallResult({ ...this.init(), ...changes });
  }

  toToolResult(): ToolResultBlock {
    return { type: "tool_result", tool_use_id: this.callId, content: this.content, is_error: this.isError };
  }

  private init(): CallResultInit {
    return { callId: this.callId, name: this.name, status: this.status, code: this.code, content: this.content,
      output: this.output, executed: this.executed, decision: this.decision, decisionId: this.decisionId,
      approvalId: this.approvalId, reported: this.reported, replayed: this.replayed, detail: this.detail };
  }
}
