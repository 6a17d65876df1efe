"""Reading files someone else may have planted: within bounds (bounded), and a bundle's
tool files into mappings (tools), light enough for the client SDK."""
