/**
 * The conformance cases both SDKs run (tests/conformance/sdk/*.json), on the TypeScript
 * side; tests/test_sdk_conformance.py runs the same files for the Python SDK.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, test } from "node:test";

import { fromJson, type JsonObject } from "@bufbuild/protobuf";

import { type Answer, CallAssembly, REFUSALS } from "../src/assembly.js";
import { RpcError } from "../src/client.js";
import { Principal, TrustedContext } from "../src/context.js";
import { callDigest, canonicalJson } from "../src/digest.js";
import * as apb from "../src/gen/toolauthz/v1/approvals_pb.js";
import * as pb from "../src/gen/toolauthz/v1/authorizer_pb.js";
import { Guard, type GuardClient, type TurnCall } from "../src/guard.js";
import { AnthropicToolStream, ChatCompletionsToolStream, ResponsesToolStream } from "../src/streaming.js";
import { InvalidInputError, parseStrictJson } from "../src/json.js";
import { type CallResult, MESSAGES } from "../src/results.js";
import { ToolError, type ToolInvocation, ToolSet } from "../src/tools.js";
import { repoRoot } from "./support.js";

const dir = join(repoRoot(), "tests", "conformance", "sdk");
const load = (name: string) => JSON.parse(readFileSync(join(dir, name), "utf8")).cases as any[];

function inputBytes(c: any): Uint8Array {
  if (c.input_hex !== undefined) return Buffer.from(c.input_hex, "hex");
  return wtf8(c.input_json);
}

/** The case's text as bytes; a lone surrogate as its 3-byte form (invalid UTF-8), like Python's surrogatepass. */
function wtf8(text: string): Uint8Array {
  const out: number[] = [];
  for (let i = 0; i < text.length; i++) {
    const code = text.codePointAt(i)!;
    if (code > 0xffff) i++;
    if (code >= 0xd800 && code <= 0xdfff) out.push(0xe0 | (code >> 12), 0x80 | ((code >> 6) & 0x3f), 0x80 | (code & 0x3f));
    else out.push(...Buffer.from(String.fromCodePoint(code), "utf8"));
  }
  return Uint8Array.from(out);
}

describe("digests", () => {
  for (const c of load("digests.json")) {
    test(c.name, () => {
      const call = c.call;
      if (c.expect.error !== undefined) {
        assert.throws(() => parseStrictJson(inputBytes(c)), InvalidInputError);
        return;
      }
      const value = parseStrictJson(inputBytes(c));
      const whole = { call_id: call.call_id, input: value, principal: call.principal, tenant: call.tenant, tool: call.tool };
      assert.equal(canonicalJson(whole), c.expect.canonical);
      assert.equal(callDigest({ tool: call.tool, tenant: call.tenant, callId: call.call_id,
        principalType: call.principal.type, principalId: call.principal.id }, value), c.expect.digest);
    });
  }
});

/** Answers each RPC from the case's script, in order, and records what was asked. */
class ScriptedClient implements GuardClient {
  readonly rpcs: unknown[][] = [];
  readonly script: Record<string, any[]>;
  cancel = new AbortController();

  constructor(script: Record<string, any[]>) {
    this.script = Object.fromEntries(Object.entries(script).map(([k, v]) => [k, [...v]]));
  }

  private next(name: string): any {
    const queue = this.script[name];
    const answer = queue?.length ? queue.shift() : { error: "UNIMPLEMENTED" };
    if (answer.then_cancel) this.cancel.abort();
    if (answer.error !== undefined) throw new RpcError(answer.error, "scripted");
    const { then_cancel: _, ...rest } = answer;
    return rest;
  }

  async authorize(_context: any, call: any): Promise<pb.AuthorizeResponse> {
    this.rpcs.push(["Authorize", call.callId]);
    return fromJson(pb.AuthorizeResponseSchema, this.next("Authorize") as JsonObject);
  }

  async authorizeBatch(_context: any, calls: readonly any[]): Promise<pb.BatchAnswer[]> {
    this.rpcs.push(["AuthorizeBatch", calls.map((c) => c.call.callId)]);
    return fromJson(pb.AuthorizeBatchResponseSchema, this.next("AuthorizeBatch") as JsonObject).answers;
  }

  async verify(token: string, _context: any, call: any): Promise<pb.VerifyResponse> {
    this.rpcs.push(["Verify", call.callId, token]);
    return fromJson(pb.VerifyResponseSchema, this.next("Verify") as JsonObject);
  }

  async reportOutcome(_context: any, callId: string, status: string, options: any = {}) {
    this.rpcs.push(["ReportOutcome", callId, status, options.errorCode ?? "", options.outputDigest ?? ""]);
    const answer = this.script.ReportOutcome?.length ? this.next("ReportOutcome") : {};
    return { decisionId: answer.decision_id ?? "", unverified: answer.unverified ?? false, alreadyRecorded: false };
  }

