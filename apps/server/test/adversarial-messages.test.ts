/**
 * Adversarial: what a client is told when it sends something wrong, and what it is never told.
 *
 * A client's mistake is a 400 / INVALID_ARGUMENT that names the problem, never a 500 /
 * INTERNAL (a null body, nesting deep enough to overflow a recursive reader, a NUL in a
 * model name, a typed KServe parameter of the wrong type), and a good request right after
 * still answers. Error messages and the model index's reasons name the model and the reason
 * but carry no filesystem path, URL or address of the server's own; the server's log keeps
 * the detail.
 */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { Code, type ConnectError } from "@connectrpc/connect";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { echoConfig, explicitModels, freePort, grpcClientOf, makeRepository, postJson } from "./helpers.js";

const GOOD = { inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] };
const f32 = (values: number[]) => new Uint8Array(new Float32Array(values).buffer);
const GOOD_GRPC = {
  modelName: "echo",
  inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 4n] }],
  rawInputContents: [f32([1, 2, 3, 4])],
};
type Param =
  | { case: "stringParam"; value: string }
  | { case: "boolParam"; value: boolean }
  | { case: "int64Param"; value: bigint }
  | { case: "doubleParam"; value: number }
  | { case: "bytesParam"; value: Uint8Array };
const param = <T extends Param>(choice: T) => ({ parameterChoice: choice });

/** `[[[ ... ]]]`, `depth` deep: JSON.parse reads it, a recursive walk over it overflows the stack. */
const nested = (depth: number) => `${"[".repeat(depth)}${"]".repeat(depth)}`;

/** Raw POST of a text body; the status and the JSON error. */
async function post(url: string, body: string): Promise<{ status: number; error: unknown }> {
  const res = await fetch(url, { method: "POST", body, headers: { "content-type": "application/json" } });
  const text = await res.text();
  let error: unknown;
  try {
    error = (JSON.parse(text) as { error?: unknown }).error;
  } catch {
    error = text;
  }
  return { status: res.status, error };
}

