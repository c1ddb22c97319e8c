/**
 * Issue 52 item 1, black-box: a load request's file names are judged as they will be written.
 * `1/model.js/`, `1/model.js/.` and `1/x/../model.js` all write `1/model.js`; each spelling of
 * each file a loader would run (Node, Python, a config's own code file) is refused before
 * anything is written, over HTTP and gRPC, alone and beside harmless files, while good requests
 * are in flight; every payload would write a marker file if it ran, and none ever appears.
 */
import { existsSync } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ECHO_STAGE, echoConfig, explicitModels, grpcClientOf, makeRepository, postJson } from "./helpers.js";

const PY_CONFIG = `name: "pymodel"
backend: "python"
default_model_filename: "preprocess.py"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
`;
const JS_CONFIG = `name: "jsmodel"
backend: "typescript"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
`;
// A stage whose repository config names its code file without an extension (Node runs it as CommonJS).
const NAMED_CONFIG = `${JS_CONFIG.replace('"jsmodel"', '"named"')}parameters { key: "module" value: { string_value: "./stage" } }\n`;

/** Each model's config as a load request sends it (Triton's JSON), the same as the repository's. */
const configJson: Record<string, string> = {
  pymodel: JSON.stringify({ name: "pymodel", backend: "python", default_model_filename: "preprocess.py" }),
  jsmodel: JSON.stringify({ name: "jsmodel", backend: "typescript" }),
  named: JSON.stringify({ name: "named", backend: "typescript", parameters: { module: { string_value: "./stage" } } }),
};

/** Spellings of the files a loader would run, by model (each names the file it writes). */
const ATTACKS: Record<string, string[]> = {
  jsmodel: [
    "1/model.js/",
    "1/model.js/.",
    "1/x/../model.js",
    "1/x/../model.js/.",
    "1/./MODEL.JS//",
    "1//model.mjs/",
    "1/model.cjs/./",
    "1/x/y/../../model.js/.",
    "1/node_modules/evil/index.txt",
    "1/package.json/.",
  ],
  pymodel: [
    "1/preprocess.py/",
    "1/preprocess.py/.",
    "1/x/../preprocess.py/.",
    "1/PREPROCESS.PY/",
    "1/model.py/.",
    "1/helper.py/.",
    "1/pkg/__init__.py/",
    "1/helper.cpython-311-x86_64-linux-gnu.so/.",
    "1/libhelper.so.1",
    "1/__pycache__/helper.cpython-311.pyc",
    "1/helper.PYC/.",
    "1/evil.pth/",
  ],
  named: ["1/stage", "1/stage/", "1/x/../stage/.", "1/STAGE"],
};

/** Code that proves it ran by writing `marker`: JavaScript for Node, Python for the stub. */
const payload = (model: string, marker: string) =>
  Buffer.from(
    model === "pymodel"
      ? `open(${JSON.stringify(marker)}, "w").write("ran")\n`
      : `require("node:fs").writeFileSync(${JSON.stringify(marker)}, "ran");\n`,
  );

let repo: string;
let markers: string;
let server: ServerProcess;

beforeAll(async () => {
  repo = await makeRepository({
    echo: { config: echoConfig("echo") },
    pymodel: { config: PY_CONFIG },
    jsmodel: { config: JS_CONFIG },
    named: { config: NAMED_CONFIG },
  });
  markers = await mkdtemp(join(tmpdir(), "trellis-markers-"));
  server = await startServerProcess(explicitModels(repo, "echo"));
});
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
  await removeDir(markers);
});

