/**
 * What the runtime vouches for (the trusted context) and what the model proposed (a
 * call). The trusted context comes from the runtime's own authenticated session and is
 * frozen: nothing here reads a tenant, a principal or a request id from a model's
 * arguments, and no API would let it.
 */
import { InvalidInputError, type JsonValue, parseStrictJson } from "./json.js";

// The sidecar's allow-lists (toolauthz/model.py); `$` without the `m` flag ends the input.
export const TENANT = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
/** A tool's name: MCP's tool-name characters, 1 to 128 of them (toolauthz/model.py TOOL_NAME). */
export const TOOL_NAME = /^[A-Za-z0-9_.-]{1,128}$/;
export const PRINCIPAL_TYPE = /^[A-Za-z_][A-Za-z0-9_]{0,63}$/;
export const PRINCIPAL_ID = /^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,255}$/;
export const CALL_ID = /^[A-Za-z0-9][A-Za-z0-9._:-]{0,255}$/;
export const REQUEST_ID = CALL_ID;

export class Principal {
  constructor(readonly type: string, readonly id: string) {
    require(type, PRINCIPAL_TYPE, "principal type");
    require(id, PRINCIPAL_ID, "principal id");
    Object.freeze(this);
  }

  toString(): string {
    return `${this.type}::"${this.id}"`;
  }
}

/** Cedar entities the runtime vouches for one call, from its OWN store (or none). */
export type EntitiesProvider = (call: ProposedCall) => unknown[] | null | undefined
  | Promise<unknown[] | null | undefined>;

/**
 * The runtime's authenticated session for one model run. `tenant` and `principal` say
 * who the run acts for; `requestId` names the run (per-run limits count by it).
 * Build it from your session, never from model output.
 */
export class TrustedContext {
  constructor(readonly tenant: string, readonly principal: Principal, readonly requestId: string,
              readonly entities?: EntitiesProvider) {
    if (!(principal instanceof Principal)) throw new TypeError("principal must be a Principal");
    require(tenant, TENANT, "tenant");
    require(requestId, REQUEST_ID, "request_id");
    if (entities !== undefined && typeof entities !== "function") {
      throw new TypeError("entities must be a function of the proposed call");
    }
    Object.freeze(this);
  }
}

/**
 * One tool call as the model proposed it: untrusted, except `callId` (the provider's
 * tool-use id). `inputJson` is the exact argument bytes; `arguments` their strict parse,
 * or undefined when they do not parse (the sidecar will deny such a call).
 */
export class ProposedCall {
  readonly inputJson: Uint8Array;
  readonly arguments: JsonValue | undefined;

  constructor(readonly callId: string, readonly name: string, input: Uint8Array | string) {
    this.inputJson = rawJson(input);
    let parsed: JsonValue | undefined;
    try {
      parsed = parseStrictJson(this.inputJson);
    } catch (error) {
      if (!(error instanceof InvalidInputError)) throw error;
    }
    this.arguments = parsed;
    Object.freeze(this);
  }
}

/**
 * The model's argument text as bytes, unchanged. A string with a lone surrogate is sent
 * as the WTF-8 bytes it holds (not valid UTF-8), so the sidecar refuses the call instead
 * of this package repairing it into U+FFFD.
 */
export function rawJson(input: Uint8Array | string): Uint8Array {
  if (input instanceof Uint8Array) return new Uint8Array(input);
  if (typeof input !== "string") {
    throw new TypeError("tool arguments must be the raw JSON text (a string or bytes), not a parsed object; "
      + "use JSON.stringify(...) only if your SDK gives you nothing else");
  }
  if (input.isWellFormed()) return new TextEncoder().encode(input);
  return wtf8(input);
}

function wtf8(text: string): Uint8Array {
  const out: number[] = [];
  for (let i = 0; i < text.length; i++) {
    const code = text.codePointAt(i)!;
    if (code > 0xffff) i++;
    if (code >= 0xd800 && code <= 0xdfff) {  // a lone surrogate: its 3-byte form, invalid UTF-8 on purpose
      out.push(0xe0 | (code >> 12), 0x80 | ((code >> 6) & 0x3f), 0x80 | (code & 0x3f));
    } else {
      out.push(...new TextEncoder().encode(String.fromCodePoint(code)));
    }
  }
  return Uint8Array.from(out);
}

export function checkCallId(callId: string): void {
  require(callId, CALL_ID, "call_id");
}

function require(value: unknown, pattern: RegExp, what: string): void {
  if (typeof value !== "string" || value === "") throw new TypeError(`missing ${what}`);
  if (!pattern.test(value)) throw new TypeError(`${what} must match \`${pattern.source}\``);
}
