"""Streamed tool calls of the major model APIs, assembled for the Guard.

    assembler = AnthropicToolStream(input_limits("policies"))   # client/schemas.py
    for event in stream:                       # the SDK's events, or their dicts
        for answer in assembler.feed(event):
            results.append(guard.run_assembled(answer))
    for answer in assembler.close():           # the stream ended: open calls are refused
        results.append(guard.run_assembled(answer))

One class per API shape, each feeding `CallAssembly` (client/assembly.py, the rules):

* `AnthropicToolStream`, the Messages API: `content_block_start` with a `tool_use` block
  opens a call keyed by the block's index; `input_json_delta` appends `partial_json`;
  `content_block_stop` ends it. Blocks the provider runs itself (`server_tool_use`,
  `mcp_tool_use`, `web_search_tool_result`, any block type other than the four below)
  are tracked and ignored, their `input_json_delta`s too: they are not calls this
  runtime executes, and client tool calls after them in the turn are assembled as usual.
  Text and thinking blocks carry no arguments: an `input_json_delta` for one breaks the
  stream.
* `ChatCompletionsToolStream`, OpenAI Chat Completions: `choices[].delta.tool_calls[]`
  fragments keyed by (choice, `index`); the first names `id` and `function.name`, a later
  one that names another id breaks the stream. A choice's `finish_reason` ends its calls
  (`tool_calls`, `stop`, `function_call`), or refuses them `stream_incomplete` (`length`,
  `content_filter`: the arguments were cut off).
* `ResponsesToolStream`, the OpenAI Responses API: `response.output_item.added` with a
  `function_call` item opens a call keyed by the item id (`call_id` is the call's id, the
  item id is kept beside it); `response.function_call_arguments.delta` appends;
  `.done` (or `response.output_item.done`) ends it, and its full `arguments` must equal
  what was streamed. `response.failed` / `response.incomplete` refuse the open calls.

Events may be mappings or SDK objects (anything with `model_dump()`).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping
from typing import Any

from toolauthz.client.assembly import Answer, CallAssembly

__all__ = ["AnthropicToolStream", "ChatCompletionsToolStream", "ResponsesToolStream"]

_ENDED_WELL = ("tool_calls", "stop", "function_call")
# The Messages API's blocks that are not run on the provider's side: a client tool call
# and the blocks that never carry arguments. Every other block type is the provider's.
_CLIENT_TOOL_BLOCK = "tool_use"
_ARGUMENTLESS_BLOCKS = frozenset({"text", "thinking", "redacted_thinking"})


def _plain(event: Any) -> Mapping[str, Any]:
    if isinstance(event, Mapping):
        return event
    dump = getattr(event, "model_dump", None)
    if callable(dump):
        value = dump()
        if isinstance(value, Mapping):
            return value
    return {}


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, Mapping) else None


class _ToolStream:
    def __init__(self, limits: Any = None, **options: Any):
        self.assembly = CallAssembly(limits, **options)

    @property
    def problems(self) -> list[str]:
        return self.assembly.problems

    def close(self) -> list[Answer]:
        """The stream ended (or was abandoned): every call still open is refused."""
        return self.assembly.close()


class AnthropicToolStream(_ToolStream):
    """The Messages API's stream events (`tool_use` content blocks)."""

    def __init__(self, limits: Any = None, **options: Any):
        super().__init__(limits, **options)
        self._other_blocks: set[Hashable] = set()  # text and thinking
        self._server_blocks: set[Hashable] = set()  # run by the provider: tracked, ignored

    def feed(self, event: Any) -> list[Answer]:
        e = _plain(event)
        kind, index = e.get("type"), e.get("index")
        if kind == "content_block_start":
            block = _get(e, "content_block") or {}
            block_type = _get(block, "type")
            if self._seen(index):  # a tool block opened over a server block would run with no arguments
                return self.assembly.fail(f"block {index!r} opened twice")
            if block_type != _CLIENT_TOOL_BLOCK:
                blocks = self._other_blocks if block_type in _ARGUMENTLESS_BLOCKS else self._server_blocks
                blocks.add(index)
                return []
            answers = self.assembly.open(index, _get(block, "id"), _get(block, "name"))
            start = _get(block, "input")
            if isinstance(start, Mapping) and start and self.assembly.is_open(index):
                # A block that arrives whole: its input is the arguments (rare in streams).
                answers += self.assembly.append(index, json.dumps(start, ensure_ascii=False, separators=(",", ":")))
            return answers
        if kind == "content_block_delta":
            if index in self._server_blocks:
                return []
            delta = _get(e, "delta") or {}
            if _get(delta, "type") != "input_json_delta":
                return [] if index in self._other_blocks or self.assembly.is_open(index) else \
                    self.assembly.fail(f"a delta for block {index!r}, which was never opened")
            if index in self._other_blocks:
                return self.assembly.fail(f"arguments for block {index!r}, which is not a tool call")
            fragment = _get(delta, "partial_json")
            if not isinstance(fragment, str):
                return self.assembly.fail(f"block {index!r}: `partial_json` is not a string")
            return self.assembly.append(index, fragment)
        if kind == "content_block_stop":
            if index in self._other_blocks or index in self._server_blocks:
                return []
            return self.assembly.end(index)
        if kind == "message_stop":
            return self.close()
        return []

    def _seen(self, index: Hashable) -> bool:
        return (index in self._other_blocks or index in self._server_blocks or self.assembly.is_open(index)
                or self.assembly.has_ended(index))


