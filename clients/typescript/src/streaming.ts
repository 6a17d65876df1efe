/**
 * Streamed tool calls of the major model APIs, assembled for the Guard (the rules of
 * toolauthz/client/streaming.py; tests/conformance/sdk/streams.json checks both SDKs).
 *
 * `ChatCompletionsToolStream`, OpenAI Chat Completions: `choices[].delta.tool_calls[]`
 * fragments keyed by (choice, `index`); the first names `id` and `function.name`, a later
 * one naming another id breaks the stream. A `finish_reason` of `tool_calls`, `stop` or
 * `function_call` ends the calls; `length` or `content_filter` refuses them.
 *
 * `ResponsesToolStream`, the OpenAI Responses API: `response.output_item.added` with a
 * `function_call` item opens a call keyed by the item id (its `call_id` is the call's id);
 * `response.function_call_arguments.delta` appends; `.done` (or the item's
 * `response.output_item.done`) ends it, and its whole `arguments` must equal what
 * streamed; `response.failed`, `response.incomplete` and `error` refuse the open calls.
 *
 * `AnthropicToolStream`, the Messages API: `content_block_start` with a `tool_use` block
 * opens a call keyed by the block's index; `input_json_delta` appends `partial_json`;
 * `content_block_stop` ends it; `message_stop` closes the stream. Text, thinking and
 * server-tool blocks are ignored, but an `input_json_delta` for one of them breaks the
 * stream.
 *
 *     const stream = new AnthropicToolStream({ issue_refund: 4096 });
 *     for await (const event of modelStream) answers.push(...stream.feed(event));
 *     answers.push(...stream.close());
 *     const results = await guard.runTurn(answers);
 */
import { type Answer, CallAssembly, type Key } from "./assembly.js";

type Event = Record<string, unknown>;

function get(value: unknown, key: string): unknown {
  return typeof value === "object" && value !== null && !Array.isArray(value) ? (value as Event)[key] : undefined;
}

export class AnthropicToolStream {
  readonly assembly: CallAssembly;
  private readonly otherBlocks = new Set<unknown>();

  constructor(limits: ConstructorParameters<typeof CallAssembly>[0] = {}, options: ConstructorParameters<typeof CallAssembly>[1] = {}) {
    this.assembly = new CallAssembly(limits, options);
  }

  get problems(): string[] {
    return this.assembly.problems;
  }

  feed(event: unknown): Answer[] {
    const kind = get(event, "type");
    const index = get(event, "index");
    const key = typeof index === "number" || typeof index === "string" ? index : String(index);
    if (kind === "content_block_start") {
      const block = get(event, "content_block");
      if (get(block, "type") !== "tool_use") {
        this.otherBlocks.add(key);
        return [];
      }
      const id = get(block, "id");
      const name = get(block, "name");
      const answers = this.assembly.open(key, typeof id === "string" ? id : "", typeof name === "string" ? name : "");
      const start = get(block, "input");
      if (typeof start === "object" && start !== null && Object.keys(start).length > 0 && this.assembly.isOpen(key)) {
        // A block that arrives whole: its input is the arguments (rare in streams).
        answers.push(...this.assembly.append(key, JSON.stringify(start)));
      }
      return answers;
    }
    if (kind === "content_block_delta") {
      const delta = get(event, "delta");
      if (get(delta, "type") !== "input_json_delta") {
        return this.otherBlocks.has(key) || this.assembly.isOpen(key) ? []
          : this.assembly.fail(`a delta for block ${JSON.stringify(key)}, which was never opened`);
      }
      if (this.otherBlocks.has(key)) return this.assembly.fail(`arguments for block ${JSON.stringify(key)}, which is not a tool call`);
      const fragment = get(delta, "partial_json");
      if (typeof fragment !== "string") return this.assembly.fail(`block ${JSON.stringify(key)}: \`partial_json\` is not a string`);
      return this.assembly.append(key, fragment);
    }
    if (kind === "content_block_stop") return this.otherBlocks.has(key) ? [] : this.assembly.end(key);
    if (kind === "message_stop") return this.close();
    return [];
  }

  /** The stream ended (or was abandoned): every call still open is refused. */
  close(): Answer[] {
    return this.assembly.close();
  }
}

const ENDED_WELL = ["tool_calls", "stop", "function_call"];
type Limits = ConstructorParameters<typeof CallAssembly>[0];
type Options = ConstructorParameters<typeof CallAssembly>[1];

export class ChatCompletionsToolStream {
  readonly assembly: CallAssembly;
  private readonly ids = new Map<Key, { choice: unknown; index: unknown; callId: string }>();

