/**
 * Strict parsing of a model's tool arguments, by the sidecar's rules
 * (toolauthz/strict_json.py, docs/digest.md): `JSON.parse` keeps the last of two
 * duplicate keys and rounds integers past 2^53, each of which would let the sidecar and
 * the tool see different arguments. Refused: invalid UTF-8, a byte order mark,
 * duplicate keys, NaN and Infinity (not JSON anyway), `-0` in any spelling, integer
 * literals outside ±(2^53-1), numbers that overflow a double, lone surrogates, nesting
 * deeper than `maxDepth` and input larger than `maxBytes`.
 *
 * Scalars are decoded by `JSON.parse` itself (one token at a time): this module only
 * walks the structure, so the values are exactly what the platform's parser gives.
 */

export const MAX_DEPTH = 64;
export const MAX_ARGUMENT_BYTES = 1 << 20; // the sidecar's own ceiling for Verify
const SAFE_DIGITS = String(Number.MAX_SAFE_INTEGER).length;

/** Input that is not strict JSON; `message` names the problem, never a string value. */
export class InvalidInputError extends Error {
  readonly code = "invalid_input";
  constructor(message: string) {
    super(message);
    this.name = "InvalidInputError";
  }
}

export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
const STRING = /"(?:[^"\\\u0000-\u001f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"/y;
const WHITESPACE = /[ \t\n\r]*/y;
const LITERAL = /true|false|null/y;

export interface StrictLimits {
  maxBytes?: number;
  maxDepth?: number;
}

/** The strict parse of `input` (the exact bytes, or a string encoded as UTF-8). */
export function parseStrictJson(input: Uint8Array | string, limits: StrictLimits = {}): JsonValue {
  const maxBytes = limits.maxBytes ?? MAX_ARGUMENT_BYTES;
  const bytes = typeof input === "string" ? utf8(input) : input;
  if (bytes.length > maxBytes) throw new InvalidInputError(`input is larger than ${maxBytes} bytes`);
  if (bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf) {
    throw new InvalidInputError("input starts with a UTF-8 byte order mark");
  }
  let text: string;
  try {
    text = decoder.decode(bytes);
  } catch {
    throw new InvalidInputError("input is not valid UTF-8");
  }
  return new Parser(text, limits.maxDepth ?? MAX_DEPTH).document();
}

/** A string as UTF-8; a lone surrogate is refused, never silently replaced by U+FFFD. */
export function utf8(text: string): Uint8Array {
  if (!text.isWellFormed()) throw new InvalidInputError("input holds a lone surrogate");
  return new TextEncoder().encode(text);
}

class Parser {
  private at = 0;
  constructor(private readonly text: string, private readonly maxDepth: number) {}

  document(): JsonValue {
    this.space();
    const value = this.value(0);
    this.space();
    if (this.at !== this.text.length) this.fail("unexpected text after the value");
    return value;
  }

  private value(depth: number): JsonValue {
    const c = this.text[this.at];
    if (c === "{" || c === "[") {
      if (depth >= this.maxDepth) throw new InvalidInputError(`input nests deeper than ${this.maxDepth} levels`);
      return c === "{" ? this.object(depth + 1) : this.array(depth + 1);
    }
    if (c === '"') return this.string();
    if (c === "-" || (c !== undefined && c >= "0" && c <= "9")) return this.number();
    const literal = this.token(LITERAL);
    if (literal === undefined) this.fail("expected a value");
    return JSON.parse(literal) as JsonValue;
  }

  private object(depth: number): JsonValue {
    const out: Record<string, JsonValue> = {};
    const seen = new Set<string>();
    this.at++;
    this.space();
    if (this.eat("}")) return out;
    for (;;) {
      this.space();
      if (this.text[this.at] !== '"') this.fail("expected a key");
      const key = this.string();
      if (seen.has(key)) throw new InvalidInputError(`duplicate key \`${showKey(key)}\``);
      seen.add(key);
      this.space();
      if (!this.eat(":")) this.fail("expected `:`");
      this.space();
      // defineProperty: a key `__proto__` is an own property, never the prototype.
      Object.defineProperty(out, key, { value: this.value(depth), enumerable: true, writable: true,
        configurable: true });
      this.space();
      if (this.eat("}")) return out;
      if (!this.eat(",")) this.fail("expected `,` or `}`");
    }
  }

  private array(depth: number): JsonValue {
    const out: JsonValue[] = [];
    this.at++;
    this.space();
    if (this.eat("]")) return out;
    for (;;) {
      this.space();
      out.push(this.value(depth));
      this.space();
      if (this.eat("]")) return out;
      if (!this.eat(",")) this.fail("expected `,` or `]`");
    }
  }

  private string(): string {
    const raw = this.token(STRING);
    if (raw === undefined) this.fail("invalid string");
    const value = JSON.parse(raw) as string;
    if (!value.isWellFormed()) throw new InvalidInputError("a string holds a lone surrogate");
    return value;
  }

  private number(): number {
    const raw = this.token(NUMBER);
    if (raw === undefined) this.fail("invalid number");
    const value = JSON.parse(raw) as number;
    const integer = !/[.eE]/.test(raw);
    if (integer && raw.replace("-", "").length > SAFE_DIGITS) this.outOfRange();
    if (integer && !Number.isSafeInteger(value)) this.outOfRange();
    if (!Number.isFinite(value)) throw new InvalidInputError("a number is too large for a 64-bit float");
    if (Object.is(value, -0)) throw new InvalidInputError("negative zero is not allowed; send 0");
    return value;
  }

  private outOfRange(): never {
    throw new InvalidInputError("an integer is outside ±(2^53-1); send it as a string");
  }

  private token(pattern: RegExp): string | undefined {
    pattern.lastIndex = this.at;
    const found = pattern.exec(this.text);
    if (found === null) return undefined;
    this.at = pattern.lastIndex;
    return found[0];
  }

  private space(): void {
    this.token(WHITESPACE);
  }

  private eat(char: string): boolean {
    if (this.text[this.at] !== char) return false;
    this.at++;
    return true;
  }

  private fail(what: string): never {
    throw new InvalidInputError(`input is not valid JSON: ${what} at offset ${this.at}`);
  }
}

/** A key as a message may show it: controls, backticks and bidi marks escaped, bounded. */
function showKey(key: string): string {
  const shown = key.slice(0, 64).replace(/[\u0000-\u001f\u007f-\u009f`\u200b-\u200f\u202a-\u202e\u2066-\u2069]/gu,
    (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
  return key.length > 64 ? `${shown}…` : shown;
}
