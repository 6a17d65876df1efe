/**
 * A model turn's parallel tool calls: one AuthorizeBatch, then each call run as the
 * Guard runs one, with one result per call in the model's order (the rules of
 * toolauthz/client/turn.py):
 *
 * 1. Admission, per call, as `run` admits it: an unusable call id, a replay, a call id
 *    given twice in the turn, or a call a stream refused ends at once without an RPC.
 * 2. Authorization: every admitted call in one AuthorizeBatch (chunks of at most 64 calls
 *    and 512 KiB of arguments and entities). A call's own error, or the whole batch
 *    failing, fails that call and never the others' decisions.
 * 3. Execution in the model's order, except consecutive calls of `concurrent` tools,
 *    which run together.
 * 4. Partial success: a denied, failed or pending call is that call's result.
 * 5. Cancellation: calls not started end `cancelled`, started ones `outcome_unknown`.
 */
import { create } from "@bufbuild/protobuf";

import { contextMessage, RpcError } from "./client.js";
import type { ProposedCall } from "./context.js";
import { Attempt, fail } from "./ends.js";
import * as pb from "./gen/toolauthz/v1/authorizer_pb.js";
import type { Authorized, Guard, RunOptions, TurnCall } from "./guard.js";
import { CallResult } from "./results.js";

export const MAX_BATCH_CALLS = 64; // the sidecar's default `batch.max_calls`
export const MAX_BATCH_BYTES = 512 * 1024; // half the default `batch.max_bytes`: room for the envelope

interface Slot {
  call?: ProposedCall;
  result?: CallResult;
  context?: pb.TrustedContext;
  authorized?: Authorized;
  concurrent: boolean;
}

export async function runTurn(guard: Guard, calls: Iterable<TurnCall>, options: RunOptions): Promise<CallResult[]> {
  const slots = admit(guard, calls);
  for (const slot of slots) {
    if (slot.call === undefined) continue;
    slot.context = await guard.callContext(slot.call);
    if (slot.context === undefined) {
      const end = fail(slot.call, new Attempt(), "context_error", { report: false });
      slot.result = guard.finish(slot.call.callId, end.result);
    }
  }
  for (const chunk of batches(slots)) {
    let answers: pb.BatchAnswer[] | RpcError;
    try {
      answers = await guard.client.authorizeBatch(contextMessage(guard.context), chunk.map(batchCall),
        { timeoutMs: guard.rpcTimeoutMs });
    } catch (error) {
      answers = RpcError.of(error);
    }
    authorizedOf(chunk, answers);
  }
  for (const group of groups(slots)) {
    await Promise.all(group.map(async (slot) => {
      slot.result = await guard.runAdmitted(slot.call!, options, slot.authorized);
    }));
  }
  return slots.map((slot) => slot.result!).filter((result) => result !== undefined);
}

function admit(guard: Guard, calls: Iterable<TurnCall>): Slot[] {
  const slots: Slot[] = [];
  for (const item of calls) {
    if (!isTuple(item) && "refused" in item) {
      slots.push({ result: guard.refuse(item.callId, item.name, item.refused, item.content), concurrent: false });
      continue;
    }
    const [callId, name, inputJson] = isTuple(item) ? item : [item.callId, item.name, item.inputJson];
    const opened = guard.open(callId, name, inputJson);
    if (opened instanceof CallResult) {
      slots.push({ result: opened, concurrent: false });
      continue;
    }
    slots.push({ call: opened, concurrent: guard.tools.get(opened.name)?.concurrent ?? false });
  }
  return slots;
}

function isTuple(item: TurnCall): item is readonly [string, string, string | Uint8Array] {
  return Array.isArray(item);
}

function batches(slots: readonly Slot[]): Slot[][] {
  const chunks: Slot[][] = [];
  let size = 0;
  for (const slot of slots) {
    if (slot.call === undefined || slot.context === undefined) continue;
    const weight = slot.call.inputJson.length + slot.context.entitiesJson.length;
    const last = chunks.at(-1);
    if (last === undefined || last.length >= MAX_BATCH_CALLS || size + weight > MAX_BATCH_BYTES) {
      chunks.push([slot]);
      size = weight;
    } else {
      last.push(slot);
      size += weight;
    }
  }
  return chunks;
}

function batchCall(slot: Slot): pb.BatchCall {
  const call = slot.call!;
  return create(pb.BatchCallSchema, {
    call: create(pb.ToolCallSchema, { callId: call.callId, name: call.name, inputJson: call.inputJson }),
    entitiesJson: slot.context!.entitiesJson,
  });
}

/** Each slot's answer: the decision, or the status it failed with. The batch's context carries no entities. */
function authorizedOf(chunk: readonly Slot[], answers: pb.BatchAnswer[] | RpcError): void {
  for (const [i, slot] of chunk.entries()) {
    const context = slot.context!;
    if (answers instanceof RpcError) {
      slot.authorized = [context, answers];
      continue;
    }
    const answer = answers[i]?.answer;
    if (answer === undefined || answer.case === undefined) {
      slot.authorized = [context, new RpcError("INTERNAL", "the batch answered fewer calls")];
    } else if (answer.case === "response") {
      slot.authorized = [context, answer.value];
    } else {
      slot.authorized = [context, new RpcError(answer.value.code || "UNKNOWN", answer.value.message)];
    }
  }
}

/** The slots to run, in the model's order: consecutive concurrent calls together, any other alone. */
function groups(slots: readonly Slot[]): Slot[][] {
  const out: Slot[][] = [];
  for (const slot of slots) {
    if (slot.call === undefined || slot.authorized === undefined) continue;
    const last = out.at(-1);
    if (slot.concurrent && last !== undefined && last.every((s) => s.concurrent)) last.push(slot);
    else out.push([slot]);
  }
  return out;
}
