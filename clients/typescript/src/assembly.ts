/**
 * Tool calls put together from streamed argument fragments, strictly (the rules of
 * toolauthz/client/assembly.py, checked by tests/conformance/sdk/streams.json).
 *
 * Model APIs stream a call's arguments as fragments of JSON text. `CallAssembly` keeps
 * them by the stream's own key (a content block index, a tool-call index, an item id),
 * bounded, and hands a call over only when its block has ended: never a prefix that
 * happens to parse. Every block gets exactly one answer, in the order blocks end:
 *
 * - arguments above the tool's `maxInputBytes` are refused as they pass it (`input_too_large`);
 * - a call id used twice: handed over again only with byte-identical arguments (the Guard
 *   then replays the first result), else `call_id_reused`;
 * - an unusable call id: `invalid_call_id`; more than `maxCalls` blocks: `too_many_calls`;
 * - the stream ends with a call open: `stream_incomplete`;
 * - a fragment for a block never opened or already ended, or a block opened twice,
 *   breaks the stream: every open and every later call is refused `stream_broken`.
 */
import { checkCallId, rawJson } from "./context.js";

export const DEFAULT_MAX_INPUT_BYTES = 65536; // the sidecar's default `limits.max_input_bytes`
export const MAX_CALLS = 64; // one turn's batch
const MAX_NAME_CHARS = 256;
const MAX_PROBLEMS = 16;
const TOOL_NAME = /^[A-Za-z][A-Za-z0-9_.-]{0,63}$/;

export const REFUSALS: Readonly<Record<string, string>> = Object.freeze({
  input_too_large: "The call's arguments are larger than this tool accepts; it was not executed.",
  invalid_call_id: "The call has an unusable id and was not executed.",
  call_id_reused: "This call id was already used for a different call; it was not executed.",
  stream_incomplete: "The call's arguments did not finish streaming; it was not executed.",
  stream_broken: "The response stream was malformed; the call was not executed.",
  stream_mismatch: "The call's streamed arguments disagree with its final arguments; it was not executed.",
  too_many_calls: "Too many tool calls were proposed at once; this one was not executed.",
});

/** A call whose block ended: the exact argument bytes the model sent, for the Guard. */
export interface AssembledCall {
  callId: string;
  name: string;
  inputJson: Uint8Array;
}

/** A call the assembly refused: never authorized, never run (`Guard.runTurn` takes it as is). */
export interface RefusedCall {
  callId: string;
  name: string;
  refused: string;
  content: string;
}

export type Answer = AssembledCall | RefusedCall;
export type Key = string | number;

class Open {
  chunks: Uint8Array[] = [];
  size = 0;
  refused = "";
  constructor(readonly callId: string, readonly name: string, readonly limit: number) {}

  bytes(): Uint8Array {
    return Buffer.concat(this.chunks);
  }
}

export class CallAssembly {
  readonly problems: string[] = [];
  broken = false;
  private blocks = 0;
  private readonly open_ = new Map<Key, Open>();
  private readonly ended = new Set<Key>();
  private readonly finished = new Map<string, Uint8Array | null>(); // call id -> its arguments (null: refused)
  private readonly limitOf: (name: string) => number | undefined;
  private readonly defaultLimit: number;
  private readonly maxCalls: number;

  constructor(limits: Readonly<Record<string, number>> | ((name: string) => number | undefined) = {},
              options: { defaultMaxInputBytes?: number; maxCalls?: number } = {}) {
    this.limitOf = typeof limits === "function" ? limits : (name) => (Object.hasOwn(limits, name) ? limits[name] : undefined);
    this.defaultLimit = options.defaultMaxInputBytes ?? DEFAULT_MAX_INPUT_BYTES;
    this.maxCalls = options.maxCalls ?? MAX_CALLS;
  }