  async *watchApproval(approvalId: string): AsyncGenerator<apb.Approval> {
    this.rpcs.push(["WatchApproval", approvalId]);
    const states = this.script.WatchApproval?.length ? this.script.WatchApproval.shift() : [{ error: "UNIMPLEMENTED" }];
    for (const state of states) {
      if (state.error !== undefined) throw new RpcError(state.error, "scripted");
      const { then_cancel: cancels, ...approval } = state;
      if (cancels) this.cancel.abort();
      yield fromJson(apb.ApprovalSchema, approval);
    }
  }
}

function tool(behaviour: any, client: ScriptedClient) {
  return async (_args: unknown, call: ToolInvocation) => {
    if ("returns" in behaviour) return behaviour.returns;
    if (behaviour.tool_error) throw new ToolError(behaviour.tool_error[0], behaviour.tool_error[1]);
    if (behaviour.throws) throw new Error("scripted crash");
    if (behaviour.returns_special === "nan") return { value: NaN };
    if (behaviour.cancels_then_waits) client.cancel.abort();
    if (behaviour.cancels_then_waits || behaviour.waits_for_cancel) {
      await new Promise((resolve) => call.signal.addEventListener("abort", resolve, { once: true }));
      return "late";
    }
    throw new Error(`unknown behaviour ${JSON.stringify(behaviour)}`);
  };
}

function expectedRpcs(rpcs: unknown[][]): unknown[][] {
  return rpcs.map((rpc) => rpc.map((item) => (typeof item === "string" && item.startsWith("$digest:")
    ? createHash("sha256").update(item.slice("$digest:".length), "utf8").digest("hex") : item)));
}

function check(result: CallResult, expect: Record<string, unknown>): void {
  const fields: Record<string, unknown> = { status: result.status, code: result.code, executed: result.executed,
    reported: result.reported, replayed: result.replayed, content: result.content, approval_id: result.approvalId,
    decision: result.decision, decision_id: result.decisionId };
  for (const [name, want] of Object.entries(expect)) assert.deepEqual(fields[name], want, name);
  assert.equal(result.toToolResult().is_error, result.status !== "completed");
}

describe("guard", () => {
  for (const c of load("guard.json")) {
    test(c.name, async () => {
      const client = new ScriptedClient(c.script);
      const tools = new ToolSet();
      for (const [name, behaviour] of Object.entries(c.tools)) tools.register(name, tool(behaviour, client));
      const entities = c.entities === "throws" ? () => { throw new Error("the runtime's store is down"); } : undefined;
      const guard = new Guard(client, new TrustedContext("acme", new Principal("User", "alice"), "run-1", entities), tools);
      for (const step of c.runs) {
        client.cancel = new AbortController();
        if (step.cancel_pending !== undefined) {
          check(await guard.cancel(step.cancel_pending), step.expect);
          continue;
        }
        if (step.cancel === "before") client.cancel.abort();
        const options = { signal: client.cancel.signal, timeoutMs: step.timeout_ms, approvalWaitMs: step.approval_wait_ms };
        if (step.turn !== undefined) {
          const results = await guard.runTurn(step.turn as TurnCall[], options);
          assert.equal(results.length, step.expect.length);
          results.forEach((result, i) => check(result, step.expect[i]));
        } else {
          const [callId, name, input] = step.call;
          check(await guard.run(callId, name, input, options), step.expect);
        }
      }
      assert.deepEqual(client.rpcs, expectedRpcs(c.rpcs));
    });
  }
});

function shown(a: Answer) {
  return "refused" in a ? { call_id: a.callId, name: a.name, refused: a.refused }
    : { call_id: a.callId, name: a.name, input_json: Buffer.from(a.inputJson).toString("utf8") };
}

describe("streams", () => {
  for (const c of load("streams.json")) {
    test(c.name, () => {
      if (c.api !== undefined) {
        const adapters = { anthropic: AnthropicToolStream, chat_completions: ChatCompletionsToolStream,
          responses: ResponsesToolStream } as const;
        const stream = new adapters[c.api as keyof typeof adapters](c.limits ?? {});
        const answers = [...c.api_events.flatMap((event: unknown) => stream.feed(event)), ...stream.close()];
        assert.deepEqual(answers.map(shown), c.expect);
        assert.equal(stream.assembly.broken, c.broken ?? false);
        return;
      }
      const assembly = new CallAssembly(c.limits ?? {}, c.max_calls !== undefined ? { maxCalls: c.max_calls } : {});
      const answers = [];
      for (const op of c.events) {
        if (op[0] === "open") answers.push(...assembly.open(op[1], op[2], op[3]));
        else if (op[0] === "append") answers.push(...assembly.append(op[1], op[2]));
        else if (op[0] === "end") answers.push(...assembly.end(op[1], op[2]));
        else if (op[0] === "close") answers.push(...assembly.close());
        else throw new Error(`unknown event ${op[0]}`);
      }
      assert.deepEqual(answers.map(shown), c.expect);
      assert.equal(assembly.broken, c.broken ?? false);
    });
  }
});

test("the model-safe texts are the shared ones", () => {
  const shared = JSON.parse(readFileSync(join(dir, "messages.json"), "utf8"));
  assert.deepEqual({ ...MESSAGES }, shared.messages);
  assert.deepEqual({ ...REFUSALS }, shared.refusals);
});
