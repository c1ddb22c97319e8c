import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import type { ServerHttp2Session } from "node:http2";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { listenStage } from "@trellis/frontends";
import { ModelParameterSchema } from "@trellis/protocol";
import { Code, type InferRequest, type Stage, tensor } from "@trellis/stage";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connectRemote, loadStage, type RepositoryModel, readEndpointsFile, scanRepository } from "../src/index.js";

/** A user's own stage, the way they would write model.py: plain JS, no imports needed. */
const userStage = (op: string) => `
export function createStage({ config, version }) {
  const factor = Number(config.parameters.factor?.stringValue ?? "1");
  let calls = 0;
  const shape = [-1, 4];
  return {
    name: config.name, version, config,
    isReady: () => true,
    metadata: () => ({ name: config.name, versions: [version], platform: "typescript",
      inputs: [{ name: "IN", datatype: "FP32", shape }], outputs: [{ name: "OUT", datatype: "FP32", shape }] }),
    async infer(request) {
      calls += 1;
      const t = request.inputs[0];
      return { modelName: config.name, modelVersion: version,
        outputs: [{ name: "OUT", datatype: "FP32", shape: t.shape, data: t.data.map((v) => ${op}) }] };
    },
    statistics: () => ({ name: config.name, version, inferenceCount: BigInt(calls) }),
    close: async () => {},
  };
}
`;

const unary = (name: string, extra: string) => `
name: "${name}"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
${extra}`;

const chain = (params = "") => `
name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "scale" model_version: -1 input_map { key: "IN" value: "m" } output_map { key: "OUT" value: "Y" } },
  { model_name: "offset" model_version: 1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "m" } }
] }
${params}`;

let repo: string;
const files: Record<string, string> = {
  // parameter "module" as a path: the user's file, relative to the version folder
  "scale/config.pbtxt": unary(
    "scale",
    `backend: "typescript"
     parameters { key: "module" value: { string_value: "./scale.mjs" } }
     parameters { key: "factor" value: { string_value: "10" } }`,
  ),
  "scale/1/scale.mjs": userStage("v * factor"),
  "scale/2/scale.mjs": userStage("v * factor * 1000"),
  "scale/10/scale.mjs": userStage("v * factor * 100"),
  // no parameter: <version>/model.js, like Triton's model.py
  "offset/config.pbtxt": unary("offset", `backend: "typescript"`),
  "offset/1/model.js": userStage("v + 1"),
  "chain/config.pbtxt": chain(),
  "chain/1/.keep": "",
  "legacy/config.pbtxt": unary("legacy", `backend: "python"`),
  "legacy/1/.keep": "",
  "tf/config.pbtxt": unary("tf", `platform: "tensorflow_savedmodel"`),
  "tf/1/.keep": "",
  "nomodule/config.pbtxt": unary("nomodule", `backend: "typescript"`),
  "nomodule/1/.keep": "",
  "broken/config.pbtxt": `name: "broken"\nmax_batch_size: eight\n`,
  "misnamed/config.pbtxt": unary("other", `backend: "typescript"`),
  // Not a model: no config.pbtxt, no version folder (like models/gpu).
  "notes/README.md": "other repositories live here\n",
  // A model missing its config: it has a version folder.
  "unconfigured/1/model.onnx": "",
  "dangling/config.pbtxt": chain().replace('name: "chain"', 'name: "dangling"').replace('"offset"', '"missing"'),
  "dangling/1/.keep": "",
};

beforeAll(async () => {
  repo = await mkdtemp(join(tmpdir(), "trellis-repo-"));
  for (const [path, text] of Object.entries(files)) {
    await mkdir(join(repo, path, ".."), { recursive: true });
    await writeFile(join(repo, path), text);
  }
  await mkdir(join(repo, "scale", "not-a-version"));
});
afterAll(() => rm(repo, { recursive: true, force: true }));

const x = (...v: number[]) => tensor("X", "FP32", [1, 4], Float32Array.from(v));
const find = async (name: string): Promise<RepositoryModel> => {
  const m = (await scanRepository([repo])).models.find((m) => m.name === name);
  if (!m) throw new Error(`${name} not scanned`);
  return m;
};

