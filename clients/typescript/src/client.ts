/**
 * The client for the sidecar's gRPC services (ToolAuthorizer, Approvals), over
 * `@grpc/grpc-js` with the messages generated from proto/ by protoc-gen-es.
 *
 * Every call has a deadline (`timeoutMs`, default the client's) that bounds the whole
 * call, retries and backoff included; retries follow ./retry.ts (only UNAVAILABLE;
 * Verify never). Failures reject with `RpcError`, whose `code` is the gRPC status name.
 * Authorize and AuthorizeBatch first pass the client's adaptive throttle (./throttle.ts),
 * once per call, retries not counted again; it learns the call's final answer, and whether
 * the sidecar marked it congested (trailing metadata CONGESTED_METADATA).
 */
import { setTimeout as sleep } from "node:timers/promises";

import { create, type DescMessage, fromBinary, type MessageShape, toBinary } from "@bufbuild/protobuf";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import * as grpc from "@grpc/grpc-js";

import { type EntitiesProvider, ProposedCall, TrustedContext } from "./context.js";
import * as apb from "./gen/toolauthz/v1/approvals_pb.js";
import * as pb from "./gen/toolauthz/v1/authorizer_pb.js";
import { attemptsFor, RETRYABLE, RetryPolicy } from "./retry.js";
import { RpcError } from "./rpc-error.js";
import { AdaptiveThrottle, CONGESTED_METADATA, THROTTLED_METHODS, ThrottlePolicy } from "./throttle.js";
import { channelOptions, checkTarget, type ClientTls, credentials } from "./transport.js";

export { RpcError } from "./rpc-error.js";

export const DEFAULT_TIMEOUT_MS = 5000;
export const DEFAULT_WATCH_TIMEOUT_MS = 60000;
const MIN_ATTEMPT_MS = 1; // below this much time left, another attempt is pointless
const TRANSPORT_LABELS = ["mcp"];

export interface CallOptions {
  timeoutMs?: number;
  signal?: AbortSignal;
}

export interface AuthzClientOptions {
  /** The Approvals service's own address, when it listens apart (default: the same). */
  approvalsTarget?: string;
  timeoutMs?: number;
  retry?: RetryPolicy;
  tls?: ClientTls;
  /** `mcp`: this client fronts the MCP gateway (a metrics label only). */
  transportLabel?: string;
  channelOptions?: grpc.ChannelOptions;
  /**
   * Client-side adaptive throttling of Authorize and AuthorizeBatch (./throttle.ts):
   * a policy for this client's own throttle (default `new ThrottlePolicy()`), `null` for
   * none, or an `AdaptiveThrottle` built with test clocks (then shared by whoever holds it).
   */
  throttle?: ThrottlePolicy | AdaptiveThrottle | null;
}

export interface OutcomeReport {
  decisionId: string;
  unverified: boolean; // the call's token was never verified before this outcome
  alreadyRecorded: boolean; // ALREADY_EXISTS after a retried attempt: our first attempt landed
}

export type OutcomeName = "completed" | "failed" | "cancelled" | "outcome_unknown";
const OUTCOMES: Record<OutcomeName, pb.OutcomeStatus> = {
  completed: pb.OutcomeStatus.COMPLETED,
  failed: pb.OutcomeStatus.FAILED,
  cancelled: pb.OutcomeStatus.CANCELLED,
  outcome_unknown: pb.OutcomeStatus.OUTCOME_UNKNOWN,
};

type Context = TrustedContext | pb.TrustedContext;
/** A successful attempt's response, and whether the sidecar marked it congested. */
type Answer = { bytes: Uint8Array; congested: boolean };
type Call = ProposedCall | pb.ToolCall;

/**
 * `new AuthzClient("127.0.0.1:50051")`, `new AuthzClient("unix:///run/toolauthz.sock")`,
 * with `{ tls: { ca, cert, key } }` for a TLS or mTLS listener. `close()` when done.
 */
export class AuthzClient {
  readonly timeoutMs: number;
  readonly retry: RetryPolicy;
  /** The throttle of this client's Authorize and AuthorizeBatch calls; null: none. */
  readonly throttle: AdaptiveThrottle | null;
  private readonly authz: grpc.Client;
  private readonly approvals: grpc.Client;
  private readonly metadata: () => grpc.Metadata;

