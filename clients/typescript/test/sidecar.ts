/**
 * A real sidecar for the live tests: `toolauthz serve` (the installed console script in
 * the repository's .venv, or $TOOLAUTHZ_BIN) on the example bundle, fresh data and
 * development keys, listening on port 0 (plaintext), a Unix socket and an mTLS port
 * whose certificates tests/certs.py makes. Started once per test file, stopped at the end.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

import { repoRoot } from "./support.js";

export interface Sidecar {
  target: string; // plaintext HOST:PORT
  unixTarget: string; // unix:///abs/path
  tlsTarget: string; // mTLS HOST:PORT
  pki: { ca: string; cert: string; key: string; serverName: string };
  stop(): Promise<void>;
}

function executable(name: string): string {
  const path = join(repoRoot(), ".venv", "bin", name);
  if (!existsSync(path)) {
    throw new Error(`${path} is missing: run scripts/setup.sh --dev from the repository root first`);
  }
  return path;
}

/** Certificates from tests/certs.py: a CA, a server certificate for 127.0.0.1, a client certificate. */
function makePki(dir: string): Sidecar["pki"] & { serverCert: string; serverKey: string } {
  const script = [
    "import pathlib, sys",
    "sys.path.insert(0, 'tests')",
    "from certs import CertificateAuthority",
    "d = pathlib.Path(sys.argv[1])",
    "ca = CertificateAuthority()",
    "ca.write(d / 'ca.pem')",
    "ca.issue(dns=('localhost',), ips=('127.0.0.1',)).write(d, 'server')",
    "ca.issue(uris=('spiffe://acme.example/agent/typescript',)).write(d, 'client')",
  ].join("\n");
  execFileSync(executable("python"), ["-c", script, dir], { cwd: repoRoot() });
  return { ca: join(dir, "ca.pem"), cert: join(dir, "client.pem"), key: join(dir, "client.key"),
    serverCert: join(dir, "server.pem"), serverKey: join(dir, "server.key"), serverName: "localhost" };
}

export async function startSidecar(): Promise<Sidecar> {
  // A short directory: a Unix socket path holds at most 107 bytes.
  const dir = mkdtempSync(join(tmpdir().length < 40 ? tmpdir() : "/tmp", "tzts"));
  const pki = makePki(dir);
  const config = join(dir, "toolauthz.yaml");
  writeFileSync(config, JSON.stringify({
    bundle: join(repoRoot(), "policies"), data_dir: join(dir, "data"), generate_missing_keys: true,
    reload_poll_seconds: 0,
    listeners: [
      { address: "127.0.0.1:0" },
      { address: `unix://${join(dir, "s.sock")}` },
      { address: "127.0.0.1:0", tls: { cert: pki.serverCert, key: pki.serverKey, client_ca: pki.ca } },
    ],
  }));
  const child = spawn(executable("toolauthz"), ["serve", "--config", config, "--workers", "1", "--log-format", "json"],
    { cwd: repoRoot(), stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr!.on("data", (chunk: Buffer) => { stderr = (stderr + chunk.toString()).slice(-4000); });
  const listen = await banner(child, () => stderr);
  return {
    target: listen[0]!, unixTarget: listen[1]!, tlsTarget: listen[2]!, pki,
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((resolve) => child.once("exit", resolve));
        child.kill("SIGTERM");
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** The addresses of the start banner (a JSON line on standard output). */
function banner(child: ChildProcess, stderr: () => string): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! });
    lines.on("line", (line) => {
      let doc: { message?: string; listen?: string[] };
      try {
        doc = JSON.parse(line);
      } catch {
        return;
      }
      if (doc.message?.startsWith("toolauthz serving bundle") && Array.isArray(doc.listen)) resolve(doc.listen);
    });
    child.once("exit", (code) => reject(new Error(`the sidecar exited (${code}) before serving:\n${stderr()}`)));
  });
}
