"""A scripted model: pre-written assistant turns in the Messages API shape, no network.

`ScriptedModel.create(messages=..., tools=...)` returns the next turn, like
`client.messages.create`. Like the real API it refuses a transcript that is not a
coherent history: every tool_use of an assistant turn needs exactly one tool_result in
the very next user message (all of them in that one message), so a loop that drops or
splits results fails loudly here.

Each response also carries `raw_arguments`: the argument JSON text of each tool_use
exactly as the model produced it (what a streaming client accumulates from
`input_json_delta` events). The runtime sends those bytes to the sidecar.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class ModelResponse:
    content: list[dict]
    stop_reason: str  # "tool_use" or "end_turn"
    raw_arguments: dict[str, str] = field(default_factory=dict)


def text(value: str) -> dict:
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str, raw: str) -> tuple[dict, str]:
    try:
        parsed = json.loads(raw)
    except ValueError:
        parsed = {}
    return {"type": "tool_use", "id": call_id, "name": name, "input": parsed}, raw


class TranscriptError(ValueError):
    """What the API would answer with a 400."""


class ScriptedModel:
    def __init__(self, turns: list[list], *, then: Callable[[int], list] | None = None):
        """`turns`: one list per step of text blocks and `tool_use(...)` pairs; after
        them, `then(step)` (if given) makes further turns, else the model ends its turn."""
        self._turns = list(turns)
        self._then = then
        self.steps = 0
        self.received_results: list[list[dict]] = []  # the tool_result blocks seen at each step

    def create(self, *, messages: list[dict], tools: list[dict] | None = None, max_tokens: int = 1024,
               **_) -> ModelResponse:
        self._check(messages)
        if messages and messages[-1]["role"] == "user" and isinstance(messages[-1]["content"], list):
            self.received_results.append([b for b in messages[-1]["content"] if b.get("type") == "tool_result"])
        self.steps += 1
        if self._turns:
            blocks = self._turns.pop(0)
        elif self._then is not None:
            blocks = self._then(self.steps)
        else:
            return ModelResponse([text("I have done what I can for you today.")], "end_turn")
        content, raw = [], {}
        for block in blocks:
            if isinstance(block, tuple):
                block, raw[block["id"]] = block
            content.append(block)
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        return ModelResponse(content, stop, raw)

    @staticmethod
    def _check(messages: list[dict]) -> None:
        for i, message in enumerate(messages):
            if message["role"] != "assistant" or not isinstance(message["content"], list):
                continue
            wanted = [b["id"] for b in message["content"] if b.get("type") == "tool_use"]
            if not wanted:
                continue
            if i + 1 >= len(messages):
                raise TranscriptError("tool_use blocks without a following user message of tool_result blocks")
            reply = messages[i + 1]
            got = [b.get("tool_use_id") for b in reply["content"] if isinstance(reply["content"], list)
                   and b.get("type") == "tool_result"] if reply["role"] == "user" else []
            if sorted(got) != sorted(wanted):
                raise TranscriptError(f"message {i + 1} must answer every tool_use {wanted} exactly once, got {got}")
