/**
 * How a client reaches the sidecar: a target (`HOST:PORT` or `unix:///abs/path`) and,
 * for a TLS listener, `ClientTls` (the CA that signed the sidecar's certificate, and the
 * client certificate and key an mTLS listener requires).
 */
import { readFileSync } from "node:fs";

import * as grpc from "@grpc/grpc-js";

export interface ClientTls {
  /** PEM file of the CA that signed the sidecar's certificate (absent: the system's roots). */
  ca?: string;
  /** PEM files of this client's certificate and key, for an mTLS listener (both or neither). */
  cert?: string;
  key?: string;
  /** The name in the sidecar's certificate when it is not the target's host. */
  serverName?: string;
}

export function credentials(tls: ClientTls | undefined): grpc.ChannelCredentials {
  if (tls === undefined) return grpc.credentials.createInsecure();
  if ((tls.cert === undefined) !== (tls.key === undefined)) {
    throw new TypeError("a client certificate needs its key, and a key its certificate");
  }
  const read = (path: string | undefined) => (path === undefined ? null : readFileSync(path));
  return grpc.credentials.createSsl(read(tls.ca), read(tls.key), read(tls.cert));
}

export function channelOptions(tls: ClientTls | undefined): grpc.ChannelOptions {
  return tls?.serverName ? { "grpc.ssl_target_name_override": tls.serverName, "grpc.default_authority": tls.serverName }
    : {};
}

/** The target as grpc-js reads it; a Unix socket must be an absolute path. */
export function checkTarget(target: string): string {
  if (typeof target !== "string" || target === "") throw new TypeError("missing target");
  if (target.startsWith("unix:") && !target.startsWith("unix:///")) {
    throw new TypeError("a Unix socket target is `unix:///absolute/path`");
  }
  return target;
}
