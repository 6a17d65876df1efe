/**
 * The Guard: runs a model's proposed tool calls only as the sidecar allows, with the
 * semantics of the Python SDK's Guard (docs/sdk.md, toolauthz/client/guard_core.py):
 *
 * 1. Admit: a call id with a terminal outcome is answered from the record (`replayed`),
 *    one running now is `rejected/call_in_progress`, the same id with other arguments or
 *    another tool `rejected/call_id_reused`.
 * 2. Authorize with the trusted context (and the entities the runtime vouches for).
 *    DENY ends the call; APPROVAL_REQUIRED waits for a person up to `approvalWaitMs`
 *    (0: answer `approval_pending` at once; running the same call id again resumes).
 * 3. Verify immediately before executing: it consumes the token, so a call runs at most
 *    once across every runtime sharing the sidecar.
 * 4. Execute with the strictly parsed arguments, under a deadline and an AbortSignal.
 * 5. Check the output, then ReportOutcome: exactly one outcome per call.
 *
 * Which outcomes are reported is the Python Guard's rule: every call the sidecar decided
 * and this Guard ended, except a DENY for `call_id_reused` / `call_in_progress` (the
 * ledger row is another call's), a Verify answered `already_used` or a replayed ALLOW
 * without a token (another runtime owns the outcome), and calls the sidecar never saw.
 *
 * Cancellation is an AbortSignal: aborted before the tool started, `cancelled`; after,
 * `outcome_unknown/cancelled_after_start` (the tool's own signal aborts; a JavaScript
 * function cannot be stopped, so its late result is discarded). A deadline passed after
 * the start is `outcome_unknown/timeout`.
 */
import { debuglog } from "node:util";

import type { AuthzClient, OutcomeReport } from "./client.js";
import { contextMessage, RpcError } from "./client.js";
import { checkCallId, ProposedCall, type TrustedContext } from "./context.js";
import { canonicalJson } from "./digest.js";
import { Attempt, cancelled, type End, fail, pendingApproval, rejected, unknown } from "./ends.js";
import { endOfRun, execute } from "./execution.js";
import * as apb from "./gen/toolauthz/v1/approvals_pb.js";
import * as pb from "./gen/toolauthz/v1/authorizer_pb.js";
import * as r from "./results.js";
import { CallResult } from "./results.js";
import type { Tool, ToolSet } from "./tools.js";
import { runTurn } from "./turn.js";

const log = debuglog("toolauthz");
export const DEFAULT_EXECUTION_TIMEOUT_MS = 30000;
const DECISIONS: Record<number, string> = { [pb.Decision.ALLOW]: "ALLOW", [pb.Decision.DENY]: "DENY",
  [pb.Decision.APPROVAL_REQUIRED]: "APPROVAL_REQUIRED" };