  constructor(limits: Limits = {}, options: Options = {}) {
    this.assembly = new CallAssembly(limits, options);
  }

  feed(chunk: unknown): Answer[] {
    const answers: Answer[] = [];
    const choices = get(chunk, "choices");
    for (const choice of Array.isArray(choices) ? choices : []) {
      const number = get(choice, "index") ?? 0;
      const fragments = get(get(choice, "delta"), "tool_calls");
      for (const fragment of Array.isArray(fragments) ? fragments : []) answers.push(...this.fragment(number, fragment));
      const reason = get(choice, "finish_reason");
      if (!reason) continue;
      const keys = [...this.ids].filter(([, v]) => v.choice === number)
        .sort(([, a], [, b]) => Number(a.index) - Number(b.index)).map(([key]) => key)
        .filter((key) => this.assembly.isOpen(key));
      answers.push(...this.assembly.endAll(keys, ENDED_WELL.includes(String(reason)) ? undefined : "stream_incomplete"));
    }
    return answers;
  }

  close(): Answer[] {
    return this.assembly.close();
  }

  private fragment(number: unknown, fragment: unknown): Answer[] {
    const index = get(fragment, "index");
    const key = `${String(number)}:${String(index)}`;
    const fn = get(fragment, "function");
    const callId = get(fragment, "id");
    const answers: Answer[] = [];
    const known = this.ids.get(key);
    if (known === undefined) {
      if (typeof callId !== "string" || callId === "") return this.assembly.fail(`a fragment for tool call ${key}, which was never opened`);
      this.ids.set(key, { choice: number, index, callId });
      const name = get(fn, "name");
      answers.push(...this.assembly.open(key, callId, typeof name === "string" ? name : ""));
    } else if (callId && callId !== known.callId) {
      return this.assembly.fail(`tool call ${key} changed its id`);
    }
    const args = get(fn, "arguments");
    if (args) {
      if (typeof args !== "string") return [...answers, ...this.assembly.fail(`tool call ${key}: \`arguments\` is not a string`)];
      answers.push(...this.assembly.append(key, args));
    }
    return answers;
  }
}

export class ResponsesToolStream {
  readonly assembly: CallAssembly;

  constructor(limits: Limits = {}, options: Options = {}) {
    this.assembly = new CallAssembly(limits, options);
  }

  feed(event: unknown): Answer[] {
    const kind = get(event, "type");
    if (kind === "response.output_item.added") {
      const item = get(event, "item");
      if (get(item, "type") !== "function_call") return [];
      const key = itemKey(get(item, "id"), get(event, "output_index"));
      const callId = get(item, "call_id");
      const name = get(item, "name");
      const answers = this.assembly.open(key, typeof callId === "string" ? callId : "", typeof name === "string" ? name : "");
      const initial = get(item, "arguments");
      if (typeof initial === "string" && initial && this.assembly.isOpen(key)) answers.push(...this.assembly.append(key, initial));
      return answers;
    }
    if (kind === "response.function_call_arguments.delta") {
      const delta = get(event, "delta");
      if (typeof delta !== "string") return this.assembly.fail("a function call delta without text");
      return this.assembly.append(itemKey(get(event, "item_id"), get(event, "output_index")), delta);
    }
    if (kind === "response.function_call_arguments.done") {
      return this.end(itemKey(get(event, "item_id"), get(event, "output_index")), get(event, "arguments"));
    }
    if (kind === "response.output_item.done") {
      const item = get(event, "item");
      if (get(item, "type") !== "function_call") return [];
      const key = itemKey(get(item, "id"), get(event, "output_index"));
      return this.assembly.hasEnded(key) ? [] : this.end(key, get(item, "arguments")); // `.done` already ended it
    }
    if (kind === "response.failed" || kind === "response.incomplete" || kind === "error") {
      return this.assembly.endAll([], "stream_incomplete");
    }
    if (kind === "response.completed") return this.close();
    return [];
  }

  close(): Answer[] {
    return this.assembly.close();
  }

  private end(key: Key, final: unknown): Answer[] {
    if (final !== undefined && final !== null && typeof final !== "string") {
      return this.assembly.fail(`item ${key}: \`arguments\` is not a string`);
    }
    return this.assembly.end(key, typeof final === "string" ? final : undefined);
  }
}

/** An output item's key: its id, or else its place in the output (a key no id can spell). */
function itemKey(id: unknown, outputIndex: unknown): Key {
  return typeof id === "string" && id !== "" ? id : `\u0000output:${String(outputIndex)}`;
}
