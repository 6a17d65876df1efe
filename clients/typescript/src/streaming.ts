/**
 * Streamed tool calls of a model API, assembled for the Guard (the rules of
 * toolauthz/client/streaming.py; tests/conformance/sdk/streams.json checks both SDKs).
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
import { type Answer, CallAssembly } from "./assembly.js";

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
