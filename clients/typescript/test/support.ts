/** Paths and helpers the tests share. */
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository root (the directory holding tests/conformance), found upwards from this file. */
export function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "tests", "conformance", "sdk"))) {
    const parent = dirname(dir);
    if (parent === dir) throw new Error("the repository root (tests/conformance/sdk) was not found");
    dir = parent;
  }
  return dir;
}

/** The package directory (clients/typescript). */
export function packageRoot(): string {
  return join(repoRoot(), "clients", "typescript");
}

/** A deterministic random source in [0, 1) (mulberry32), so each run draws the same numbers. */
export function seeded(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
