import { defineConfig } from "vitest/config";

// Tests start real servers, load ONNX sessions and decode photos, while turbo
// runs every package's suite side by side on a 2-core machine: allow for that.
export default defineConfig({
  test: { testTimeout: 60_000, hookTimeout: 120_000 },
});