describe("scanRepository", () => {
  it("lists models with numerically sorted versions and reports broken ones", async () => {
    const { models, errors, skipped } = await scanRepository([repo]);
    expect(models.map((m) => m.name)).toEqual(["chain", "dangling", "legacy", "nomodule", "offset", "scale", "tf"]);
    const scale = models.find((m) => m.name === "scale")!;
    expect(scale.versions).toEqual(["1", "2", "10"]);
    expect(scale.configPath).toBe(join(repo, "scale", "config.pbtxt"));
    expect(scale.config.maxBatchSize).toBe(8);
    expect(errors.map((e) => e.name)).toEqual(["broken", "misnamed", "unconfigured"]);
    expect(errors[2]!.error.message).toContain("unconfigured/config.pbtxt: no config.pbtxt");
    expect(skipped).toEqual([join(repo, "notes")]);
    expect(errors[0]!.error.message).toMatch(/broken\/config\.pbtxt:2:\d+: /);
    expect(errors[1]!.error.message).toContain('config name "other" does not match its directory "misnamed"');
  });

  it("refuses a model name found in two repositories (neither loads, as in Triton), keeping the rest", async () => {
    const second = await mkdtemp(join(tmpdir(), "trellis-repo2-"));
    try {
      await mkdir(join(second, "scale", "1"), { recursive: true });
      await writeFile(join(second, "scale", "config.pbtxt"), unary("scale", ""));
      await mkdir(join(second, "solo", "1"), { recursive: true });
      await writeFile(join(second, "solo", "config.pbtxt"), unary("solo", ""));
      const { models, errors } = await scanRepository([repo, second]);
      expect(models.map((m) => m.name)).not.toContain("scale");
      expect(models.map((m) => m.name)).toContain("solo");
      expect(models.map((m) => m.name)).toContain("offset");
      const clash = errors.filter((e) => e.name === "scale");
      expect(clash).toHaveLength(1);
      expect(clash[0]!.error.message).toBe(
        'model "scale" is in more than one repository (repositories #1, #2): none of them is loaded',
      );
    } finally {
      await rm(second, { recursive: true, force: true });
    }
  });

  it("serves a mapped folder under its mapped name, whatever its config calls it; the others keep theirs", async () => {
    const second = await mkdtemp(join(tmpdir(), "trellis-repo2-"));
    try {
      await mkdir(join(second, "model", "1"), { recursive: true });
      await writeFile(join(second, "model", "config.pbtxt"), unary("resnet", ""));
      await mkdir(join(second, "step", "1"), { recursive: true });
      await writeFile(join(second, "step", "config.pbtxt"), unary("step", ""));
      const { models, errors } = await scanRepository([{ path: second, names: { model: "resnet.tar.gz" } }]);
      expect(errors).toEqual([]);
      const mapped = models.find((m) => m.name === "resnet.tar.gz");
      expect(mapped?.config.name).toBe("resnet.tar.gz");
      expect(mapped?.modelDir).toBe(join(second, "model"));
      expect(models.map((m) => m.name).sort()).toEqual(["resnet.tar.gz", "step"]);
    } finally {
      await rm(second, { recursive: true, force: true });
    }
  });
});

describe("scanRepository and linked model folders", () => {
  it("follows a model folder that is a symbolic link, as Triton does; a dangling link is no model", async () => {
    const volume = await mkdtemp(join(tmpdir(), "trellis-volume-"));
    const second = await mkdtemp(join(tmpdir(), "trellis-repo-links-"));
    try {
      await mkdir(join(volume, "linked", "1"), { recursive: true });
      await writeFile(join(volume, "linked", "config.pbtxt"), unary("linked", ""));
      await symlink(join(volume, "linked"), join(second, "linked"));
      await symlink(join(volume, "nothing-here"), join(second, "dangling_link"));
      const { models, errors, skipped } = await scanRepository([second]);
      expect(models.map((m) => m.name)).toEqual(["linked"]);
      expect(models[0]!.versions).toEqual(["1"]);
      expect(errors).toEqual([]);
      expect(skipped).toEqual([]);
    } finally {
      await rm(second, { recursive: true, force: true });
      await rm(volume, { recursive: true, force: true });
    }
  });
});

