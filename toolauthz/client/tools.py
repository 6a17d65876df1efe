"""Tool implementations the Guard may run, with their output contracts.

    tools = ToolSet(output_schemas=load_output_schemas("policies"))

    @tools.tool("lookup_order")
    def lookup_order(args, call):      # args: the arguments the sidecar validated
        return store.get(args["order_id"])

An implementation takes `(args, call)`: `args` is the strict parse of the exact bytes
that were authorized and verified; `call` is a `ToolInvocation` carrying the trusted
context (identity lives there, never in `args`), the call id (an idempotency key), a
`cancelled` event and the deadline. A sync Guard runs plain functions; an AsyncGuard
runs coroutine functions, and plain functions in a worker thread.

Raise `ToolError(code, message)` for an expected failure whose message the model may see;
any other exception becomes `failed/execution_error` with a fixed text.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from toolauthz.client.context import TrustedContext
from toolauthz.client.schemas import output_validator_class
from toolauthz.digest import canonical_json
from toolauthz.errors import InputError

__all__ = ["Tool", "ToolSet", "ToolInvocation", "ToolError", "ToolOutcomeUnknown", "DEFAULT_MAX_OUTPUT_BYTES"]

DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
_CODE = re.compile(r"^[a-z][a-z0-9_]{0,63}\Z")


class ToolError(Exception):
    """An expected failure of a tool: `code` is recorded as the outcome's error code and
    `message` is shown to the model, so it must be model-safe."""

    def __init__(self, code: str, message: str):
        if not _CODE.fullmatch(code):
            raise ValueError(f"tool error code must match `{_CODE.pattern}`")
        super().__init__(message)
        self.code = code
        self.message = message[:500]


class ToolOutcomeUnknown(ToolError):
    """The tool's effect is unknown: it may have acted (a remote call whose connection
    dropped after the request was sent). The call ends `outcome_unknown`, never `failed`,
    so nobody retries what may have run."""


@dataclass(frozen=True)
class ToolInvocation:
    call_id: str  # the provider's tool-use id: use it as the idempotency key downstream
    name: str
    context: TrustedContext
    cancelled: threading.Event  # set when the call is cancelled or its deadline passes
    deadline: float  # time.monotonic() by which the tool should have returned
    decision_id: str = ""
    approval_id: str = ""

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


class OutputProblem(Exception):
    def __init__(self, why: str):
        super().__init__(why)
        self.why = why  # operators only: names a pointer and keyword, never a value


@dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    output_schema: Mapping[str, Any] | None = None
    timeout: float | None = None  # seconds; None: the Guard's default
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    validator: Any = field(default=None, repr=False, compare=False)  # of the output schema's own dialect
    # May run at the same time as other such calls of one turn (Guard.run_turn): calls
    # that commute. By default, the tools whose `side_effect` is `read`.
    concurrent: bool = False

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def check_output(self, output: Any) -> tuple[str, str]:
        """(model-visible content, sha256 hex of the output) or OutputProblem."""
        try:
            text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            raise OutputProblem("the output is not a JSON value") from None
        if len(text.encode("utf-8", "surrogatepass")) > self.max_output_bytes:
            raise OutputProblem(f"the output is larger than {self.max_output_bytes} bytes")
        if self.validator is not None:
            error = best_match(self.validator.iter_errors(output))
            if error is not None:
                pointer = "".join(f"/{p}" for p in error.absolute_path)[:200]
                raise OutputProblem(f"output schema: at `{pointer or '/'}`: keyword `{error.validator}`")
        return text, output_digest(output, text)


def output_digest(output: Any, text: str) -> str:
    try:
        data = canonical_json(output)
    except InputError:
        data = text.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()


class ToolSet:
    """The implementations a Guard may run, by tool name (reusable across runs)."""

    def __init__(self, output_schemas: Mapping[str, Mapping[str, Any]] | None = None, *,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, side_effects: Mapping[str, str] | None = None):
        self._schemas = dict(output_schemas or {})
        self._side_effects = dict(side_effects or {})  # by tool name, as `load_side_effects` reads them
        self._max_output_bytes = max_output_bytes
        self._tools: dict[str, Tool] = {}

    def register(self, name: str, fn: Callable[..., Any], *, output_schema: Mapping[str, Any] | None = None,
                 timeout: float | None = None, concurrent: bool | None = None) -> Tool:
        """`concurrent`: whether calls of this tool commute with each other (default: its
        `side_effect` is `read`, from `side_effects`)."""
        if name in self._tools:
            raise ValueError(f"tool `{name}` is already registered")
        try:
            inspect.signature(fn).bind(None, None)
        except TypeError:
            raise TypeError(f"tool `{name}` must take (args, call)") from None
        schema = output_schema if output_schema is not None else self._schemas.get(name)
        validator = None
        if schema is not None:
            dialect = output_validator_class(schema)  # the schema's own dialect
            if dialect is None:
                raise ValueError(f"tool `{name}`: the output schema's `$schema` is not 2020-12, 2019-09 or draft-07")
            dialect.check_schema(schema)
            validator = dialect(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
        if concurrent is None:
            concurrent = self._side_effects.get(name) == "read"
        tool = Tool(name, fn, schema, timeout, self._max_output_bytes, validator, bool(concurrent))
        self._tools[name] = tool
        return tool

    def tool(self, name: str | None = None, *, output_schema: Mapping[str, Any] | None = None,
             timeout: float | None = None, concurrent: bool | None = None):
        """Decorator: `@tools.tool("issue_refund")` (default name: the function's)."""

        def register(fn):
            self.register(name or fn.__name__, fn, output_schema=output_schema, timeout=timeout,
                          concurrent=concurrent)
            return fn

        return register

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    @property
    def names(self) -> list[str]:
        return sorted(self._tools)

