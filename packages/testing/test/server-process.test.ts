import { mkdtemp, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { removeDir, startServerProcess } from "../src/index.js";

describe("startServerProcess", () => {
  it("kills a server that never reports it started, and says so", async () => {
    const dir = await mkdtemp(join(tmpdir(), "trellis-hung-"));
    try {
      // Stands in for a server stuck loading: alive, never logging "server started".
      const main = join(dir, "hung.mjs");
      await writeFile(main, "setInterval(() => {}, 1000);\n");
      const err = await startServerProcess([], { main, cwd: dir, startTimeoutMs: 300 }).catch((e: Error) => e);
      expect(err).toBeInstanceOf(Error);
      const match = /^server \(pid (\d+)\) did not start within 300 ms/.exec((err as Error).message);
      expect(match).not.toBeNull();
      // Signal 0 only checks that the process exists.
      expect(() => process.kill(Number(match?.[1]), 0)).toThrow(/ESRCH/);
    } finally {
      await removeDir(dir);
    }
  });
});
