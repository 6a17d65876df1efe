/**
 * The error every failed RPC rejects with. In its own module so that ./client.ts and
 * ./throttle.ts (whose ThrottledError extends it) can both import it without a cycle.
 */
import * as grpc from "@grpc/grpc-js";

/** A failed RPC: `code` is the gRPC status name (UNAVAILABLE, INVALID_ARGUMENT, ...). */
export class RpcError extends Error {
  constructor(readonly code: string, readonly details: string) {
    super(`${code}: ${details}`);
    this.name = "RpcError";
  }

  static of(error: unknown): RpcError {
    if (error instanceof RpcError) return error;
    const status = (error as Partial<grpc.ServiceError>)?.code;
    const name = typeof status === "number" ? grpc.status[status] : undefined;
    const details = (error as Partial<grpc.ServiceError>)?.details;
    return new RpcError(name ?? "UNKNOWN", typeof details === "string" ? details : "the call failed");
  }
}