const NOT_OURS = ["call_id_reused", "call_in_progress"]; // DENY codes whose ledger row is another call's
const SETTLED = [apb.ApprovalStatus.APPROVED, apb.ApprovalStatus.REJECTED, apb.ApprovalStatus.EXPIRED];
// An Authorize failed with these is `authorization_unavailable`: undecided (or its answer
// lost), safe to ask again with the same call id. CANCELLED is gRPC's core refusing a call
// its full backlog cannot hold (or a client closed under the call); the user's AbortSignal
// never reaches Authorize or AuthorizeBatch, so it cannot be that.
const TRANSIENT = ["UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "CANCELLED"];

/** The RPCs a Guard makes: an AuthzClient, or a stand-in with the same methods. */
export type GuardClient = Pick<AuthzClient, "authorize" | "authorizeBatch" | "verify" | "reportOutcome"
  | "watchApproval">;

/** One step of a guarded call, for traces and metrics (never shown to the model). */
export interface GuardEvent {
  kind: "authorize" | "approval_wait" | "approval" | "verify" | "execute" | "outcome";
  callId: string;
  name: string;
  data: Record<string, unknown>;
}

export interface GuardOptions {
  approvalWaitMs?: number;
  executionTimeoutMs?: number;
  rpcTimeoutMs?: number;
  observer?: (event: GuardEvent) => void;
}

export interface RunOptions {
  signal?: AbortSignal;
  timeoutMs?: number;
  approvalWaitMs?: number;
}

/** A call's Authorize answer when a turn's AuthorizeBatch already asked (or why it failed). */
export type Authorized = [pb.TrustedContext, pb.AuthorizeResponse | RpcError];

class GuardStateError extends Error {}

interface CallState {
  name: string;
  signature: string;
  running: boolean;
  result?: CallResult;
}

export class Guard {
  readonly approvalWaitMs: number;
  readonly executionTimeoutMs: number;
  readonly rpcTimeoutMs: number | undefined;
  private readonly calls = new Map<string, CallState>();
  private readonly observer: ((event: GuardEvent) => void) | undefined;

  /** One Guard per model run: `context` is that run's trusted context; call ids are tracked per Guard. */
  constructor(readonly client: GuardClient, readonly context: TrustedContext, readonly tools: ToolSet,
              options: GuardOptions = {}) {
    this.approvalWaitMs = options.approvalWaitMs ?? 0;
    this.executionTimeoutMs = options.executionTimeoutMs ?? DEFAULT_EXECUTION_TIMEOUT_MS;
    this.rpcTimeoutMs = options.rpcTimeoutMs;
    this.observer = options.observer;
    if (!(this.approvalWaitMs >= 0) || !(this.executionTimeoutMs > 0)) {
      throw new RangeError("approvalWaitMs must be >= 0 and executionTimeoutMs > 0");
    }
  }

  /**
   * Authorize → (approval) → Verify → execute → ReportOutcome, for one call.
   * `inputJson` is the model's argument text exactly as produced. Never rejects for
   * anything the model or the sidecar did; resolves to the result.
   */
  async run(callId: string, name: string, inputJson: string | Uint8Array, options: RunOptions = {}): Promise<CallResult> {
    const call = this.open(callId, name, inputJson);
    if (call instanceof CallResult) return call;
    return this.runAdmitted(call, options);
  }

  /**
   * The calls of one model turn: authorized in one AuthorizeBatch, then run in the
   * model's order (consecutive `concurrent` tools together), one result per call.
   * An aborted `signal` ends calls not started `cancelled`, started ones `outcome_unknown`.
   */
  async runTurn(calls: Iterable<TurnCall>, options: RunOptions = {}): Promise<CallResult[]> {
    return runTurn(this, calls, options);
  }

  /** Ends a call that waits for approval: `cancelled`, reported. */
  async cancel(callId: string): Promise<CallResult> {
    const state = this.calls.get(callId);
    if (state === undefined) throw new GuardStateError(`no call \`${callId}\``);
    if (state.running) throw new GuardStateError(`call \`${callId}\` is running; cancel it with its signal`);
    if (state.result === undefined || state.result.terminal) throw new GuardStateError(`call \`${callId}\` is finished`);
    state.running = true;
    const pending = state.result;
    const att = Object.assign(new Attempt(), { authorizeSent: true, decision: pending.decision,
      decisionId: pending.decisionId, approvalId: pending.approvalId });
    const call = new ProposedCall(callId, pending.name, "");
    return this.finish(callId, await this.reporting(cancelled(call, att, true)));
  }

  /** The last result of a call id (terminal, or approval pending), or undefined. */
  result(callId: string): CallResult | undefined {
    return this.calls.get(callId)?.result;
  }

  /** Call ids without a terminal outcome: running now or waiting for approval. */
  pending(): string[] {
    return [...this.calls].filter(([, s]) => s.running || !s.result?.terminal).map(([id]) => id);
  }

  /** Ends, with no RPC, a call the runtime refused before authorization (a malformed stream). */
  refuse(callId: string, name: string, code: string, content: string): CallResult {
    const opened = this.open(callId, name, "");
    if (opened instanceof CallResult) return opened;
    return this.finish(callId, new CallResult({ callId, name, status: "failed", code, content }));
  }

  // -- admission (used by turn.ts too) ------------------------------------------------

  /** The call to run, or the result that ends it before any RPC. */
  open(callId: string, name: string, inputJson: string | Uint8Array): ProposedCall | CallResult {
    try {
      checkCallId(callId);
    } catch {
      return new CallResult({ callId: String(callId), name, status: "rejected", code: "invalid_call_id",
        content: r.MESSAGES.invalid_call_id });
    }
    const call = new ProposedCall(callId, name, inputJson);
    const early = this.admit(call);
    if (early === undefined) return call;
    this.emit("outcome", early, { status: early.status, code: early.code, replayed: true, executed: false });
    return early;
  }

  private admit(call: ProposedCall): CallResult | undefined {
    const signature = JSON.stringify([call.name, call.arguments !== undefined ? canonicalJson(call.arguments)
      : Buffer.from(call.inputJson).toString("base64")]);
    const state = this.calls.get(call.callId);
    if (state === undefined) {
      this.calls.set(call.callId, { name: call.name, signature, running: true });
      return undefined;
    }
    if (state.signature !== signature) return rejected(call, "call_id_reused");
    if (state.running) return rejected(call, "call_in_progress");
    if (state.result?.terminal) return state.result.with({ replayed: true });
    state.running = true; // waiting for approval: run it again (resume)
    return undefined;
  }

  /** Records the result of a pending call: the one place a call's state changes. */
  finish(callId: string, result: CallResult): CallResult {
    const state = this.calls.get(callId);
    if (state === undefined || !state.running) throw new GuardStateError(`no pending call \`${callId}\``);
    if (state.result?.terminal) throw new GuardStateError(`call \`${callId}\` already has an outcome`);
    state.result = result;
    state.running = false;
    this.emit("outcome", result, { status: result.status, code: result.code, reported: result.reported,
      executed: result.executed, replayed: result.replayed });
    return result;
  }

  // -- the algorithm ------------------------------------------------------------------

  /** Runs an admitted call to its one result (authorized: a turn's batch answer). */
  async runAdmitted(call: ProposedCall, options: RunOptions, authorized?: Authorized): Promise<CallResult> {
    const att = new Attempt();
    let end: End;
    try {
      end = await this.decide(call, att, options, authorized);
    } catch (error) {
      log("guard failed in call %s: %s", call.callId, error);
      end = att.started ? unknown(call, att, "internal_error")
        : fail(call, att, "internal_error", { report: att.authorizeSent });
    }
    return this.finish(call.callId, await this.reporting(end));
  }

  /** The run's context with the entities the runtime vouches for this call, or undefined when its provider failed. */
  async callContext(call: ProposedCall): Promise<pb.TrustedContext | undefined> {
    try {
      const entities = this.context.entities ? await this.context.entities(call) : undefined;
      return contextMessage(this.context, entities);
    } catch (error) {
      log("entities provider failed for call %s: %s", call.callId, error);
      return undefined;
    }
  }

  private async decide(call: ProposedCall, att: Attempt, options: RunOptions, authorized?: Authorized): Promise<End> {
    const aborted = () => options.signal?.aborted === true;
    if (aborted()) return cancelled(call, att, authorized !== undefined);
    let ctx: pb.TrustedContext;
    let response: pb.AuthorizeResponse;
    if (authorized === undefined) {
      const found = await this.callContext(call);
      if (found === undefined) return fail(call, att, "context_error", { report: false });
      ctx = found;
      att.authorizeSent = true;
      try {
        response = await this.client.authorize(ctx, call, { timeoutMs: this.rpcTimeoutMs });
      } catch (error) {
        return fail(call, att, this.authorizeFailed(call, error));
      }
    } else {
      att.authorizeSent = true;
      let answer: pb.AuthorizeResponse | RpcError;
      [ctx, answer] = authorized;
      if (answer instanceof RpcError) return fail(call, att, this.authorizeFailed(call, answer));
      response = answer;
    }
    const tool = this.onAuthorized(call, att, response);
    if (!(tool instanceof ToolHolder)) return tool;
    let token = response.token;
    if (response.decision === pb.Decision.APPROVAL_REQUIRED) {
      if (aborted()) return cancelled(call, att, true);
      const waited = await this.awaitApproval(call, att, ctx, options);
      if (typeof waited !== "string") return waited;
      token = waited;
    }
    if (aborted()) return cancelled(call, att, true);
    let verified: pb.VerifyResponse;
    try {
      verified = await this.client.verify(token, ctx, call, { timeoutMs: this.rpcTimeoutMs });
    } catch (error) {
      log("Verify of call %s failed: %s", call.callId, RpcError.of(error).code);
      return fail(call, att, "verification_unavailable");
    }
    this.emit("verify", call, { valid: verified.valid, code: verified.code });
    if (!verified.valid) {
      if (verified.code === "already_used") { // another runtime executed it and owns the outcome
        return fail(call, att, "already_executed", { report: false, detail: { verify: verified.code } });
      }
      return fail(call, att, "verification_failed", { detail: { verify: verified.code } });
    }
    if (aborted()) return cancelled(call, att, true);
    const ms = options.timeoutMs ?? tool.tool.options.timeoutMs ?? this.executionTimeoutMs;
    this.emit("execute", call, { deadlineMs: ms });
    const ran = await execute(tool.tool, call, att, this.context, ms, options.signal);
    return endOfRun(call, att, tool.tool, ran);
  }

  private onAuthorized(call: ProposedCall, att: Attempt, response: pb.AuthorizeResponse): End | ToolHolder {
    att.decision = DECISIONS[response.decision] ?? "";
    att.decisionId = response.decisionId;
    att.approvalId = response.approvalId;
    const codes = response.errors.map((e) => e.code);
    this.emit("authorize", call, { decision: att.decision, replayed: response.replayed, codes,
      reasons: [...response.reasons], approvalId: response.approvalId, token: response.token !== "" });
    if (response.decision === pb.Decision.DENY) {
      const first = codes[0] ?? "";
      const code = ["invalid_input", "unknown_tool", ...NOT_OURS].includes(first) ? first : "denied";
      const content = NOT_OURS.includes(code) ? r.MESSAGES[code]
        : r.refused(response.errors.map((e) => e.message), response.reasons);
      return fail(call, att, code, { report: !NOT_OURS.includes(code), content,
        detail: { errors: codes, reasons: [...response.reasons] } });
    }
    if (response.decision === pb.Decision.ALLOW && response.token === "") {
      // A replay of a call that was already executed (by this or another runtime).
      return fail(call, att, "already_executed", { report: false });
    }
    if (DECISIONS[response.decision] === undefined) return fail(call, att, "authorization_error");
    const tool = this.tools.get(call.name);
    if (tool === undefined) return fail(call, att, "unknown_tool", { content: r.toolUnavailable(call.name) });
    if (call.arguments === undefined) return fail(call, att, "invalid_input"); // the sidecar accepted it: fail closed anyway
    return new ToolHolder(tool);
  }

  /** The token to run with once a person approved, or the call's End. */
  private async awaitApproval(call: ProposedCall, att: Attempt, ctx: pb.TrustedContext,
                              options: RunOptions): Promise<End | string> {
    const wait = options.approvalWaitMs ?? this.approvalWaitMs;
    this.emit("approval_wait", call, { approvalId: att.approvalId, ms: wait });
    if (wait <= 0) return pendingApproval(call, att);
    let approval: apb.Approval | undefined;
    try {
      for await (const state of this.client.watchApproval(att.approvalId, contextMessage(this.context),
        { timeoutMs: wait, signal: options.signal })) {
        this.emit("approval", call, { status: apb.ApprovalStatus[state.status], approvalId: state.approvalId });
        if (SETTLED.includes(state.status)) {
          approval = state;
          break;
        }
      }
    } catch (error) {
      const code = RpcError.of(error).code;
      if (options.signal?.aborted !== true && code !== "DEADLINE_EXCEEDED") {
        log("watching approval %s failed: %s", att.approvalId, code);
      }
    }
    if (approval === undefined) {
      return options.signal?.aborted ? cancelled(call, att, true) : pendingApproval(call, att);
    }
    if (approval.status === apb.ApprovalStatus.REJECTED) return fail(call, att, "approval_rejected");
    if (approval.status === apb.ApprovalStatus.EXPIRED) return fail(call, att, "approval_expired");
    if (approval.token) return approval.token;
    // Approved, but the watch carried no token: the replayed Authorize issues one.
    let again: pb.AuthorizeResponse;
    try {
      again = await this.client.authorize(ctx, call, { timeoutMs: this.rpcTimeoutMs });
    } catch (error) {
      return fail(call, att, this.authorizeFailed(call, error));
    }
    if (again.decision === pb.Decision.ALLOW && again.token) return again.token;
    return fail(call, att, "approval_unavailable");
  }

  /** ReportOutcome for an End that has something to report: the result as reported. */
  async reporting(end: End): Promise<CallResult> {
    if (end.report === undefined) return end.result;
    const [status, code, digest] = end.report;
    let report: OutcomeReport;
    try {
      report = await this.client.reportOutcome(contextMessage(this.context), end.result.callId, status,
        { errorCode: code, outputDigest: digest, timeoutMs: this.rpcTimeoutMs });
    } catch (error) {
      const failure = RpcError.of(error);
      if (failure.code === "NOT_FOUND") return end.result.with({ reported: "not_in_ledger" });
      log("could not report an outcome: %s", failure.code);
      return end.result.with({ reported: failure.code === "ALREADY_EXISTS" ? "conflict" : "report_failed" });
    }
    return end.result.with({ reported: report.alreadyRecorded ? "already_recorded" : "recorded",
      detail: { ...end.result.detail, ...(report.unverified ? { unverified: true } : {}) } });
  }

  private authorizeFailed(call: ProposedCall, error: unknown): string {
    const failure = RpcError.of(error);
    log("Authorize of call %s failed: %s", call.callId, failure.code);
    return TRANSIENT.includes(failure.code) ? "authorization_unavailable" : "authorization_error";
  }

  private emit(kind: GuardEvent["kind"], call: { callId: string; name: string }, data: Record<string, unknown>): void {
    if (this.observer === undefined) return;
    try {
      this.observer({ kind, callId: call.callId, name: call.name, data });
    } catch (error) {
      log("guard observer failed on %s: %s", kind, error);
    }
  }
}

/** The tool an ALLOW lets run (a class, so `instanceof` tells it from an End). */
class ToolHolder {
  constructor(readonly tool: Tool) {}
}

/** One proposed call of a turn: [call id, tool name, argument text], or what a stream assembled or refused. */
export type TurnCall = readonly [string, string, string | Uint8Array]
  | { callId: string; name: string; inputJson: string | Uint8Array }
  | { callId: string; name: string; refused: string; content: string };

export { GuardStateError };
