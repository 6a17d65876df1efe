"""An MCP gateway example: a small upstream MCP server of notes, its bundle, and a script
that drives it through `toolauthz mcp-proxy` with the MCP SDK's client."""
