/**
 * Black-box test helpers: temp model repositories, the real server process
 * (node dist/main.js) on ephemeral loopback ports, and small HTTP clients.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { copyFile, mkdir, mkdtemp, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

export const SERVER_DIR = join(import.meta.dirname, "..");
export const REPO_ROOT = join(SERVER_DIR, "..", "..");
export const SHARED = join(REPO_ROOT, "..", "shared");
export const ECHO_STAGE = join(import.meta.dirname, "fixtures", "echo-stage.js");

export interface ModelSpec {
  /** config.pbtxt text. */
  config: string;
  versions?: string[];
  /** Extra files, path relative to the model directory -> contents. */
  files?: Record<string, string>;
}

export async function makeRepository(models: Record<string, ModelSpec>): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "trellis-repo-"));
  for (const [name, spec] of Object.entries(models)) await addModel(dir, name, spec);
  return dir;
}

export async function addModel(repository: string, name: string, spec: ModelSpec): Promise<void> {
  const modelDir = join(repository, name);
  await mkdir(modelDir, { recursive: true });
  await writeFile(join(modelDir, "config.pbtxt"), spec.config);
  for (const v of spec.versions ?? ["1"]) await mkdir(join(modelDir, v), { recursive: true });
  for (const [path, text] of Object.entries(spec.files ?? {})) {
    await mkdir(join(modelDir, path, ".."), { recursive: true });
    await writeFile(join(modelDir, path), text);
  }
}

/** config.pbtxt of an echo test model (OUTPUT = INPUT * scale) served by test/fixtures/echo-stage.js. */
export function echoConfig(
  name: string,
  opts: { datatype?: string; dims?: number[]; maxBatch?: number; extra?: string; params?: Record<string, string> } = {},
): string {
  const params = { module: ECHO_STAGE, ...opts.params };
  return `name: "${name}"
backend: "typescript"
max_batch_size: ${opts.maxBatch ?? 8}
input [ { name: "INPUT" data_type: ${opts.datatype ?? "TYPE_FP32"} dims: [ ${(opts.dims ?? [4]).join(", ")} ] } ]
output [ { name: "OUTPUT" data_type: ${opts.datatype ?? "TYPE_FP32"} dims: [ ${(opts.dims ?? [4]).join(", ")} ] } ]
${Object.entries(params)
  .map(([k, v]) => `parameters { key: "${k}" value: { string_value: "${v}" } }`)
  .join("\n")}
${opts.extra ?? ""}
`;
}

/**
 * The seed repository (models/*\/config.pbtxt) with the shared MobileNetV2
 * as resnet50_inference and the shared ImageNet labels for postprocess.
 */
export async function makeSeedRepository(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "trellis-seed-"));
  for (const name of (await readdir(join(REPO_ROOT, "models"))).filter((n) => n.startsWith("resnet50_"))) {
    await mkdir(join(dir, name, "1"), { recursive: true });
    await copyFile(join(REPO_ROOT, "models", name, "config.pbtxt"), join(dir, name, "config.pbtxt"));
  }
  await symlink(join(SHARED, "models", "mobilenetv2-12-int8.onnx"), join(dir, "resnet50_inference", "1", "model.onnx"));
  await copyFile(
    join(SHARED, "models", "imagenet_classes.txt"),
    join(dir, "resnet50_postprocess", "1", "imagenet_classes.txt"),
  );
  return dir;
}

export const removeDir = (dir: string) => rm(dir, { recursive: true, force: true });

export interface ServerProcess {
  proc: ChildProcess;
  http: string;
  grpc: string;
  metrics: string;
  httpPort: number;
  grpcPort: number;
  /** Every JSON log line so far. */
  logs: Record<string, unknown>[];
  /** Resolves with the exit code. */
  exited: Promise<number | null>;
  /** Sends `signal` and waits for the exit code. */
  stop(signal?: NodeJS.Signals): Promise<number | null>;
}