class ChatCompletionsToolStream(_ToolStream):
    """OpenAI Chat Completions chunks (`choices[].delta.tool_calls[]`)."""

    def __init__(self, limits: Any = None, **options: Any):
        super().__init__(limits, **options)
        self._ids: dict[tuple[Any, Any], str] = {}

    def feed(self, chunk: Any) -> list[Answer]:
        answers: list[Answer] = []
        for choice in _plain(chunk).get("choices") or []:
            choice = _plain(choice)
            number = choice.get("index", 0)
            for fragment in _get(choice.get("delta") or {}, "tool_calls") or []:
                answers += self._fragment(number, _plain(fragment))
            reason = choice.get("finish_reason")
            if reason:
                keys = sorted((k for k in self._ids if k[0] == number), key=lambda k: k[1])
                if reason in _ENDED_WELL:
                    answers += self.assembly.end_all([k for k in keys if self.assembly.is_open(k)])
                else:
                    answers += self.assembly.end_all([k for k in keys if self.assembly.is_open(k)],
                                                     code="stream_incomplete")
        return answers

    def _fragment(self, number: Any, f: Mapping[str, Any]) -> list[Answer]:
        key = (number, f.get("index"))
        function = f.get("function") or {}
        call_id = f.get("id")
        answers: list[Answer] = []
        if key not in self._ids:
            if not call_id:
                return self.assembly.fail(f"a fragment for tool call {key!r}, which was never opened")
            self._ids[key] = call_id
            answers += self.assembly.open(key, call_id, _get(function, "name") or "")
        elif call_id and call_id != self._ids[key]:
            return self.assembly.fail(f"tool call {key!r} changed its id")
        arguments = _get(function, "arguments")
        if arguments:
            if not isinstance(arguments, str):
                return answers + self.assembly.fail(f"tool call {key!r}: `arguments` is not a string")
            answers += self.assembly.append(key, arguments)
        return answers


class ResponsesToolStream(_ToolStream):
    """OpenAI Responses API events (`function_call` output items)."""

    def feed(self, event: Any) -> list[Answer]:
        e = _plain(event)
        kind = e.get("type")
        if kind == "response.output_item.added":
            item = _plain(e.get("item") or {})
            if item.get("type") != "function_call":
                return []
            key = item.get("id") or ("output", e.get("output_index"))
            answers = self.assembly.open(key, item.get("call_id") or "", item.get("name") or "",
                                         item_id=str(item.get("id") or ""))
            initial = item.get("arguments")
            if isinstance(initial, str) and initial and self.assembly.is_open(key):
                answers += self.assembly.append(key, initial)
            return answers
        if kind == "response.function_call_arguments.delta":
            delta = e.get("delta")
            if not isinstance(delta, str):
                return self.assembly.fail("a function call delta without text")
            return self.assembly.append(self._key(e), delta)
        if kind == "response.function_call_arguments.done":
            return self._end(self._key(e), e.get("arguments"))
        if kind == "response.output_item.done":
            item = _plain(e.get("item") or {})
            if item.get("type") != "function_call":
                return []
            key = item.get("id") or ("output", e.get("output_index"))
            if self.assembly.has_ended(key):
                return []  # already ended by `.done`; the item repeats it
            return self._end(key, item.get("arguments"))
        if kind in ("response.failed", "response.incomplete", "error"):
            return self.assembly.end_all(code="stream_incomplete")
        if kind == "response.completed":
            return self.close()
        return []

    def _key(self, e: Mapping[str, Any]) -> Hashable:
        return e.get("item_id") or ("output", e.get("output_index"))

    def _end(self, key: Hashable, final: Any) -> list[Answer]:
        if final is not None and not isinstance(final, str):
            return self.assembly.fail(f"item {key!r}: `arguments` is not a string")
        return self.assembly.end(key, final=final)
