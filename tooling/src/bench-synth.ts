#!/usr/bin/env node
// pnpm bench (tooling): how long models:synth takes, and the file it writes.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { synthesizeResNet50 } from "./synth.js";

const dir = await mkdtemp(join(tmpdir(), "bench-synth-"));
try {
  const times: number[] = [];
  let last: Awaited<ReturnType<typeof synthesizeResNet50>> | undefined;
  for (let i = 0; i < 3; i++) {
    last = await synthesizeResNet50({ seed: i, path: join(dir, "model.onnx") });
    times.push(last.ms);
  }
  times.sort((a, b) => a - b);
  console.log(
    `models:synth: ${last!.parameters.toLocaleString("en")} parameters, ${last!.bytes.toLocaleString("en")} bytes; ` +
      `generate+encode+write ms (3 runs) min ${times[0]!.toFixed(0)} median ${times[1]!.toFixed(0)} max ${times[2]!.toFixed(0)}`,
  );
} finally {
  await rm(dir, { recursive: true, force: true });
}
