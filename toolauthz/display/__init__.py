"""Text a person reads: model- and runtime-supplied strings made inert (escape), and how a
tool's arguments are shown (hints)."""
