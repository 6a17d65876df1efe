/**
 * Tool implementations the Guard may run, with their output contracts.
 *
 *     const tools = new ToolSet();
 *     tools.register("lookup_order", async (args, call) => store.get(args.order_id));
 *
 * An implementation takes `(args, call)`: `args` is the strict parse of the exact bytes
 * that were authorized and verified; `call` carries the trusted context (identity lives
 * there, never in `args`), the call id (an idempotency key downstream), an AbortSignal
 * that aborts when the call is cancelled or its deadline passes, and the deadline.
 * Throw `ToolError(code, message)` for an expected failure whose message the model may
 * see; anything else becomes `failed/execution_error` with a fixed text.
 */
import { createHash } from "node:crypto";

import type { TrustedContext } from "./context.js";
import { canonicalJson } from "./digest.js";
import type { JsonValue } from "./json.js";

export const DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024;
const CODE = /^[a-z][a-z0-9_]{0,63}$/;

export class ToolError extends Error {
  constructor(readonly code: string, message: string) {
    if (!CODE.test(code)) throw new TypeError(`tool error code must match \`${CODE.source}\``);
    super(message.slice(0, 500));
    this.name = "ToolError";
  }
}

export interface ToolInvocation {
  readonly callId: string; // the provider's tool-use id: the idempotency key downstream
  readonly name: string;
  readonly context: TrustedContext;
  readonly signal: AbortSignal; // aborts when the call is cancelled or its deadline passes
  readonly deadline: number; // Date.now() milliseconds by which the tool should have returned
  readonly decisionId: string;
  readonly approvalId: string;
}

export type ToolFunction = (args: JsonValue, call: ToolInvocation) => unknown;
/** A problem with a tool's output (for operators: a pointer and a keyword, never a value), or undefined. */
export type OutputCheck = (output: unknown) => string | undefined;

export interface ToolOptions {
  timeoutMs?: number; // default: the Guard's executionTimeoutMs
  /** A validator of the output (e.g. compiled from the tool's output_schema); its problem withholds the output. */
  checkOutput?: OutputCheck;
  /** Calls of this tool commute (reads): a turn may run them at the same time. */
  concurrent?: boolean;
}

export class OutputProblem extends Error {}

export class Tool {
  constructor(readonly name: string, readonly fn: ToolFunction, readonly options: ToolOptions,
              readonly maxOutputBytes: number) {
    Object.freeze(this);
  }

  get concurrent(): boolean {
    return this.options.concurrent ?? false;
  }

  /** [model-visible content, sha256 hex of the canonical output], or OutputProblem. */
  checkOutput(output: unknown): [string, string] {
    let canonical: string;
    try {
      canonical = canonicalJson(output); // NaN, undefined, a BigInt, a cycle: not a JSON value
    } catch {
      throw new OutputProblem("the output is not a JSON value");
    }
    const text = typeof output === "string" ? output : JSON.stringify(output);
    if (Buffer.byteLength(text, "utf8") > this.maxOutputBytes) {
      throw new OutputProblem(`the output is larger than ${this.maxOutputBytes} bytes`);
    }
    const problem = this.options.checkOutput?.(output);
    if (problem !== undefined) throw new OutputProblem(problem);
    return [text, createHash("sha256").update(canonical, "utf8").digest("hex")];
  }
}

/** The implementations a Guard may run, by tool name (reusable across runs). */
export class ToolSet {
  private readonly tools = new Map<string, Tool>();

  constructor(private readonly maxOutputBytes: number = DEFAULT_MAX_OUTPUT_BYTES) {}

  register(name: string, fn: ToolFunction, options: ToolOptions = {}): Tool {
    if (this.tools.has(name)) throw new TypeError(`tool \`${name}\` is already registered`);
    if (typeof fn !== "function") throw new TypeError(`tool \`${name}\` must be a function of (args, call)`);
    const tool = new Tool(name, fn, { ...options }, this.maxOutputBytes);
    this.tools.set(name, tool);
    return tool;
  }

  get(name: string): Tool | undefined {
    return this.tools.get(name);
  }

  has(name: string): boolean {
    return this.tools.has(name);
  }

  get names(): string[] {
    return [...this.tools.keys()].sort();
  }
}