describe("loadStage", () => {
  it("loads a user's model.js and a module path, by version", async () => {
    const offset = await loadStage(await find("offset"), { version: "1" });
    expect((await offset.infer({ inputs: [{ ...x(1, 2, 3, 4), name: "IN" }] })).outputs[0]!.data).toEqual(
      Float32Array.of(2, 3, 4, 5),
    );
    const scale10 = await loadStage(await find("scale"), { version: "10" });
    expect((await scale10.infer({ inputs: [{ ...x(1, 0, 0, 0), name: "IN" }] })).outputs[0]!.data[0]).toBe(1000);
    const missing = await loadStage(await find("scale"), { version: "3" }).catch((e) => e);
    expect(missing.code).toBe(Code.NotFound);
    expect(missing.rawMessage).toContain('no version folder "3"');
  });

  it("loads an ensemble whose steps come from the same repository (latest or pinned version)", async () => {
    const chainStage = await loadStage(await find("chain"), { version: "1" });
    const res = await chainStage.infer({ inputs: [x(1, 2, 3, 4)] });
    // offset v1 (+1) then scale latest (v10: x10 x100); the pinned v1 would scale x10 only.
    expect(Array.from(res.outputs[0]!.data as Float32Array)).toEqual([2000, 3000, 4000, 5000]);
    await chainStage.close();
  });

  it("reports an ensemble step naming a model the repository lacks", async () => {
    const err = await loadStage(await find("dangling"), { version: "1" }).catch((e) => e);
    expect(err.code).toBe(Code.NotFound);
    expect(err.rawMessage).toContain("step 1 missing: NOT_FOUND: unknown model");
  });

  it("loads a TypeScript stage with sequence_batching behind the sequence batcher; refuses decoupled and cached sequence models", async () => {
    const dir = await mkdtemp(join(tmpdir(), "trellis-sequence-"));
    try {
      const sequence = `sequence_batching { max_sequence_idle_microseconds: 5000000
        control_input [ { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ] }`;
      await mkdir(join(dir, "stateful_ts", "1"), { recursive: true });
      await writeFile(
        join(dir, "stateful_ts", "config.pbtxt"),
        unary("stateful_ts", `backend: "typescript"\n${sequence}`),
      );
      await writeFile(join(dir, "stateful_ts", "1", "model.js"), userStage("v + 1"));
      await mkdir(join(dir, "stateful_decoupled", "1"), { recursive: true });
      await writeFile(
        join(dir, "stateful_decoupled", "config.pbtxt"),
        unary("stateful_decoupled", `backend: "typescript"\nmodel_transaction_policy { decoupled: true }\n${sequence}`),
      );
      await mkdir(join(dir, "stateful_cached", "1"), { recursive: true });
      await writeFile(
        join(dir, "stateful_cached", "config.pbtxt"),
        unary("stateful_cached", `backend: "typescript"\nresponse_cache { enable: true }\n${sequence}`),
      );
      const { models } = await scanRepository([dir]);
      const byName = (name: string) => models.find((m) => m.name === name)!;
      const stage = await loadStage(byName("stateful_ts"), { version: "1" });
      const input = tensor("IN", "FP32", [1, 4], Float32Array.of(1, 2, 3, 4));
      // The loader put the sequence batcher in front: a request outside a sequence is refused as Triton refuses it.
      const outside = await stage.infer({ inputs: [input] }).catch((e) => e);
      expect([outside.code, outside.rawMessage]).toEqual([
        Code.InvalidArgument,
        "stateful_ts: inference request to model 'stateful_ts' must specify a non-zero or non-empty correlation ID",
      ]);
      const res = await stage.infer({ inputs: [input], parameters: { sequence_id: 12, sequence_start: true } });
      expect(Array.from(res.outputs[0]!.data as Float32Array)).toEqual([2, 3, 4, 5]);
      await stage.close();
      const refused = await loadStage(byName("stateful_decoupled"), { version: "1" }).catch((e) => e);
      expect(refused.rawMessage).toContain(
        "sequence_batching with model_transaction_policy { decoupled: true } is not supported",
      );
      const cached = await loadStage(byName("stateful_cached"), { version: "1" }).catch((e) => e);
      expect(cached.rawMessage).toContain("response_cache is not supported with sequence_batching");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("loads a decoupled TypeScript stage with inferStream, and an ensemble of it (decoupled in turn); refuses decoupled ONNX models, cached ones, and stages without inferStream", async () => {
    const dir = await mkdtemp(join(tmpdir(), "trellis-decoupled-"));
    try {
      const decoupled = "model_transaction_policy { decoupled: true }";
      const models: [string, string][] = [
        ["decoupled_onnx", `platform: "onnxruntime_onnx"\n${decoupled}`],
        ["decoupled_cached", `backend: "typescript"\n${decoupled}\nresponse_cache { enable: true }`],
        ["decoupled_once", `backend: "typescript"\n${decoupled}`],
        ["decoupled_ts", `backend: "typescript"\n${decoupled}`],
      ];
      for (const [name, extra] of models) {
        await mkdir(join(dir, name, "1"), { recursive: true });
        await writeFile(join(dir, name, "config.pbtxt"), unary(name, extra));
      }
      // decoupled_once answers once (no inferStream); decoupled_ts streams its input back element by element.
      await writeFile(join(dir, "decoupled_once", "1", "model.js"), userStage("v"));
      await writeFile(
        join(dir, "decoupled_ts", "1", "model.js"),
        // The temporary folder has no node_modules: @trellis/stage by its resolved URL.
        `import { defineStage } from "${import.meta.resolve("@trellis/stage")}";
export const createStage = ({ config, version }) => defineStage({ config, version, async *computeStream(request) {
  for (const v of request.inputs[0].data) yield [{ name: "OUT", datatype: "FP32", shape: [1, 1], data: Float32Array.of(v) }];
} });
`,
      );
      await mkdir(join(dir, "uses_decoupled", "1"), { recursive: true });
      await writeFile(
        join(dir, "uses_decoupled", "config.pbtxt"),
        `name: "uses_decoupled"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "decoupled_ts" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }
`,
      );
      const { models: scanned } = await scanRepository([dir]);
      const byName = (name: string) => scanned.find((m) => m.name === name)!;
      const refusal = async (name: string) => {
        const err = await loadStage(byName(name), { version: "1" }).catch((e) => e);
        expect(err.code, err.rawMessage).toBe(Code.InvalidArgument);
        return err.rawMessage as string;
      };
      const why = (name: string, reason: string) => `${name}: model_transaction_policy { decoupled: true }: ${reason}`;
      expect(await refusal("decoupled_onnx")).toBe(
        why("decoupled_onnx", "an ONNX Runtime model answers each request once"),
      );
      expect(await refusal("decoupled_cached")).toBe(
        why("decoupled_cached", "the response cache does not support decoupled models"),
      );
      expect(await refusal("decoupled_once")).toBe(
        "decoupled_once: model_transaction_policy { decoupled: true }, but the stage has no inferStream to send its responses (defineStage: give computeStream)",
      );
      // An ensemble with a decoupled step streams too, its config marked decoupled (as Triton marks it).
      const ensemble = await loadStage(byName("uses_decoupled"), { version: "1" });
      expect(ensemble.config.modelTransactionPolicy?.decoupled).toBe(true);
      const streamed: number[] = [];
      for await (const r of ensemble.inferStream!({ inputs: [{ ...x(5, 6, 7, 8), name: "IN" }] })) {
        streamed.push((r.outputs[0]!.data as Float32Array)[0]!);
      }
      expect(streamed).toEqual([5, 6, 7, 8]);
      expect((await ensemble.infer({ inputs: [{ ...x(5, 6, 7, 8), name: "IN" }] }).catch((e) => e)).code).toBe(
        Code.Unimplemented,
      );
      await ensemble.close();

      const stage = await loadStage(byName("decoupled_ts"), { version: "1" });
      const request = { inputs: [{ ...x(1, 2, 3, 4), name: "IN" }] };
      const answers: number[] = [];
      for await (const r of stage.inferStream!(request)) answers.push((r.outputs[0]!.data as Float32Array)[0]!);
      expect(answers).toEqual([1, 2, 3, 4]);
      const once = await stage.infer(request).catch((e) => e);
      expect(once.code).toBe(Code.Unimplemented);
      expect(once.rawMessage).toBe(
        "decoupled_ts: the model is decoupled (model_transaction_policy): it sends its responses over the ModelStreamInfer stream, not one per call",
      );
      await stage.close();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("refuses python and unknown backends with directions", async () => {
    const py = await loadStage(await find("legacy"), { version: "1" }).catch((e) => e);
    expect(py.code).toBe(Code.InvalidArgument);
    expect(py.rawMessage).toContain('backend "python" needs model.py in the version folder 1');
    expect(py.rawMessage).toContain('backend: "typescript"');
    const tf = await loadStage(await find("tf"), { version: "1" }).catch((e) => e);
    expect(tf.rawMessage).toContain('unsupported platform "tensorflow_savedmodel"');
    const none = await loadStage(await find("nomodule"), { version: "1" }).catch((e) => e);
    expect(none.rawMessage).toContain('backend "typescript" needs a parameter "module"');
  });

  it("makes steps named in the endpoint map remote, from a file or the ensemble's parameters", async () => {
    // "scale" v2 served on its own gRPC port, counting the requests that reach it.
    const local = await loadStage(await find("scale"), { version: "2" });
    const seen: InferRequest[] = [];
    const counted: Stage = {
      ...local,
      name: local.name,
      version: local.version,
      config: local.config,
      infer: (req, opts) => {
        seen.push(req);
        return local.infer(req, opts);
      },
    };
    const server = await listenStage(counted);
    try {
      const endpointsFile = join(repo, "endpoints.json");
      await writeFile(endpointsFile, JSON.stringify({ scale: `${server.url}/` }));
      const endpoints = await readEndpointsFile(endpointsFile);
      expect(endpoints).toEqual({ scale: server.url });
      const viaFile = await loadStage(await find("chain"), { version: "1", endpoints });
      const res = await viaFile.infer({ inputs: [x(1, 2, 3, 4)] });
      expect(Array.from(res.outputs[0]!.data as Float32Array)).toEqual([20000, 30000, 40000, 50000]);
      expect(seen).toHaveLength(1);
      // The remote model reached over the wire got the tensor under its own input name.
      expect(seen[0]!.inputs.map((t) => [t.name, t.shape])).toEqual([["IN", [1, 4]]]);
      await viaFile.close();

      const model = await find("chain");
      model.config.parameters["endpoint.scale"] = create(ModelParameterSchema, { stringValue: server.url });
      const viaParam = await loadStage(model, { version: "1" });
      await viaParam.infer({ inputs: [x(1, 2, 3, 4)] });
      expect(seen).toHaveLength(2);
      await viaParam.close();
    } finally {
      await server.close();
    }
  });
});

describe("connectRemote", () => {
  it("ends its HTTP/2 connection when the stage closes, and when the remote model is not there", async () => {
    const local = await loadStage(await find("scale"), { version: "2" });
    const server = await listenStage(local);
    const sessions: ServerHttp2Session[] = [];
    server.server.on("session", (s) => sessions.push(s));
    const ended = (s: ServerHttp2Session | undefined) =>
      new Promise((resolve) => (s?.closed ? resolve(undefined) : s?.once("close", resolve)));
    try {
      const remote = await connectRemote("scale", server.url);
      const res = await remote.infer({ inputs: [tensor("IN", "FP32", [1, 4], Float32Array.from([1, 2, 3, 4]))] });
      expect(Array.from(res.outputs[0]?.data as Float32Array)).toEqual([10000, 20000, 30000, 40000]);
      expect(sessions).toHaveLength(1);
      await remote.close();
      await ended(sessions[0]);

      const missing = await connectRemote("nothing", server.url).catch((e) => e);
      expect(missing.code).toBe(Code.NotFound);
      expect(sessions).toHaveLength(2);
      await ended(sessions[1]);
    } finally {
      await server.close();
      await local.close();
    }
  });
});

describe("readEndpointsFile", () => {
  it("rejects anything but a map of model names to http(s) URLs", async () => {
    const write = async (text: string) => {
      const p = join(repo, "e.json");
      await writeFile(p, text);
      return readEndpointsFile(p).catch((e: Error) => e.message);
    };
    expect(await write('["http://x"]')).toContain("expected a JSON object");
    expect(await write('{"a": 9001}')).toContain('endpoint for "a" must be a string URL');
    expect(await write('{"a": "localhost:9001"}')).toContain('endpoint for "a" must be http:// or https://');
    expect(await write('{"a": "not a url"}')).toContain('endpoint for "a" is not a URL');
    expect(await write("{oops")).toContain("e.json:");
  });
});
