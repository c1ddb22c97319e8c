import { defineConfig, mergeConfig } from "vitest/config";
import shared from "../../vitest.shared.js";

export default mergeConfig(
  shared,
  defineConfig({
    test: {
      globalSetup: ["test/global-setup.ts"],
      // Each test file loads ONNX sessions; keep them one at a time.
      fileParallelism: false,
    },
  }),
);
