"""The tool loop, in the shape of the Messages API client-executed tool loop.

* the assistant's content is appended verbatim (every block, not the extracted text);
* every tool_use of one turn gets a tool_result, and all of them go back in ONE user
  message, in the model's order; a refused call is an `is_error` result, never dropped;
* the calls of one turn go to `Guard.run_turn`: one AuthorizeBatch, the read-only ones
  run together, the others one at a time in the model's order;
* limits are enforced here, outside the model, and the result says which one ended
  the run: `max_steps` (model calls; the first call is step 1) or `max_tool_calls`.
  When a limit is reached, the calls of that last turn are answered "not executed"
  rather than run: no further model step would read their results.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from toolauthz.client import Guard


@dataclass
class LoopResult:
    messages: list[dict]
    steps: int
    stopped_by: str  # end_turn, max_steps or max_tool_calls
    tool_calls: int


def not_executed(call_id: str, why: str) -> dict:
    return {"type": "tool_result", "tool_use_id": call_id, "is_error": True,
            "content": f"Not executed: {why}."}


def _raw(response, block: dict) -> str:
    raw = response.raw_arguments.get(block["id"])
    return raw if raw is not None else json.dumps(block["input"])  # a non-streaming SDK gives only the input


def run_agent(model, guard: Guard, messages: list[dict], *, tools: list[dict], max_steps: int = 8,
              max_tool_calls: int = 20, on_step: Callable | None = None,
              on_result: Callable | None = None) -> LoopResult:
    calls = 0
    for step in range(1, max_steps + 1):
        response = model.create(messages=messages, tools=tools, max_tokens=1024)
        messages.append({"role": "assistant", "content": response.content})
        if on_step:
            on_step(step, response)
        if response.stop_reason != "tool_use":
            return LoopResult(messages, step, "end_turn", calls)
        stopped = "max_steps" if step == max_steps else ""
        blocks = [block for block in response.content if block.get("type") == "tool_use"]
        results: list[dict | None] = [None] * len(blocks)
        turn = []  # (position, block) of the calls this turn sends to the Guard
        for position, block in enumerate(blocks):
            if not stopped and calls >= max_tool_calls:
                stopped = "max_tool_calls"
            if stopped:
                why = ("the run reached its step limit" if stopped == "max_steps"
                       else "the run reached its tool-call limit")
                results[position] = not_executed(block["id"], why)
                if on_result:
                    on_result(block, None, results[position])
                continue
            calls += 1
            turn.append((position, block))
        # One AuthorizeBatch for the turn; read-only lookups may run together, refunds in
        # the model's order; one result per call, in order, a refusal being its error result.
        outcomes = guard.run_turn([(b["id"], b["name"], _raw(response, b)) for _, b in turn])
        for (position, block), outcome in zip(turn, outcomes, strict=True):
            results[position] = outcome.to_tool_result()
            if on_result:
                on_result(block, outcome, results[position])
        messages.append({"role": "user", "content": [r for r in results if r is not None]})
        if stopped:
            return LoopResult(messages, step, stopped, calls)
    return LoopResult(messages, max_steps, "max_steps", calls)  # unreachable: the last step stops above
