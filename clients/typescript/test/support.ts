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
