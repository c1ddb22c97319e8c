import { defineConfig } from "vitest/config";

// Tests start real server processes (and load ONNX models): allow for a busy 2-core machine.
export default defineConfig({
  test: { testTimeout: 60_000, hookTimeout: 120_000 },
});