  constructor(target: string, options: AuthzClientOptions = {}) {
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (!(this.timeoutMs > 0)) throw new RangeError("timeoutMs must be positive");
    this.retry = options.retry ?? new RetryPolicy();
    const throttle = options.throttle === undefined ? new ThrottlePolicy() : options.throttle;
    this.throttle = throttle === null || throttle instanceof AdaptiveThrottle ? throttle
      : new AdaptiveThrottle(throttle);
    const label = options.transportLabel;
    if (label !== undefined && !TRANSPORT_LABELS.includes(label)) {
      throw new TypeError(`transportLabel must be one of ${TRANSPORT_LABELS.join(", ")}, or absent`);
    }
    this.metadata = () => {
      const metadata = new grpc.Metadata();
      if (label !== undefined) metadata.set("toolauthz-transport", label);
      return metadata;
    };
    const creds = credentials(options.tls);
    const settings = { ...options.channelOptions, ...channelOptions(options.tls) };
    this.authz = new grpc.Client(checkTarget(target), creds, settings);
    this.approvals = options.approvalsTarget === undefined ? this.authz
      : new grpc.Client(checkTarget(options.approvalsTarget), creds, settings);
  }

  close(): void {
    this.authz.close();
    if (this.approvals !== this.authz) this.approvals.close();
  }

  // -- ToolAuthorizer ---------------------------------------------------------------

  /** The decision for one proposed call. Retried at most once, on UNAVAILABLE only. */
  async authorize(context: Context, call: Call, options: CallOptions = {}): Promise<pb.AuthorizeResponse> {
    const entities = await entitiesFor(context, call);
    const request = create(pb.AuthorizeRequestSchema, { context: contextMessage(context, entities),
      call: callMessage(call) });
    return this.unary("Authorize", pb.ToolAuthorizer.method.authorize, request, options);
  }

  /**
   * The decisions for the parallel tool calls of one model turn, in one RPC: one answer
   * per call, in order, holding the call's `response` or its own `error`. A failure of
   * the whole batch rejects, and then no call has a token. `entities`: each call's Cedar
   * entities in the same order, or from the context's entities provider.
   */
  async authorizeBatch(context: Context, calls: readonly (Call | pb.BatchCall)[],
                       options: CallOptions & { entities?: readonly (unknown[] | null | undefined)[] } = {},
  ): Promise<pb.BatchAnswer[]> {
    if (options.entities !== undefined && options.entities.length !== calls.length) {
      throw new TypeError("entities must hold one entry per call");
    }
    const batch: pb.BatchCall[] = [];
    for (const [i, item] of calls.entries()) {
      if (!(item instanceof ProposedCall) && item.$typeName === "toolauthz.v1.BatchCall") {
        batch.push(item);
        continue;
      }
      const entities = options.entities !== undefined ? options.entities[i] : await entitiesFor(context, item);
      batch.push(create(pb.BatchCallSchema, { call: callMessage(item), entitiesJson: entitiesJson(entities) }));
    }
    const request = create(pb.AuthorizeBatchRequestSchema, { context: contextMessage(context), calls: batch });
    const response = await this.unary("AuthorizeBatch", pb.ToolAuthorizer.method.authorizeBatch, request, options);
    return response.answers;
  }

  /** Checks and CONSUMES the token for this exact call. Never retried. */
  verify(token: string, context: Context, call: Call, options: CallOptions = {}): Promise<pb.VerifyResponse> {
    const request = create(pb.VerifyRequestSchema, { token, context: contextMessage(context), call: callMessage(call) });
    return this.unary("Verify", pb.ToolAuthorizer.method.verify, request, options);
  }

  getKeys(options: CallOptions = {}): Promise<pb.GetKeysResponse> {
    return this.unary("GetKeys", pb.ToolAuthorizer.method.getKeys, create(pb.GetKeysRequestSchema), options);
  }

  /**
   * Records the one terminal outcome of a call. ALREADY_EXISTS on the first attempt
   * rejects (someone else reported this call); after a retried attempt it is success.
   */
  async reportOutcome(context: Context, callId: string, status: OutcomeName,
                      options: CallOptions & { errorCode?: string; outputDigest?: string } = {},
  ): Promise<OutcomeReport> {
    if (!(status in OUTCOMES)) throw new TypeError(`unknown outcome \`${String(status)}\``);
    const request = create(pb.ReportOutcomeRequestSchema, { context: contextMessage(context), callId,
      status: OUTCOMES[status], errorCode: options.errorCode ?? "", outputDigest: options.outputDigest ?? "" });
    let attempts = 0;
    try {
      const response = await this.unary("ReportOutcome", pb.ToolAuthorizer.method.reportOutcome, request, options,
        () => attempts++);
      return { decisionId: response.decisionId, unverified: response.unverified, alreadyRecorded: false };
    } catch (error) {
      if (error instanceof RpcError && error.code === "ALREADY_EXISTS" && attempts > 1) {
        return { decisionId: "", unverified: false, alreadyRecorded: true };
      }
      throw error;
    }
  }