/** What a client must never see: absolute paths, the install tree, temp folders, URLs, addresses. */
function expectNoLeak(message: string, repo: string): void {
  expect(message).not.toContain(repo);
  // Nor the server's own files: Node's "imported from <the loader>" says nothing about the model.
  expect(message).not.toMatch(/loader\.js|imported from/);
  expect(message).not.toContain("/tmp/");
  expect(message).not.toContain("dist/");
  expect(message).not.toContain("packages/");
  expect(message).not.toContain("file://");
  expect(message).not.toMatch(/https?:\/\//);
  expect(message).not.toMatch(/127\.0\.0\.1|localhost/);
  expect(message).not.toMatch(/(^|[\s'"(=])\/[^\s/'"]+\/[^\s'"]+/);
}

describe("client mistakes are 400 / INVALID_ARGUMENT, never 500 / INTERNAL", () => {
  let repo: string;
  let server: ServerProcess;
  beforeAll(async () => {
    repo = await makeRepository({ echo: { config: echoConfig("echo") }, other: { config: echoConfig("other") } });
    server = await startServerProcess(explicitModels(repo, "echo"));
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  async function goodStillAnswers(): Promise<void> {
    const res = await postJson(`${server.http}/v2/models/echo/infer`, GOOD);
    expect(res.status).toBe(200);
    expect(res.json.outputs[0].data).toEqual([1, 2, 3, 4]);
  }

  const withParams = (parameters: unknown) => JSON.stringify({ ...GOOD, parameters });
  const withOutput = (parameters: unknown) => JSON.stringify({ ...GOOD, outputs: [{ name: "OUTPUT", parameters }] });
  const withInput = (field: string, value: unknown) =>
    JSON.stringify({ inputs: [{ ...GOOD.inputs[0], [field]: value }] });

  // [what, path under the server, body, what the message must say]
  const cases: [string, string, string, RegExp][] = [
    ["a null infer body", "/v2/models/echo/infer", "null", /inference request must be a JSON object/],
    ["an array infer body", "/v2/models/echo/infer", "[1]", /inference request must be a JSON object/],
    ["a null load body", "/v2/repository/models/other/load", "null", /load request must be a JSON object/],
    ["a null unload body", "/v2/repository/models/other/unload", "null", /unload request must be a JSON object/],
    ["a null index body", "/v2/repository/index", "null", /index request must be a JSON object/],
    [
      "a string index 'ready'",
      "/v2/repository/index",
      '{"ready":"yes"}',
      /^Invalid value for 'ready': expected a boolean$/,
    ],
    ["null load parameters", "/v2/repository/models/other/load", '{"parameters":null}', /'parameters' must be/],
    ["array load parameters", "/v2/repository/models/other/load", '{"parameters":[1]}', /'parameters' must be/],
    ["null unload parameters", "/v2/repository/models/other/unload", '{"parameters":5}', /'parameters' must be/],
    [
      "data nested 200k deep",
      "/v2/models/echo/infer",
      withInput("data", "@NESTED@").replace('"@NESTED@"', nested(200_000)),
      // Triton's bound and words (http_server.cc HTTP_MAX_JSON_NESTING_DEPTH).
      /^JSON nesting depth exceeds maximum allowed limit \(100\)$/,
    ],
    [
      "a trace setting nested 100k deep",
      "/v2/trace/setting",
      `{"trace_rate":${nested(100_000)}}`,
      /trace setting 'trace_rate' must be a string, a number, a list of them or null/,
    ],
    [
      "a model's trace setting nested 100k deep",
      "/v2/models/echo/trace/setting",
      `{"trace_level":${nested(100_000)}}`,
      /trace setting 'trace_level' must be/,
    ],
    [
      "a trace setting list of lists",
      "/v2/trace/setting",
      '{"trace_level":[["TIMESTAMPS"]]}',
      /trace setting 'trace_level' must be/,
    ],
    [
      "a log setting nested 100k deep",
      "/v2/logging",
      `{"log_info":${nested(100_000)}}`,
      /log setting 'log_info' must be a boolean, a number or a string, got an array/,
    ],
    [
      "a string binary_data_output",
      "/v2/models/echo/infer",
      withParams({ binary_data_output: "yes" }),
      /parameter 'binary_data_output' must be a boolean, got "yes"/,
    ],
    [
      "a numeric binary_data_output",
      "/v2/models/echo/infer",
      withParams({ binary_data_output: 1 }),
      /parameter 'binary_data_output' must be a boolean, got 1/,
    ],
    [
      "a string output binary_data",
      "/v2/models/echo/infer",
      withOutput({ binary_data: "true" }),
      /output 'OUTPUT': parameter 'binary_data' must be a boolean, got "true"/,
    ],
    [
      "a string priority",
      "/v2/models/echo/infer",
      withParams({ priority: "high" }),
      /parameter 'priority' must be an unsigned integer, got "high"/,
    ],
    [
      "a negative priority",
      "/v2/models/echo/infer",
      withParams({ priority: -1 }),
      /parameter 'priority' must be an unsigned integer, got -1/,
    ],
    [
      "a fractional timeout",
      "/v2/models/echo/infer",
      withParams({ timeout: 1.5 }),
      /parameter 'timeout' must be an unsigned integer.*, got 1.5/,
    ],
    [
      "a boolean sequence_id",
      "/v2/models/echo/infer",
      withParams({ sequence_id: true }),
      /parameter 'sequence_id' must be an unsigned integer or a string, got true/,
    ],
    [
      "a string sequence_start",
      "/v2/models/echo/infer",
      withParams({ sequence_start: "yes" }),
      /parameter 'sequence_start' must be a boolean, got "yes"/,
    ],
    [
      "a numeric sequence_end",
      "/v2/models/echo/infer",
      withParams({ sequence_end: 1 }),
      /parameter 'sequence_end' must be a boolean, got 1/,
    ],
    [
      "a string binary_data_size",
      "/v2/models/echo/infer",
      JSON.stringify({
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], parameters: { binary_data_size: "16" } }],
      }),
      /binary_data_size/,
    ],
    [
      "input parameters that are no object",
      "/v2/models/echo/infer",
      withInput("parameters", [1]),
      /input 'INPUT': 'parameters' must be an object/,
    ],
    ["a NUL in a model name to load", "/v2/repository/models/ec%00ho/load", "{}", /model name .*control character/],
    [
      "a NUL in a file override's path",
      "/v2/repository/models/fresh/load",
      JSON.stringify({ parameters: { config: "{}", "file:1/mo\u0000del.js": "AA==" } }),
      /'file:1\/mo.del\.js'.*control character/,
    ],
  ];

  it.each(cases)("HTTP: %s is a 400 that says so", async (_what, path, body, message) => {
    const res = await post(`${server.http}${path}`, body);
    expect(res.status, JSON.stringify(res.error)).toBe(400);
    expect(res.error).toMatch(message);
    await goodStillAnswers();
  });

  it("HTTP: no body of wrong JSON types anywhere in an infer request is answered 500", async () => {
    // "@DEEP@" stands for an array nested 100k deep, spliced into the body's text.
    const wrong: unknown[] = [null, true, -1, 1.5, 1e300, "x", [], [null], {}, { a: [1] }, "@DEEP@", { a: "@DEEP@" }];
    const place = (path: (string | number)[], value: unknown): unknown => {
      const body = structuredClone({ ...GOOD, outputs: [{ name: "OUTPUT", parameters: { binary_data: false } }] });
      let at: Record<string | number, unknown> = body as never;
      for (const key of path.slice(0, -1)) at = at[key] as Record<string | number, unknown>;
      at[path.at(-1) as string | number] = value;
      return body;
    };
    const paths: (string | number)[][] = [
      ["inputs"],
      ["inputs", 0],
      ["inputs", 0, "name"],
      ["inputs", 0, "datatype"],
      ["inputs", 0, "shape"],
      ["inputs", 0, "shape", 0],
      ["inputs", 0, "data"],
      ["inputs", 0, "data", 0],
      ["inputs", 0, "parameters"],
      ["outputs"],
      ["outputs", 0],
      ["outputs", 0, "name"],
      ["outputs", 0, "parameters"],
      ["outputs", 0, "parameters", "binary_data"],
      ["parameters"],
      ["id"],
    ];
    const answered: string[] = [];
    for (const path of paths) {
      for (const value of wrong) {
        const text = JSON.stringify(place(path, value)).replace('"@DEEP@"', nested(100_000));
        const res = await post(`${server.http}/v2/models/echo/infer`, text);
        answered.push(`${path.join(".")}=${JSON.stringify(value)?.slice(0, 20)}: ${res.status}`);
        expect(res.status, `${path.join(".")} = ${JSON.stringify(value)?.slice(0, 40)}: ${res.error}`).toBeLessThan(
          500,
        );
        if (res.status !== 200) expect(typeof res.error).toBe("string");
      }
    }
    expect(answered).toHaveLength(paths.length * wrong.length);
    await goodStillAnswers();
  });

  it("gRPC: no malformed ModelInfer is answered INTERNAL or UNKNOWN", async () => {
    const client = grpcClientOf(server);
    const input = GOOD_GRPC.inputs[0] as (typeof GOOD_GRPC.inputs)[0];
    const bad: [string, Parameters<typeof client.modelInfer>[0]][] = [
      ["a negative dimension", { ...GOOD_GRPC, inputs: [{ ...input, shape: [-1n, 4n] }] }],
      ["a huge shape", { ...GOOD_GRPC, inputs: [{ ...input, shape: [2n ** 62n, 2n ** 62n] }] }],
      ["a scalar shape for 4 elements", { ...GOOD_GRPC, inputs: [{ ...input, shape: [] }] }],
      ["an unknown datatype", { ...GOOD_GRPC, inputs: [{ ...input, datatype: "FOO" }] }],
      ["an empty datatype", { ...GOOD_GRPC, inputs: [{ ...input, datatype: "" }] }],
      ["BYTES without length prefixes", { ...GOOD_GRPC, inputs: [{ ...input, datatype: "BYTES" }] }],
      ["3 raw bytes for 4 floats", { ...GOOD_GRPC, rawInputContents: [new Uint8Array(3)] }],
      ["two raw entries for one input", { ...GOOD_GRPC, rawInputContents: [f32([1, 2, 3, 4]), f32([1])] }],
      ["no data at all", { ...GOOD_GRPC, rawInputContents: [] }],
      [
        "typed contents of the wrong count",
        { ...GOOD_GRPC, rawInputContents: [], inputs: [{ ...input, contents: { fp32Contents: [1] } }] },
      ],
      [
        "typed contents of the wrong type",
        { ...GOOD_GRPC, rawInputContents: [], inputs: [{ ...input, contents: { intContents: [1, 2, 3, 4] } }] },
      ],
      ["no inputs", { ...GOOD_GRPC, inputs: [], rawInputContents: [] }],
      ["an unknown output", { ...GOOD_GRPC, outputs: [{ name: "NOPE" }] }],
      [
        "a string classification",
        {
          ...GOOD_GRPC,
          outputs: [{ name: "OUTPUT", parameters: { classification: param({ case: "stringParam", value: "x" }) } }],
        },
      ],
      ["a fractional priority", { ...GOOD_GRPC, parameters: { priority: param({ case: "doubleParam", value: 1.5 }) } }],
      ["a version that is no number", { ...GOOD_GRPC, modelVersion: "abc" }],
      ["a version past 2^64", { ...GOOD_GRPC, modelVersion: "99999999999999999999999" }],
      ["no model name", { ...GOOD_GRPC, modelName: "" }],
    ];
    for (const [what, request] of bad) {
      const err = await client.modelInfer(request).then(
        () => undefined,
        (e: ConnectError) => e,
      );
      expect(err, `${what}: answered`).toBeDefined();
      if (!err) continue;
      expect([Code.Internal, Code.Unknown], `${what}: ${Code[err.code]} ${err.rawMessage}`).not.toContain(err.code);
      expect(err.rawMessage.length, what).toBeGreaterThan(0);
    }
    const answer = await client.modelInfer(GOOD_GRPC);
    expect(answer.outputs[0]?.name).toBe("OUTPUT");
  });

  it("gRPC: a NUL in a load's model name or file path, and typed parameters of the wrong type, are INVALID_ARGUMENT", async () => {
    const client = grpcClientOf(server);
    const refusal = async (call: Promise<unknown>): Promise<ConnectError> => {
      const outcome = await call.then(
        () => undefined,
        (err: ConnectError) => err,
      );
      if (!outcome) throw new Error("the call succeeded; a refusal was expected");
      return outcome;
    };
    const cases: [() => Promise<unknown>, RegExp][] = [
      [
        () =>
          client.repositoryModelLoad({
            modelName: "ec\u0000ho",
            parameters: {
              config: param({ case: "stringParam", value: "{}" }),
              "file:1/model.js": param({ case: "bytesParam", value: new Uint8Array([1]) }),
            },
          }),
        /model name .*control character/,
      ],
      [() => client.repositoryModelLoad({ modelName: "ec\u0000ho" }), /model name .*control character/],
      [() => client.repositoryModelUnload({ modelName: "ec\u0000ho" }), /model name .*control character/],
      [
        () =>
          client.repositoryModelLoad({
            modelName: "fresh",
            parameters: {
              config: param({ case: "stringParam", value: "{}" }),
              "file:1/mo\u0000del.js": param({ case: "bytesParam", value: new Uint8Array([1]) }),
            },
          }),
        /control character/,
      ],
      [
        () =>
          client.modelInfer({ ...GOOD_GRPC, parameters: { priority: param({ case: "stringParam", value: "high" }) } }),
        /parameter 'priority' must be an unsigned integer, got "high"/,
      ],
      [
        () => client.modelInfer({ ...GOOD_GRPC, parameters: { priority: param({ case: "int64Param", value: -2n }) } }),
        /parameter 'priority' must be an unsigned integer, got -2/,
      ],
      [
        () => client.modelInfer({ ...GOOD_GRPC, parameters: { timeout: param({ case: "boolParam", value: true }) } }),
        /parameter 'timeout' must be an unsigned integer.*, got true/,
      ],
      [
        () =>
          client.modelInfer({
            ...GOOD_GRPC,
            parameters: { sequence_start: param({ case: "stringParam", value: "x" }) },
          }),
        /parameter 'sequence_start' must be a boolean, got "x"/,
      ],
      [
        () =>
          client.modelInfer({ ...GOOD_GRPC, parameters: { sequence_id: param({ case: "doubleParam", value: 0.5 }) } }),
        /parameter 'sequence_id' must be an unsigned integer or a string, got 0.5/,
      ],
    ];
    for (const [call, message] of cases) {
      const err = await refusal(call());
      expect(err.code, err.rawMessage).toBe(Code.InvalidArgument);
      expect(err.rawMessage).toMatch(message);
    }
    const answer = await client.modelInfer(GOOD_GRPC);
    expect(new Float32Array(Uint8Array.from(answer.rawOutputContents[0] as Uint8Array).buffer)).toEqual(
      new Float32Array([1, 2, 3, 4]),
    );
  });
});

describe("error messages name the model and the reason, not the server's paths or addresses", () => {
  let repo: string;
  let server: ServerProcess;
  let remote: ServerProcess | undefined;
  let deadPort: number;
  beforeAll(async () => {
    deadPort = await freePort();
    remote = undefined;
    repo = await makeRepository({
      echo: { config: echoConfig("echo") },
      nomodule: {
        config: echoConfig("nomodule").replace(/string_value: "[^"]*echo-stage\.js"/, 'string_value: "./missing.js"'),
      },
      badonnx: {
        config: `name: "badonnx"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
`,
        files: { "1/model.onnx": "not an ONNX model" },
      },
      badconfig: { config: 'name: "badconfig"\nbackend: "typescript"\nmax_batch_size: many\n' },
      nofactory: { config: `name: "nofactory"\nbackend: "typescript"\nmax_batch_size: 0\n` },
      badlabels: {
        config: echoConfig("badlabels").replace(
          "dims: [ 4 ] } ]\nparameters",
          'dims: [ 4 ] label_filename: "../../../../etc/passwd" } ]\nparameters',
        ),
      },
      unreachable: { config: echoConfig("unreachable") },
    });
    const endpoints = join(repo, "..", `${repo.split("/").at(-1)}-endpoints.json`);
    await writeFile(endpoints, JSON.stringify({ unreachable: `http://127.0.0.1:${deadPort}` }));
    server = await startServerProcess([...explicitModels(repo, "echo"), "--endpoints", endpoints]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await remote?.stop();
    await removeDir(repo);
  });

  // [model, what the message must say besides the model's name, the detail the log keeps (default: the repository's path)]
  const failures: [string, RegExp, RegExp?][] = [
    ["nomodule", /missing\.js.*not found|cannot import.*missing\.js/],
    ["badonnx", /model\.onnx/],
    ["badconfig", /config\.pbtxt:3:\d+: expected an integer/],
    ["nofactory", /model\.js/],
    [
      "badlabels",
      /label_filename "\.\.\/\.\.\/\.\.\/\.\.\/etc\/passwd" must name a file inside the model's folder/,
      /model failed to load.*label_filename/,
    ],
    ["unreachable", /remote model unreachable.*ECONNREFUSED/, /127\.0\.0\.1:\d+/],
  ];

  it.each(failures)(
    "a failed load of %s names the model and the reason, with no path or address, over HTTP and gRPC",
    async (model, reason, logged) => {
      const http = await post(`${server.http}/v2/repository/models/${model}/load`, "{}");
      expect(http.status).toBeGreaterThanOrEqual(400);
      expect(http.status).toBeLessThan(600);
      const message = String(http.error);
      expect(message).toContain(`'${model}'`);
      expect(message).toMatch(reason);
      expectNoLeak(message, repo);

      const client = grpcClientOf(server);
      const err = await client.repositoryModelLoad({ modelName: model }).then(
        () => undefined,
        (e: ConnectError) => e,
      );
      expect(err?.code).not.toBe(Code.Internal);
      expect(err?.rawMessage).toContain(`'${model}'`);
      expect(err?.rawMessage).toMatch(reason);
      expectNoLeak(err?.rawMessage ?? "", repo);

      // The model index's reason is client-visible too.
      const index = await postJson(`${server.http}/v2/repository/index`, {});
      const row = (index.json as { name: string; reason?: string }[]).find((r) => r.name === model);
      expect(row?.reason).toMatch(reason);
      expectNoLeak(row?.reason ?? "", repo);
      const grpcIndex = await client.repositoryIndex({});
      const grpcRow = grpcIndex.models.find((r) => r.name === model);
      expect(grpcRow?.reason).toMatch(reason);
      expectNoLeak(grpcRow?.reason ?? "", repo);

      // The server's log keeps the detail: where it looked, or what it tried to reach.
      const detail = JSON.stringify(server.logs.filter((l) => JSON.stringify(l).includes(model)));
      expect(detail).toMatch(logged ?? new RegExp(repo));
      if (model === "unreachable") expect(detail).toContain(`127.0.0.1:${deadPort}`);
    },
  );

  it("a remote step that goes away after loading: the request's error names the model, not the remote's address; the log has it", async () => {
    const remoteRepo = await makeRepository({ echo: { config: echoConfig("echo") } });
    const frontRepo = await makeRepository({ echo: { config: echoConfig("echo") } });
    try {
      remote = await startServerProcess(["--model-repository", remoteRepo]);
      const endpoints = join(remoteRepo, "endpoints.json");
      await writeFile(endpoints, JSON.stringify({ echo: remote.grpc }));
      const front = await startServerProcess(["--model-repository", frontRepo, "--endpoints", endpoints]);
      try {
        expect((await postJson(`${front.http}/v2/models/echo/infer`, GOOD)).status).toBe(200);
        expect(await remote.stop("SIGKILL")).toBeNull();
        const http = await postJson(`${front.http}/v2/models/echo/infer`, GOOD);
        expect(http.status).toBe(503);
        expect(http.json.error).toMatch(/remote model echo/);
        expectNoLeak(http.json.error, remoteRepo);
        expect(http.json.error).not.toContain(String(remote.grpcPort));
        const client = grpcClientOf(front);
        const err = await client.modelInfer(GOOD_GRPC).then(
          () => undefined,
          (e: ConnectError) => e,
        );
        expect(err?.code).toBe(Code.Unavailable);
        expect(err?.rawMessage).toMatch(/remote model echo/);
        expectNoLeak(err?.rawMessage ?? "", remoteRepo);
        expect(JSON.stringify(front.logs)).toContain(`127.0.0.1:${remote.grpcPort}`);
      } finally {
        expect(await front.stop()).toBe(0);
      }
    } finally {
      await removeDir(remoteRepo);
      await removeDir(frontRepo);
    }
  });
});
