/**
 * The repository manager in-process, with the production loader: what the
 * black-box tests cannot see from outside the server process.
 */
import { parseModelConfig } from "@trellis/protocol";
import { listenStage, tensor } from "@trellis/stage";
import { removeDir } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { modelLoader } from "../src/loader.js";
import { RepositoryManager } from "../src/repository.js";
import { createStage as createEchoStage } from "./fixtures/echo-stage.js";
import { CHAIN_CONFIG, echoConfig, makeRepository } from "./helpers.js";

const quiet = { info() {}, warn() {}, error() {} };

let repo: string;
beforeAll(async () => {
  repo = await makeRepository({
    echo10: { config: echoConfig("echo10", { params: { scale: "10" } }) },
    chain: { config: CHAIN_CONFIG },
  });
});
afterAll(() => removeDir(repo));

describe("remote ensemble steps", () => {
  it("share one connection across ensemble reloads", async () => {
    // "echo" lives in another server only; the chain reaches it through the endpoint map.
    const echo = createEchoStage({ config: parseModelConfig(echoConfig("echo")), version: "1" });
    const remote = await listenStage(echo);
    const loader = modelLoader();
    let connects = 0;
    const manager = new RepositoryManager({
      repositories: [repo],
      loader: {
        ...loader,
        connectRemote: (name, url, version) => {
          connects += 1;
          return loader.connectRemote(name, url, version);
        },
      },
      mode: "explicit",
      endpoints: { echo: remote.url },
      logger: quiet,
    });
    try {
      await manager.start();
      const run = async () => {
        const res = await manager.resolve("chain").infer({
          inputs: [tensor("IN", "FP32", [1, 4], Float32Array.from([1, 2, 3, 4]))],
        });
        return Array.from(res.outputs[0]?.data as Float32Array);
      };
      await manager.load("chain");
      expect(await run()).toEqual([10, 20, 30, 40]);
      await manager.unload("chain");
      await manager.load("chain");
      expect(await run()).toEqual([10, 20, 30, 40]);
      expect(connects).toBe(1);
    } finally {
      await manager.close();
      await remote.close();
    }
  });
});