  /** The loaded policy version, reload errors and the workers' counters. */
  getStatus(options: CallOptions = {}): Promise<pb.GetStatusResponse> {
    return this.unary("GetStatus", pb.ToolAuthorizer.method.getStatus, create(pb.GetStatusRequestSchema), options);
  }

  /** Whether the sidecar serves (the standard gRPC health check): its store is usable. */
  async health(options: CallOptions = {}): Promise<boolean> {
    const bytes = await this.raw("Health", "/grpc.health.v1.Health/Check", new Uint8Array(0), options);
    const reader = new BinaryReader(bytes);
    let status = 0;
    while (reader.pos < reader.len) {
      const [field, wireType] = reader.tag();
      if (field === 1 && wireType === 0) status = reader.int32();
      else reader.skip(wireType);
    }
    return status === 1; // SERVING
  }

  // -- Approvals --------------------------------------------------------------------

  async listApprovals(filter: { tenant?: string; status?: apb.ApprovalStatus; group?: string; limit?: number } = {},
                      options: CallOptions = {}): Promise<apb.Approval[]> {
    const request = create(apb.ListApprovalsRequestSchema, filter);
    return (await this.unary("ListApprovals", apb.Approvals.method.listApprovals, request, options,
      undefined, this.approvals)).approvals;
  }

  /** With the requester's context, an approved approval carries its token. */
  getApproval(approvalId: string, context?: Context, options: CallOptions = {}): Promise<apb.Approval> {
    const request = create(apb.GetApprovalRequestSchema, { approvalId,
      context: context === undefined ? undefined : contextMessage(context) });
    return this.unary("GetApproval", apb.Approvals.method.getApproval, request, options, undefined, this.approvals);
  }

  /** A person's decision, from the approval tool's own session. Never retried. */
  decideApproval(approvalId: string, approver: Context, verdict: "approve" | "reject",
                 options: CallOptions & { reason?: string; idToken?: string } = {}): Promise<apb.Approval> {
    const request = create(apb.DecideApprovalRequestSchema, { approvalId, approver: contextMessage(approver),
      verdict: verdict === "approve" ? apb.Verdict.APPROVE : apb.Verdict.REJECT, reason: options.reason ?? "",
      idToken: options.idToken ?? "" });
    return this.unary("DecideApproval", apb.Approvals.method.decideApproval, request, options, undefined,
      this.approvals);
  }

  /**
   * The approval's current state, then every change until a terminal state; ends with
   * DEADLINE_EXCEEDED after `timeoutMs` (default 60 s) or when `signal` aborts. Not retried.
   */
  async *watchApproval(approvalId: string, context?: Context, options: CallOptions = {}): AsyncGenerator<apb.Approval> {
    const request = create(apb.GetApprovalRequestSchema, { approvalId,
      context: context === undefined ? undefined : contextMessage(context) });
    const method = apb.Approvals.method.watchApproval;
    const deadline = Date.now() + (options.timeoutMs ?? DEFAULT_WATCH_TIMEOUT_MS);
    const stream = this.approvals.makeServerStreamRequest(path(method), (m: apb.GetApprovalRequest) =>
      Buffer.from(toBinary(method.input, m)), (b: Buffer) => fromBinary(method.output, b), request, this.metadata(),
    { deadline });
    const abort = () => stream.cancel();
    options.signal?.addEventListener("abort", abort, { once: true });
    try {
      for await (const approval of stream) yield approval as apb.Approval;
    } catch (error) {
      throw RpcError.of(error);
    } finally {
      options.signal?.removeEventListener("abort", abort);
      stream.cancel(); // a no-op once the stream ended; frees it when the caller stopped early
    }
  }

  // -- plumbing ---------------------------------------------------------------------

  private async unary<I extends DescMessage, O extends DescMessage>(
    name: string, method: { name: string; parent: { typeName: string }; input: I; output: O },
    request: MessageShape<I>, options: CallOptions, onAttempt?: () => void, client: grpc.Client = this.authz,
  ): Promise<MessageShape<O>> {
    const bytes = await this.raw(name, path(method), toBinary(method.input, request), options, onAttempt, client);
    try {
      return fromBinary(method.output, bytes);
    } catch {
      throw new RpcError("INTERNAL", "the sidecar's answer is not a valid message");
    }
  }

