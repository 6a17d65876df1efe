/**
 * The committed src/gen/ must be exactly what `npm run generate` writes from proto/
 * (buf and protoc-gen-es, pinned in package-lock.json, run offline from node_modules).
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { test } from "node:test";

import { packageRoot, repoRoot } from "./support.js";

function files(root: string): Map<string, string> {
  const found = new Map<string, string>();
  const walk = (dir: string) => {
    for (const name of readdirSync(dir)) {
      const path = join(dir, name);
      if (statSync(path).isDirectory()) walk(path);
      else found.set(relative(root, path), readFileSync(path, "utf8"));
    }
  };
  walk(root);
  return found;
}

test("the generated protobuf code is fresh", () => {
  const out = mkdtempSync(join(tmpdir(), "tzgen"));
  try {
    const buf = join(packageRoot(), "node_modules", ".bin", "buf");
    execFileSync(buf, ["generate", join(repoRoot(), "proto"), "--template", "buf.gen.yaml", "-o", out], {
      cwd: packageRoot(), env: { ...process.env, PATH: `${join(packageRoot(), "node_modules", ".bin")}:${process.env.PATH}` },
    });
    const fresh = files(join(out, "src", "gen"));
    const committed = files(join(packageRoot(), "src", "gen"));
    assert.deepEqual([...committed.keys()].sort(), [...fresh.keys()].sort(), "run: npm run generate (in clients/typescript)");
    const stale = [...fresh].filter(([name, text]) => committed.get(name) !== text).map(([name]) => name);
    assert.deepEqual(stale, [], "stale generated files; run: npm run generate (in clients/typescript)");
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});
