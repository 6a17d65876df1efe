"""`toolauthz mcp-proxy`: an MCP gateway in front of one or more upstream MCP servers, which
shows and runs only the upstream tools the bundle's catalog pinned, each call guarded by the
sidecar through the SDK (toolauthz.client). It loads no policy engine and no bundle
loader: it reads the tool files (toolauthz.files.tools) for the pins and output schemas."""