  /** A call that starts a decision passes the throttle first, and tells it the final outcome. */
  private async raw(name: string, methodPath: string, request: Uint8Array, options: CallOptions,
                    onAttempt?: () => void, client: grpc.Client = this.authz): Promise<Uint8Array> {
    const throttle = THROTTLED_METHODS.has(name) ? this.throttle : null;
    if (throttle === null) return (await this.attempts(name, methodPath, request, options, onAttempt, client)).bytes;
    const sentAt = throttle.admit(); // throws ThrottledError when refused here: no attempt, nothing to count
    let answer: Answer;
    try {
      answer = await this.attempts(name, methodPath, request, options, onAttempt, client);
    } catch (error) {
      throttle.answered(RpcError.of(error).code, false, sentAt);
      throw error;
    }
    throttle.answered(null, answer.congested, sentAt);
    return answer.bytes;
  }

  private async attempts(name: string, methodPath: string, request: Uint8Array, options: CallOptions,
                         onAttempt: (() => void) | undefined, client: grpc.Client): Promise<Answer> {
    const deadline = Date.now() + (options.timeoutMs ?? this.timeoutMs);
    const attempts = attemptsFor(this.retry, name);
    for (let attempt = 1; ; attempt++) {
      onAttempt?.();
      try {
        return await this.once(client, methodPath, request, deadline, options.signal);
      } catch (error) {
        const failure = RpcError.of(error);
        if (attempt >= attempts || !RETRYABLE.has(failure.code)) throw failure;
        const pause = this.retry.delayMs(attempt);
        if (deadline - Date.now() - pause < MIN_ATTEMPT_MS || options.signal?.aborted) throw failure;
        await sleep(pause, undefined, { signal: options.signal }).catch(() => undefined);
        if (options.signal?.aborted) throw failure;
      }
    }
  }

  /**
   * One attempt. A response settles on the 'status' event, which grpc-js emits right after
   * the callback, because only the status carries the trailing metadata (the mark).
   */
  private once(client: grpc.Client, methodPath: string, request: Uint8Array, deadline: number,
               signal: AbortSignal | undefined): Promise<Answer> {
    if (signal?.aborted) return Promise.reject(new RpcError("CANCELLED", "cancelled by the caller"));
    return new Promise((resolve, reject) => {
      let response: Buffer | undefined;
      const call = client.makeUnaryRequest(methodPath, (b: Uint8Array) => Buffer.from(b), (b: Buffer) => b,
        request, this.metadata(), { deadline: Math.max(deadline, Date.now() + MIN_ATTEMPT_MS) },
        (error: grpc.ServiceError | null, value?: Buffer) => {
          signal?.removeEventListener("abort", abort);
          if (error !== null || value === undefined) reject(error ?? new RpcError("INTERNAL", "no answer"));
          else response = value;
        });
      call.on("status", (status: grpc.StatusObject) => {
        if (response === undefined) return; // the callback rejected already
        const congested = status.metadata.get(CONGESTED_METADATA).some((value) => value === "1");
        resolve({ bytes: new Uint8Array(response), congested });
      });
      const abort = () => call.cancel();
      signal?.addEventListener("abort", abort, { once: true });
    });
  }
}

function path(method: { name: string; parent: { typeName: string } }): string {
  return `/${method.parent.typeName}/${method.name}`;
}

/** The context as the sidecar takes it; a TrustedContext's entities given as JSON. */
export function contextMessage(context: Context, entities?: unknown[] | null): pb.TrustedContext {
  if (!(context instanceof TrustedContext)) return context;
  return create(pb.TrustedContextSchema, {
    tenant: context.tenant, requestId: context.requestId, entitiesJson: entitiesJson(entities),
    principal: create(pb.PrincipalSchema, { type: context.principal.type, id: context.principal.id }),
  });
}

export function callMessage(call: Call): pb.ToolCall {
  if (!(call instanceof ProposedCall)) return call;
  return create(pb.ToolCallSchema, { callId: call.callId, name: call.name, inputJson: call.inputJson });
}

/** Cedar entities as the sidecar takes them (`entities_json`); none: empty. */
export function entitiesJson(entities: unknown[] | null | undefined): Uint8Array {
  if (entities === null || entities === undefined || entities.length === 0) return new Uint8Array(0);
  if (!Array.isArray(entities)) throw new TypeError("entities must be an array of Cedar entities");
  return new TextEncoder().encode(JSON.stringify(entities));
}

async function entitiesFor(context: Context, call: Call): Promise<unknown[] | null | undefined> {
  if (!(context instanceof TrustedContext) || context.entities === undefined) return undefined;
  const proposed = call instanceof ProposedCall ? call : new ProposedCall(call.callId, call.name, call.inputJson);
  return (context.entities as EntitiesProvider)(proposed);
}
