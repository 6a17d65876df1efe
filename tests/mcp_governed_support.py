"""An upstream MCP server with tools, resources, a resource template and prompts, and the
catalog entries and policies that govern them: for the gateway's resource and prompt
tests and its per-user lists."""

from __future__ import annotations

import pathlib
import warnings
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.shared.exceptions import MCPError

from examples.mcp_gateway.upstream import TOOLS

RESOURCE_FILES = {
    "readme.yaml": """name: readme
description: The notes index.
side_effect: read
input_schema:
  $schema: https://json-schema.org/draft/2020-12/schema
  type: object
  properties: {uri: {type: string, const: "note://readme"}}
  required: [uri]
  additionalProperties: false
resource: {type: Doc, id: /uri}
audit: {record: [/uri]}
mcp: {kind: resource, uri: "note://readme"}
""",
    "note_file.yaml": """name: note_file
description: One note as a file.
side_effect: read
input_schema:
  $schema: https://json-schema.org/draft/2020-12/schema
  type: object
  properties: {uri: {type: string, pattern: "^note://notes/[an][0-9]{1,6}$"}}
  required: [uri]
  additionalProperties: false
resource: {type: Doc, id: /uri}
audit: {record: [/uri]}
mcp: {kind: resource_template, uri_template: "note://notes/{id}"}
""",
    "summarize.yaml": """name: summarize
description: Summarize the notes on a topic.
side_effect: read
input_schema:
  $schema: https://json-schema.org/draft/2020-12/schema
  type: object
  properties: {topic: {type: string, maxLength: 100}}
  required: [topic]
  additionalProperties: false
mcp: {kind: prompt}
""",
}

POLICIES = """@id("everyone-reads-the-index")
permit (principal, action == Action::"tool:readme", resource);

@id("alice-reads-note-files")
permit (principal == User::"alice", action == Action::"tool:note_file", resource);

@id("archived-files-are-sealed")
forbid (principal, action == Action::"tool:note_file", resource)
when { context.input.uri like "note://notes/a*" };

@id("alice-summarizes")
permit (principal == User::"alice", action == Action::"tool:summarize", resource);

@id("carol-reads-note-files-once-approved")
@approval("editors")
permit (principal == User::"carol", action == Action::"tool:note_file", resource);

@id("editors-approve-note-files")
permit (principal in Group::"editors", action == Action::"approve", resource is Approval)
when { resource.group == "editors" && resource.tool == "note_file" };

@id("bob-deletes-nothing")
forbid (principal == User::"bob", action == Action::"tool:delete_note", resource);
"""


def govern(bundle: pathlib.Path) -> pathlib.Path:
    """Adds the resource and prompt entries and their policies to a copy of the example bundle."""
    for name, text in RESOURCE_FILES.items():
        (bundle / "tools" / name).write_text(text)
    (bundle / "governed.cedar").write_text(POLICIES)
    schema = bundle / "schema.cedarschema"
    schema.write_text(schema.read_text() + "entity Doc in [Tenant];\n")
    return bundle


