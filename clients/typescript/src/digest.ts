/**
 * The call digest: what a token is bound to. docs/digest.md is the cross-language
 * specification; tests/conformance/sdk/digests.json holds the vectors both SDKs check.
 *
 *     digest = lowercase_hex(SHA-256("toolauthz/call/v1\n" || JCS(call)))
 *
 * JCS is RFC 8785, by the maintained `canonicalize` package (never hand-rolled): keys
 * sorted by UTF-16 code units, numbers as ECMAScript writes them, minimal escapes.
 */
import { createHash } from "node:crypto";

import canonicalize from "canonicalize";

import { InvalidInputError, type JsonValue, MAX_DEPTH, parseStrictJson, type StrictLimits } from "./json.js";

export const DIGEST_DOMAIN = "toolauthz/call/v1\n";

/** The fields of a call besides its input, all strings. */
export interface CallFields {
  tool: string;
  tenant: string;
  callId: string;
  principalType: string;
  principalId: string;
}

/** RFC 8785 canonical JSON of a JSON value, or InvalidInputError if it has none. */
export function canonicalJson(value: unknown): string {
  checkJsonValue(value, 0);
  let text: string | undefined;
  try {
    text = canonicalize(value);
  } catch {
    throw new InvalidInputError("cannot canonicalize: the value has no RFC 8785 form");
  }
  if (typeof text !== "string") throw new InvalidInputError("cannot canonicalize: not a JSON value");
  return text;
}

/** Lowercase hex SHA-256 binding one exact call; `input` is the strictly parsed value. */
export function callDigest(fields: CallFields, input: JsonValue): string {
  for (const [name, value] of Object.entries(fields)) {
    // A non-string would still canonicalize, to a digest no other runtime expects.
    if (typeof value !== "string") throw new InvalidInputError(`cannot canonicalize: \`${name}\` must be a string`);
  }
  const call = {
    call_id: fields.callId,
    input,
    principal: { type: fields.principalType, id: fields.principalId },
    tenant: fields.tenant,
    tool: fields.tool,
  };
  return createHash("sha256").update(DIGEST_DOMAIN, "utf8").update(canonicalJson(call), "utf8").digest("hex");
}

/** The digest of a call whose arguments are the raw text the model sent: parsed strictly first. */
export function digestOfRaw(fields: CallFields, inputJson: Uint8Array | string, limits?: StrictLimits): string {
  return callDigest(fields, parseStrictJson(inputJson, limits));
}

/**
 * Only what JSON can hold: `canonicalize` would silently drop `undefined` members and
 * call `toJSON` (a Date); a value that differs from what the sidecar parsed must be an
 * error, never a different digest.
 */
function checkJsonValue(value: unknown, depth: number): void {
  if (depth > MAX_DEPTH + 8) throw new InvalidInputError("cannot canonicalize: input nests too deeply");
  if (value === null || typeof value === "boolean" || typeof value === "string") return;
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new InvalidInputError("cannot canonicalize: a number is NaN or infinite");
    return;
  }
  if (Array.isArray(value)) {
    for (const item of value) checkJsonValue(item, depth + 1);
    return;
  }
  if (typeof value === "object") {
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) {
      throw new InvalidInputError("cannot canonicalize: only plain objects are JSON objects");
    }
    for (const item of Object.values(value)) checkJsonValue(item, depth + 1);
    return;
  }
  throw new InvalidInputError(`cannot canonicalize: a ${typeof value} is not a JSON value`);
}
