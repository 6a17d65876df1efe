"""The tool loop, in the shape of the Messages API client-executed tool loop.

* the assistant's content is appended verbatim (every block, not the extracted text);
* every tool_use of one turn gets a tool_result, and all of them go back in ONE user
  message; a refused call is an `is_error` result, never dropped;
* limits are enforced here, outside the model, and the result says which one ended
  the run: `max_steps` (model calls; the first call is step 1) or `max_tool_calls`.
  When a limit is reached, the calls of that last turn are answered "not executed"
  rather than run: no further model step would read their results.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.client import Guard


@dataclass
class LoopResult:
    messages: list[dict]
    steps: int
    stopped_by: str  # end_turn, max_steps or max_tool_calls
    tool_calls: int


def not_executed(call_id: str, why: str) -> dict:
    return {"type": "tool_result", "tool_use_id": call_id, "is_error": True,
            "content": f"Not executed: {why}."}


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
        results = []
        for block in response.content:
            if block.get("type") != "tool_use":
                continue
            if not stopped and calls >= max_tool_calls:
                stopped = "max_tool_calls"
            if stopped:
                why = ("the run reached its step limit" if stopped == "max_steps"
                       else "the run reached its tool-call limit")
                result = not_executed(block["id"], why)
                if on_result:
                    on_result(block, None, result)
                results.append(result)
                continue
            calls += 1
            raw = response.raw_arguments.get(block["id"])
            if raw is None:  # a non-streaming SDK gives only the parsed input
                raw = json.dumps(block["input"])
            outcome = guard.run(block["id"], block["name"], raw)
            result = outcome.to_tool_result()
            if on_result:
                on_result(block, outcome, result)
            results.append(result)
        messages.append({"role": "user", "content": results})
        if stopped:
            return LoopResult(messages, step, stopped, calls)
    return LoopResult(messages, max_steps, "max_steps", calls)  # unreachable: the last step stops above
