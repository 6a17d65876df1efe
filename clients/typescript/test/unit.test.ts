/** The pieces without a sidecar: strict parsing, canonical JSON, the context's checks, results. */
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { contextMessage, entitiesJson } from "../src/client.js";
import { Principal, ProposedCall, rawJson, TrustedContext } from "../src/context.js";
import { callDigest, canonicalJson, DIGEST_DOMAIN } from "../src/digest.js";
import { InvalidInputError, parseStrictJson } from "../src/json.js";
import { CallResult, MESSAGES } from "../src/results.js";
import { ToolError, ToolSet } from "../src/tools.js";

describe("strict JSON", () => {
  test("a key __proto__ is an own key, never the prototype", () => {
    const value = parseStrictJson('{"__proto__":{"admin":true}}') as Record<string, unknown>;
    assert.equal(Object.getPrototypeOf(value), Object.prototype);
    assert.equal((value as { admin?: unknown }).admin, undefined);
    assert.deepEqual(Object.keys(value), ["__proto__"]);
  });

  test("size is bounded before parsing, and huge nesting is refused without recursion", () => {
    assert.throws(() => parseStrictJson("[1]", { maxBytes: 2 }), /larger than 2 bytes/);
    assert.throws(() => parseStrictJson("[".repeat(100_000)), /deeper than 64/);
  });

  test("messages name keys escaped, never values", () => {
    assert.throws(() => parseStrictJson('{"a\\u001b[8m":1,"a\\u001b[8m":2}'), (e: InvalidInputError) =>
      e.code === "invalid_input" && !e.message.includes("\u001b") && e.message.includes("duplicate key"));
    assert.throws(() => parseStrictJson('{"secret":"hunter2" "x"}'), (e: Error) => !e.message.includes("hunter2"));
  });
});

describe("canonical JSON", () => {
  test("values JSON cannot hold are errors, never silently changed", () => {
    for (const value of [undefined, { a: undefined }, [1, undefined], new Date(0), 1n, NaN, Infinity, () => 1,
      Symbol("x"), "\ud800", { "\udc00": 1 }, new Map()]) {
      assert.throws(() => canonicalJson(value), InvalidInputError, String(typeof value));
    }
  });

  test("the domain prefix and the field names are part of the digest", () => {
    assert.equal(DIGEST_DOMAIN, "toolauthz/call/v1\n");
    const fields = { tool: "t", tenant: "acme", callId: "c", principalType: "User", principalId: "alice" };
    const base = callDigest(fields, { a: 1 });
    for (const changed of [{ ...fields, tool: "u" }, { ...fields, tenant: "acme2" }, { ...fields, callId: "d" },
      { ...fields, principalType: "Admin" }, { ...fields, principalId: "bob" }]) {
      assert.notEqual(callDigest(changed, { a: 1 }), base);
    }
    assert.throws(() => callDigest({ ...fields, tool: 1 as unknown as string }, {}), InvalidInputError);
  });
});

describe("trusted context and proposed calls", () => {
  test("names must match the sidecar's allow-lists in full", () => {
    for (const tail of ["\n", "\r", "\u0000", "\u200b"]) {
      assert.throws(() => new TrustedContext(`acme${tail}`, new Principal("User", "alice"), "run-1"), TypeError);
      assert.throws(() => new Principal("User", `alice${tail}`), TypeError);
      assert.throws(() => new TrustedContext("acme", new Principal("User", "alice"), `run-1${tail}`), TypeError);
    }
    assert.throws(() => new TrustedContext("acme", { type: "User", id: "alice" } as Principal, "run-1"), TypeError);
    const context = new TrustedContext("acme", new Principal("User", "alice"), "run-1");
    assert.ok(Object.isFrozen(context));
  });

  test("arguments are raw text: a parsed object is refused; a lone surrogate is kept for the sidecar to refuse", () => {
    assert.throws(() => rawJson({ a: 1 } as unknown as string), TypeError);
    assert.deepEqual([...rawJson('"\ud800"')], [0x22, 0xed, 0xa0, 0x80, 0x22]);
    const call = new ProposedCall("c1", "t", '{"a":1,"a":2}');
    assert.equal(call.arguments, undefined); // does not parse strictly: the sidecar will deny it
  });

  test("entities travel as JSON; the batch context carries none", () => {
    const context = new TrustedContext("acme", new Principal("User", "alice"), "run-1");
    assert.equal(contextMessage(context).entitiesJson.length, 0);
    assert.equal(new TextDecoder().decode(entitiesJson([{ uid: { type: "Order", id: "o" } }])),
      '[{"uid":{"type":"Order","id":"o"}}]');
  });
});

describe("results and tools", () => {
  test("every status but completed is an error result, in the provider's shape", () => {
    const pending = new CallResult({ callId: "c1", name: "t", status: "approval_pending", content: "waiting" });
    assert.deepEqual(pending.toToolResult(), { type: "tool_result", tool_use_id: "c1", content: "waiting", is_error: true });
    assert.equal(pending.terminal, false);
    assert.equal(new CallResult({ callId: "c1", name: "t", status: "completed" }).isError, false);
    assert.ok(Object.isFrozen(MESSAGES));
  });

  test("tool error codes are checked, messages bounded; tools are registered once", () => {
    assert.throws(() => new ToolError("Bad Code", "x"), TypeError);
    assert.equal(new ToolError("order_closed", "x".repeat(1000)).message.length, 500);
    const tools = new ToolSet();
    tools.register("t", () => 1);
    assert.throws(() => tools.register("t", () => 2), TypeError);
  });

  test("output: a JSON value within the size limit, checked by the tool's own validator", () => {
    const tools = new ToolSet(16);
    const tool = tools.register("t", () => 1, { checkOutput: (o) => (typeof o === "object" ? undefined : "at `/`: keyword `type`") });
    assert.throws(() => tool.checkOutput({ big: "x".repeat(100) }), /larger than 16 bytes/);
    assert.throws(() => tool.checkOutput("text"), /keyword `type`/);
    assert.throws(() => tool.checkOutput({ n: NaN }), /not a JSON value/);
    const [content, digest] = tool.checkOutput({ b: 1, a: 2 });
    assert.equal(content, '{"b":1,"a":2}');
    assert.match(digest, /^[0-9a-f]{64}$/);
  });
});

describe("layering", () => {
  test("the core imports no framework; adapters import only types from theirs (optional peers)", async () => {
    const { readdirSync, readFileSync } = await import("node:fs");
    const { join } = await import("node:path");
    const { packageRoot } = await import("./support.js");
    const src = join(packageRoot(), "src");
    const frameworks = /from "(ai|ai\/[^"]*|@openai\/agents[^"]*|zod)"/;
    for (const name of readdirSync(src).filter((n) => n.endsWith(".ts"))) {
      assert.doesNotMatch(readFileSync(join(src, name), "utf8"), frameworks, name);
    }
    for (const name of readdirSync(join(src, "adapters"))) {
      for (const line of readFileSync(join(src, "adapters", name), "utf8").split("\n")) {
        if (frameworks.test(line)) assert.match(line, /^import type /, `${name}: ${line}`);
      }
      assert.doesNotMatch(readFileSync(join(src, "adapters", name), "utf8"), /from "\.\.\/adapters/);
    }
    for (const name of ["json.ts", "digest.ts", "context.ts"]) {
      assert.doesNotMatch(readFileSync(join(src, name), "utf8"), /from "\.\/(client|guard|turn|adapters)/, name);
    }
  });
});