class RichUpstream:
    """The example's tools plus resources and prompts; `reads` and `gets` record what
    reached it. It also offers what the catalog does not have (`note://secret`, `leak`)."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        self.subscribed: list[str] = []
        self.gets: list[tuple[str, dict[str, str]]] = []
        self.readme_description = "The notes index."
        self.holding, self.release = anyio.Event(), anyio.Event()  # `n8` holds its call open until released
        self.cancelled = anyio.Event()
        self.server: Server[Any] = Server(
            "rich", version="9.9.9", instructions="Notes live under note://.",
            on_list_tools=self._tools, on_call_tool=self._call,
            on_list_resources=self._resources, on_list_resource_templates=self._templates,
            on_read_resource=self._read, on_list_prompts=self._prompts, on_get_prompt=self._get,
            on_completion=self._complete, on_subscribe_resource=self._subscribe)

    async def _tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        tools = [t.model_copy(deep=True) for t in TOOLS]
        for tool in tools:
            if tool.name == "delete_note":
                tool.annotations = types.ToolAnnotations(read_only_hint=False, destructive_hint=True,
                                                         idempotent_hint=True, open_world_hint=False)
        return types.ListToolsResult(tools=tools)

    async def _call(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        if ctx.meta and ctx.meta.get("progress_token") is not None:
            await ctx.session.send_progress_notification(ctx.meta["progress_token"], 1, total=2, message="half",
                                                         related_request_id=ctx.request_id)
        text = "buy milk"
        if args.get("note_id") == "n7":  # logs, and says two resources changed
            with warnings.catch_warnings():  # logging: deprecated as of 2026-07-28, still 2025-11-25's
                warnings.simplefilter("ignore")
                await ctx.session.send_log_message(level="info", data="working", logger="notes",
                                                   related_request_id=ctx.request_id)
            await ctx.session.send_resource_updated("note://secret")
            await ctx.session.send_resource_updated("note://readme")
        if args.get("note_id") == "n8":
            self.holding.set()
            try:
                await self.release.wait()
            except anyio.get_cancelled_exc_class():
                self.cancelled.set()  # the client's cancellation reached this server
                raise
        if args.get("note_id") == "n6":  # asks the client's user, within this call
            try:
                with warnings.catch_warnings():  # deprecated as of 2026-07-28, still 2025-11-25's way
                    warnings.simplefilter("ignore")
                    asked = await ctx.session.elicit_form(
                        "Which color?", {"type": "object", "properties": {"color": {"type": "string"}}},
                        related_request_id=ctx.request_id)
                text = f"elicited: {asked.action} {(asked.content or {}).get('color')}"
            except MCPError as exc:
                text = f"refused: {exc.error.message}"
        if args.get("note_id") == "n9":  # asks the client's model, within this call
            try:
                with warnings.catch_warnings():  # deprecated as of 2026-07-28, still 2025-11-25's way
                    warnings.simplefilter("ignore")
                    answer = await ctx.session.create_message(
                        [types.SamplingMessage(role="user", content=types.TextContent(text="hi"))], max_tokens=5,
                        related_request_id=ctx.request_id)
                text = f"sampled: {answer.content.text}"
            except MCPError as exc:
                text = f"refused: {exc.error.message}"
        value = {"note_id": args.get("note_id"), "text": text}
        return types.CallToolResult(content=[types.TextContent(text=str(value))], structured_content=value)

    async def _resources(self, ctx: Any, params: Any) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri="note://readme", name="readme", description=self.readme_description,
                           mime_type="text/plain"),
            types.Resource(uri="note://secret", name="secret", description="Not catalogued.")])

    async def _templates(self, ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[
            types.ResourceTemplate(uri_template="note://notes/{id}", name="note", description="One note as a file."),
            types.ResourceTemplate(uri_template="secret://{id}", name="secrets", description="Not catalogued.")])

    async def _read(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        self.reads.append(str(params.uri))
        text = "x" * 70_000 if str(params.uri).endswith("/n5") else f"text of {params.uri}"  # n5: too big
        return types.ReadResourceResult(contents=[
            types.TextResourceContents(uri=str(params.uri), mime_type="text/plain", text=text)])

    async def _prompts(self, ctx: Any, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[
            types.Prompt(name="summarize", description="Summarize the notes on a topic.",
                         arguments=[types.PromptArgument(name="topic", required=True)]),
            types.Prompt(name="leak", description="Not catalogued.")])

    async def _get(self, ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        self.gets.append((params.name, dict(params.arguments or {})))
        topic = (params.arguments or {}).get("topic", "")
        return types.GetPromptResult(description="A summary", messages=[
            types.PromptMessage(role="user", content=types.TextContent(text=f"Summarize the notes about {topic}."))])

    async def _subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        self.subscribed.append(str(params.uri))
        return types.EmptyResult()

    async def _complete(self, ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
        values = [v for v in ("milk", "mail", "music") if v.startswith(params.argument.value)]
        return types.CompleteResult(completion=types.Completion(values=values))


async def _serve_stdio() -> None:
    from mcp.server.stdio import stdio_server

    server = RichUpstream().server
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":  # the upstream as a process: `python tests/mcp_governed_support.py`
    anyio.run(_serve_stdio)