  /** A call's block starts. */
  open(key: Key, callId: string, name: string): Answer[] {
    if (this.open_.has(key) || this.ended.has(key)) return this.fail(`block ${JSON.stringify(key)} opened twice`);
    const safeName = typeof name === "string" ? name.slice(0, MAX_NAME_CHARS) : "";
    const call = new Open(typeof callId === "string" ? callId : "", safeName, this.limit(safeName));
    this.open_.set(key, call);
    this.blocks++;
    if (this.broken) return this.refuse(call, "stream_broken");
    if (this.blocks > this.maxCalls) return this.refuse(call, "too_many_calls");
    try {
      checkCallId(call.callId);
    } catch {
      return this.refuse(call, "invalid_call_id");
    }
    return [];
  }

  /** Another piece of a call's argument text. */
  append(key: Key, fragment: string | Uint8Array): Answer[] {
    const call = this.open_.get(key);
    if (call === undefined) {
      const why = this.ended.has(key) ? "ended" : "was never opened";
      return this.fail(`a fragment for block ${JSON.stringify(key)}, which ${why}`);
    }
    if (call.refused) return [];
    const piece = rawJson(fragment);
    if (call.size + piece.length > call.limit) return this.refuse(call, "input_too_large");
    call.chunks.push(piece);
    call.size += piece.length;
    return [];
  }

  /** A call's block ended. `final`, when the API repeats the whole arguments, must equal what streamed. */
  end(key: Key, final?: string | Uint8Array): Answer[] {
    const call = this.open_.get(key);
    if (call === undefined) {
      return this.fail(`block ${JSON.stringify(key)} ${this.ended.has(key) ? "ended twice" : "was never opened"}`);
    }
    this.open_.delete(key);
    this.ended.add(key);
    if (call.refused) return [];
    let data = call.bytes();
    if (final !== undefined) {
      const whole = rawJson(final);
      if (data.length > 0 && !Buffer.from(data).equals(whole)) return this.refuse(call, "stream_mismatch");
      if (data.length === 0) {
        if (whole.length > call.limit) return this.refuse(call, "input_too_large");
        data = whole;
      }
    }
    if (data.length === 0) data = new TextEncoder().encode("{}");
    const earlier = this.finished.get(call.callId);
    if (this.finished.has(call.callId) && (earlier === null || !Buffer.from(earlier!).equals(data))) {
      return this.refuse(call, "call_id_reused");
    }
    this.finished.set(call.callId, data);
    return [{ callId: call.callId, name: call.name, inputJson: data }];
  }

  isOpen(key: Key): boolean {
    return this.open_.has(key);
  }

  hasEnded(key: Key): boolean {
    return this.ended.has(key);
  }

  /** The stream ended: a call still open never finished. */
  close(): Answer[] {
    return this.endAll([], "stream_incomplete");
  }

  /** A protocol violation no single call owns: the stream is broken from here on. */
  fail(problem: string): Answer[] {
    if (this.problems.length < MAX_PROBLEMS) this.problems.push(problem.slice(0, 200));
    this.broken = true;
    return this.endAll([], "stream_broken");
  }

  /** Ends every open call (those of `keysFirst` first, in that order), or, with `code`, refuses them with it. */
  endAll(keysFirst: readonly Key[] = [], code?: string): Answer[] {
    const order = keysFirst.filter((key) => this.open_.has(key));
    for (const key of this.open_.keys()) if (!order.includes(key)) order.push(key);
    const answers: Answer[] = [];
    for (const key of order) {
      if (code === undefined) {
        answers.push(...this.end(key));
        continue;
      }
      const call = this.open_.get(key)!;
      this.open_.delete(key);
      this.ended.add(key);
      if (!call.refused) answers.push(...this.refuse(call, code));
    }
    return answers;
  }

  private limit(name: string): number {
    const limit = TOOL_NAME.test(name) ? this.limitOf(name) : undefined;
    return typeof limit === "number" && Number.isInteger(limit) && limit > 0 ? limit : this.defaultLimit;
  }

  private refuse(call: Open, code: string): Answer[] {
    call.refused = code;
    call.chunks = []; // a refused call's text is never kept
    if (!this.finished.has(call.callId)) this.finished.set(call.callId, null);
    return [{ callId: call.callId, name: call.name, refused: code, content: REFUSALS[code]! }];
  }
}
