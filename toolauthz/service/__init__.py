"""The gRPC service layer: the only code that knows about gRPC status codes."""