/** Echo requests in a loop until `done` says stop; resolves with [answered 200, other]. */
async function goodTraffic(done: () => boolean): Promise<[number, number]> {
  let ok = 0;
  let bad = 0;
  while (!done()) {
    const res = await postJson(`${server.http}/v2/models/echo/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
    });
    if (res.status === 200 && res.json.outputs[0].data[3] === 4) ok++;
    else bad++;
  }
  return [ok, bad];
}

type Refusal = { status: "http" | "grpc"; code: number | Code; message: string };

async function loadOverHttp(model: string, files: Record<string, Buffer>): Promise<Refusal> {
  const parameters: Record<string, string> = { config: configJson[model] as string };
  for (const [path, bytes] of Object.entries(files)) parameters[`file:${path}`] = bytes.toString("base64");
  const res = await postJson(`${server.http}/v2/repository/models/${model}/load`, { parameters });
  return { status: "http", code: res.status, message: String(res.json?.error ?? "") };
}

async function loadOverGrpc(model: string, files: Record<string, Buffer>): Promise<Refusal> {
  const parameters: Record<
    string,
    { parameterChoice: { case: "stringParam"; value: string } | { case: "bytesParam"; value: Uint8Array } }
  > = {
    config: { parameterChoice: { case: "stringParam", value: configJson[model] as string } },
  };
  for (const [path, bytes] of Object.entries(files)) {
    parameters[`file:${path}`] = { parameterChoice: { case: "bytesParam", value: bytes } };
  }
  const err = await grpcClientOf(server)
    .repositoryModelLoad({ modelName: model, parameters })
    .then(() => undefined)
    .catch((e: unknown) => e);
  if (!(err instanceof ConnectError)) return { status: "grpc", code: Code.Unknown, message: `answered ${String(err)}` };
  return { status: "grpc", code: err.code, message: err.rawMessage };
}

describe("uploaded code, however its name is spelled", () => {
  it("is refused before anything is written, over HTTP and gRPC, alone or beside harmless files", async () => {
    let finished = false;
    const traffic = [goodTraffic(() => finished), goodTraffic(() => finished)];
    const seen: string[] = [];
    try {
      let n = 0;
      for (const [model, paths] of Object.entries(ATTACKS)) {
        for (const path of paths) {
          const marker = join(markers, `ran-${n++}.txt`);
          const code = payload(model, marker);
          // Alone; beside a harmless weights file; and beside a second spelling of a code file.
          const requests: Record<string, Buffer>[] = [
            { [path]: code },
            { "1/weights.bin": Buffer.from([1, 2, 3]), [path]: code },
            { [path]: code, [(ATTACKS[model] as string[])[0] as string]: code },
          ];
          for (const files of requests) {
            for (const answer of await Promise.all([loadOverHttp(model, files), loadOverGrpc(model, files)])) {
              const expected = answer.status === "http" ? 403 : Code.PermissionDenied;
              // Two spellings of one file are refused as such (400) when they collide, before either is judged.
              const collide =
                Object.keys(files).length === 2 && !("1/weights.bin" in files) && files[path] !== undefined;
              if (collide && answer.code !== expected) {
                expect([400, Code.InvalidArgument], `${model} ${path} ${answer.status}`).toContain(answer.code);
                expect(answer.message).toContain("names the file");
                continue;
              }
              expect(answer.code, `${model} ${path} ${answer.status}: ${answer.message}`).toBe(expected);
              expect(answer.message).toContain("--allow-unsafe-load-overrides");
              expect(answer.message).not.toContain(tmpdir());
              seen.push(answer.message);
            }
          }
          expect(existsSync(marker), `${model} ${path}`).toBe(false);
        }
      }
    } finally {
      finished = true;
    }
    const [a, b] = await Promise.all(traffic);
    expect(a[1] + b[1]).toBe(0);
    expect(a[0] + b[0]).toBeGreaterThan(0);
    // The refusals name the file as sent and as it would have been written.
    expect(seen).toContain(
      "failed to load 'pymodel': file override 'file:1/x/../preprocess.py/.' (written as '1/preprocess.py') is executable code; the server refuses this unless started with --allow-unsafe-load-overrides",
    );
    expect(
      seen.some((m) =>
        m.includes("'file:1/stage/' (written as '1/stage') is the file the model's config runs as code"),
      ),
    ).toBe(true);
    // None of the models was loaded by any of it.
    const index = await postJson(`${server.http}/v2/repository/index`, {});
    const states = Object.fromEntries(
      (index.json as { name: string; state?: string }[]).map((m) => [m.name, m.state ?? ""]),
    );
    expect(states.echo).toBe("READY");
    for (const model of Object.keys(ATTACKS)) expect(states[model], model).not.toBe("READY");
  });

  it("still takes data files whatever their spelling, and refuses one file named twice", async () => {
    const echoJson = JSON.stringify({
      name: "echo",
      backend: "typescript",
      max_batch_size: 8,
      input: [{ name: "INPUT", data_type: "TYPE_FP32", dims: [4] }],
      output: [{ name: "OUTPUT", data_type: "TYPE_FP32", dims: [4] }],
      parameters: { module: { string_value: ECHO_STAGE } },
    });
    const data = Buffer.from("notes").toString("base64");
    const ok = await postJson(`${server.http}/v2/repository/models/echo/load`, {
      parameters: { config: echoJson, "file:1/notes.txt/.": data, "file:1/x/../readme.md/": data },
    });
    expect(ok.status, JSON.stringify(ok.json)).toBe(200);
    const twice = await postJson(`${server.http}/v2/repository/models/echo/load`, {
      parameters: { config: echoJson, "file:1/notes.txt": data, "file:1/notes.txt/": data },
    });
    expect(twice.status).toBe(400);
    expect(twice.json.error).toBe(
      "failed to load 'echo': file override 'file:1/notes.txt/' names the file '1/notes.txt' again",
    );
    // A name that leaves the folder once folded is still refused as such.
    const out = await postJson(`${server.http}/v2/repository/models/echo/load`, {
      parameters: { config: echoJson, "file:1/../../x.txt": data },
    });
    expect(out.status).toBe(400);
    expect(out.json.error).toContain("must be a path inside the model's folder");
    // Back to the repository's echo, which answers.
    expect((await postJson(`${server.http}/v2/repository/models/echo/load`, {})).status).toBe(200);
    const res = await postJson(`${server.http}/v2/models/echo/infer`, {
      inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }],
    });
    expect(res.json.outputs[0].data).toEqual([1, 2, 3, 4]);
  });
});

describe("--allow-unsafe-load-overrides, for contrast", () => {
  it("runs the same folded spelling: the attack above is real", async () => {
    const optIn = await startServerProcess([...explicitModels(repo), "--allow-unsafe-load-overrides"]);
    try {
      const marker = join(markers, "opted-in.txt");
      const res = await postJson(`${optIn.http}/v2/repository/models/jsmodel/load`, {
        parameters: {
          config: configJson.jsmodel,
          "file:1/x/../model.js/.": payload("jsmodel", marker).toString("base64"),
        },
      });
      // The code ran (it exports no createStage, so the load then fails).
      expect(existsSync(marker)).toBe(true);
      expect(res.status).toBe(400);
    } finally {
      expect(await optIn.stop()).toBe(0);
    }
  });
});