/** Starts `node dist/main.js` on ephemeral ports; resolves once it logs "server started". */
export async function startServerProcess(args: string[]): Promise<ServerProcess> {
  const proc = spawn(
    process.execPath,
    [
      join(SERVER_DIR, "dist", "main.js"),
      "--http-port",
      "0",
      "--grpc-port",
      "0",
      "--metrics-port",
      "0",
      "--no-fetch-models",
      ...args,
    ],
    { cwd: SERVER_DIR, stdio: ["ignore", "pipe", "pipe"] },
  );
  const logs: Record<string, unknown>[] = [];
  const ports: Record<string, number> = {};
  let stderr = "";
  proc.stderr?.on("data", (d) => {
    stderr += String(d);
  });
  const exited = new Promise<number | null>((resolve) => proc.on("exit", (code) => resolve(code)));
  const started = new Promise<void>((resolve, reject) => {
    const lines = createInterface({ input: proc.stdout as NodeJS.ReadableStream });
    lines.on("line", (line) => {
      let entry: Record<string, unknown>;
      try {
        entry = JSON.parse(line);
      } catch {
        return;
      }
      logs.push(entry);
      if (entry.msg === "listening") ports[entry.protocol as string] = entry.port as number;
      if (entry.msg === "server started") resolve();
    });
    exited.then((code) => reject(new Error(`server exited with ${code} before starting:\n${stderr}`)));
  });
  await started;
  const host = "http://127.0.0.1";
  return {
    proc,
    logs,
    exited,
    httpPort: ports.http as number,
    grpcPort: ports.grpc as number,
    http: `${host}:${ports.http}`,
    grpc: `${host}:${ports.grpc}`,
    metrics: `${host}:${ports.metrics}`,
    stop: async (signal = "SIGTERM") => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill(signal);
      return exited;
    },
  };
}

/** A metric's value for {model, version} from Prometheus text (0 when absent). */
export function metricValue(text: string, name: string, model: string, version = "1"): number {
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`)) continue;
    if (line.includes(`model="${model}"`) && line.includes(`version="${version}"`)) {
      return Number(line.slice(line.lastIndexOf(" ") + 1));
    }
  }
  return 0;
}

export async function scrape(server: ServerProcess): Promise<string> {
  const res = await fetch(`${server.metrics}/metrics`);
  if (res.status !== 200) throw new Error(`/metrics answered ${res.status}`);
  return res.text();
}

// biome-ignore lint/suspicious/noExplicitAny: test responses are inspected field by field
export async function postJson(url: string, body: unknown): Promise<{ status: number; json: any }> {
  const res = await fetch(url, {
    method: "POST",
    body: JSON.stringify(body),
    headers: { "content-type": "application/json" },
  });
  const text = await res.text();
  return { status: res.status, json: text ? JSON.parse(text) : undefined };
}

/** Splits a binary-extension response into its JSON header and the binary chunks of each output. */
// biome-ignore lint/suspicious/noExplicitAny: test responses are inspected field by field
export async function binaryResponse(res: Response): Promise<{ json: any; outputs: Map<string, Uint8Array> }> {
  const body = new Uint8Array(await res.arrayBuffer());
  const headerLength = Number(res.headers.get("inference-header-content-length") ?? body.byteLength);
  const json = JSON.parse(new TextDecoder().decode(body.subarray(0, headerLength)));
  const outputs = new Map<string, Uint8Array>();
  let offset = headerLength;
  for (const o of json.outputs ?? []) {
    const size = o.parameters?.binary_data_size;
    if (size === undefined) continue;
    outputs.set(o.name, body.slice(offset, offset + size));
    offset += size;
  }
  return { json, outputs };
}

/** A binary-extension request body: JSON header + the inputs' raw bytes. */
export function binaryRequest(
  header: { inputs: { name: string; datatype: string; shape: number[] }[]; [k: string]: unknown },
  raws: Uint8Array[],
): { body: Uint8Array; headerLength: number } {
  const inputs = header.inputs.map((input, i) => ({
    ...input,
    parameters: { binary_data_size: (raws[i] as Uint8Array).byteLength },
  }));
  const json = new TextEncoder().encode(JSON.stringify({ ...header, inputs }));
  let total = json.byteLength;
  for (const r of raws) total += r.byteLength;
  const body = new Uint8Array(total);
  body.set(json, 0);
  let offset = json.byteLength;
  for (const r of raws) {
    body.set(r, offset);
    offset += r.byteLength;
  }
  return { body, headerLength: json.byteLength };
}

/** FP32 values of raw bytes (copied: gRPC clients hand out views into pooled buffers). */
export const floats = (raw: Uint8Array) => new Float32Array(Uint8Array.from(raw).buffer);

/** A response body as JSON, for field-by-field assertions. */
// biome-ignore lint/suspicious/noExplicitAny: test responses are inspected field by field
export const jsonOf = async (res: Response): Promise<any> => res.json();
