/**
 * `pnpm models:fetch`: downloads the real ResNet-50 (ONNX Model Zoo
 * resnet50-v1-12) and the ImageNet labels into the model repository, with
 * a progress bar, SHA-256 verification and a `.part` file renamed into
 * place only once verified.
 */
import { createWriteStream } from "node:fs";
import { mkdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import cliProgress from "cli-progress";
import { type Dispatcher, EnvHttpProxyAgent, fetch as undiciFetch } from "undici";
import {
  type GraphProto,
  ModelProtoSchema,
  readOnnxMetadata,
  StringStringEntryProtoSchema,
  SYNTHETIC_METADATA_KEY,
} from "./onnx.js";
import { exists, sha256File } from "./paths.js";

/**
 * ONNX Model Zoo ResNet-50 v1 (opset 12), MXNet-trained, ImageNet-1k,
 * 102,576,419 bytes. The hash is the Git LFS object id (oid sha256) that
 * onnx/models records for vision/classification/resnet/model/resnet50-v1-12.onnx;
 * it was read from the LFS pointer, not from a download (no network here).
 */
export const RESNET50_ZOO_URL =
  "https://github.com/onnx/models/raw/main/validated/vision/classification/resnet/model/resnet50-v1-12.onnx";
export const RESNET50_ZOO_SHA256 = "ab65bdc02c5b3123eb3cdf6dac01742438517d8635d4f233913b2be1c70db3b6";
export const RESNET50_ZOO_BYTES = 102_576_419;
/** The Zoo model's tensor names, renamed on download to what resnet50_inference/config.pbtxt says. */
export const RESNET50_ZOO_INPUT = "data";
export const RESNET50_ZOO_OUTPUT = "resnetv17_dense0_fwd";

/**
 * pytorch/hub's imagenet_classes.txt (1000 lines, no trailing newline).
 * The hash is that of the copy in the shared fixtures, which came from
 * this file; it could not be checked against the live URL here.
 */
export const IMAGENET_LABELS_URL = "https://raw.githubusercontent.com/pytorch/hub/master/imagenet_classes.txt";
export const IMAGENET_LABELS_SHA256 = "1f386e0d1cb6e28b9c2dac651c3dea6801e98ad1b41a14ce6bb1a093d72069f5";

/** Metadata key on a renamed model: the SHA-256 of the file as downloaded (lets a re-run skip it). */
export const SOURCE_SHA256_KEY = "trellis.source_sha256";

export class OfflineError extends Error {
  override name = "OfflineError";
  /** What the connection failed with (e.g. `ECONNREFUSED: connect ECONNREFUSED 10.0.0.1:443`). */
  readonly detail: string | undefined;
  constructor(
    readonly host: string,
    options?: { cause?: unknown; detail?: string },
  ) {
    super(`cannot reach ${host}: offline? run \`pnpm models:synth\` for a synthetic stand-in`, options);
    this.detail = options?.detail;
  }
}

export class ChecksumError extends Error {
  override name = "ChecksumError";
}

export interface Artifact {
  /** Short name for messages and the progress bar. */
  name: string;
  url: string;
  sha256: string;
  /** Destination relative to the repository root. */
  dest: string;
  /** For ONNX models: rename the graph's input/output to these names. */
  rename?: { input: [from: string, to: string]; output: [from: string, to: string] };
}

/** What `models:fetch` downloads into a Triton-layout repository. */
export function defaultArtifacts(): Artifact[] {
  return [
    {
      name: "resnet50 (ONNX Model Zoo resnet50-v1-12)",
      url: RESNET50_ZOO_URL,
      sha256: RESNET50_ZOO_SHA256,
      dest: "resnet50_inference/1/model.onnx",
      rename: { input: [RESNET50_ZOO_INPUT, "input"], output: [RESNET50_ZOO_OUTPUT, "output"] },
    },
    {
      name: "imagenet_classes.txt",
      url: IMAGENET_LABELS_URL,
      sha256: IMAGENET_LABELS_SHA256,
      dest: "resnet50_postprocess/1/imagenet_classes.txt",
    },
  ];
}

export interface FetchModelsOptions {
  /** The model repository root (e.g. `models/`). */
  repository: string;
  /** Fetch every artifact from `<baseUrl>/<file name>` instead (a mirror, or a test server). */
  baseUrl?: string;
  /** Defaults to defaultArtifacts(). */
  artifacts?: Artifact[];
  /** Show a cli-progress bar on stderr (default: when stderr is a TTY). */
  progress?: boolean;
  /** Re-download even when a verified copy is already there. */
  force?: boolean;
  signal?: AbortSignal;
  log?: (line: string) => void;
  /** Retries of a dropped connection, a timeout or a 5xx, with exponential backoff (default 4). */
  retries?: number;
  /** The first retry's delay; each next one doubles it (default 1000 ms). */
  retryDelayMs?: number;
  /** Seconds without a byte before a request is given up (and retried); default 60. */
  timeoutSeconds?: number;
}

export interface FetchedArtifact {
  name: string;
  path: string;
  sha256: string;
  bytes: number;
  /** False when an already-verified copy was kept. */
  downloaded: boolean;
  renamed: boolean;
}

/** No connection at all: the host is not there (or we are offline). Not retried. */
const UNREACHABLE_CODES = new Set(["ENOTFOUND", "ECONNREFUSED", "ENETUNREACH", "EHOSTUNREACH"]);
/** A connection that failed part-way or timed out: retried, resuming where the body stopped. */
const TRANSIENT_CODES = new Set([
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "EAI_AGAIN",
  "UND_ERR_SOCKET",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_HEADERS_TIMEOUT",
  "UND_ERR_BODY_TIMEOUT",
  "UND_ERR_CLOSED",
]);
/** HTTP statuses worth another try: timeouts, rate limits, and the server's or a proxy's 5xx. */
const transientStatus = (status: number) => status === 408 || status === 429 || status >= 500;

function errorCode(err: unknown, codes: Set<string>): string | undefined {
  for (let e = err as { code?: string; cause?: unknown } | undefined, depth = 0; e && depth < 5; depth++) {
    if (e.code && codes.has(e.code)) return e.code;
    // AggregateError from happy-eyeballs connects
    const errors = (e as { errors?: unknown[] }).errors;
    const inner = errors?.map((x) => errorCode(x, codes)).find(Boolean);
    if (inner) return inner;
    e = e.cause as typeof e;
  }
  return undefined;
}

/** The innermost message and code of a network error, for the log (undici's outer one says only "fetch failed"). */
function describeNetworkError(err: unknown): string {
  let e = err as { message?: string; code?: string; cause?: unknown } | undefined;
  for (let depth = 0; e?.cause && depth < 5; depth++) e = e.cause as typeof e;
  const code = e?.code ?? errorCode(err, UNREACHABLE_CODES) ?? errorCode(err, TRANSIENT_CODES);
  const message = e?.message ?? String(err);
  return code && !message.includes(code) ? `${code}: ${message}` : message;
}

/** An HTTP failure or a transient network one that outlasted the retries. */
export class DownloadError extends Error {
  override name = "DownloadError";
}

/** Renames a graph input and output everywhere they are referenced. */
export function renameGraphTensors(graph: GraphProto, renames: [string, string][]): void {
  const map = new Map(renames.filter(([a, b]) => a !== b));
  if (map.size === 0) return;
  const r = (n: string) => map.get(n) ?? n;
  for (const [from] of map) {
    const known = [...graph.input, ...graph.output].some((v) => v.name === from);
    if (!known) throw new Error(`the model has no graph input or output named ${from}`);
  }
  for (const v of [...graph.input, ...graph.output, ...graph.valueInfo]) v.name = r(v.name ?? "");
  for (const n of graph.node) {
    n.input = n.input.map(r);
    n.output = n.output.map(r);
  }
}

interface DownloadOptions {
  label: string;
  showProgress: boolean;
  dispatcher: Dispatcher;
  retries: number;
  retryDelayMs: number;
  log: (line: string) => void;
  signal?: AbortSignal;
}

/** One attempt's outcome: done, or a failure worth another try (and why). */
type Attempt = { done: true } | { done: false; reason: string };

/**
 * Downloads `url` to `part`, hashing it; returns the hex digest and size. A dropped connection,
 * a timeout or a 5xx is retried with exponential backoff (`retries` times), resuming with a
 * Range request from the bytes already written when the server answers one (206), else
 * starting over. The size is checked against the server's Content-Length (or Content-Range).
 */
async function download(url: string, part: string, o: DownloadOptions): Promise<{ sha256: string; bytes: number }> {
  const host = new URL(url).host;
  await rm(part, { force: true });
  let total = 0;
  for (let attempt = 0; ; attempt++) {
    let outcome: Attempt;
    try {
      outcome = await attemptDownload(url, part, o, (t) => {
        total = t;
      });
    } catch (err) {
      if (o.signal?.aborted) throw err;
      if (errorCode(err, UNREACHABLE_CODES)) {
        throw new OfflineError(host, { cause: err, detail: describeNetworkError(err) });
      }
      if (!errorCode(err, TRANSIENT_CODES)) {
        await rm(part, { force: true });
        throw err instanceof DownloadError
          ? err
          : new Error(`GET ${url} failed: ${(err as Error).message}`, { cause: err });
      }
      outcome = { done: false, reason: describeNetworkError(err) };
    }
    if (outcome.done) break;
    if (attempt >= o.retries) {
      await rm(part, { force: true });
      throw new DownloadError(`GET ${url}: ${outcome.reason} (${attempt + 1} tries)`);
    }
    const delay = o.retryDelayMs * 2 ** attempt;
    o.log(`${o.label}: ${outcome.reason}; retrying in ${delay} ms (${attempt + 1} of ${o.retries} retries)`);
    await sleep(delay, undefined, { signal: o.signal });
  }
  const bytes = (await stat(part)).size;
  if (total && bytes !== total) {
    await rm(part, { force: true });
    throw new DownloadError(`GET ${url}: got ${bytes} bytes, the server announced ${total}`);
  }
  return { sha256: await sha256File(part), bytes };
}

async function attemptDownload(
  url: string,
  part: string,
  o: DownloadOptions,
  setTotal: (total: number) => void,
): Promise<Attempt> {
  const have = (await exists(part)) ? (await stat(part)).size : 0;
  const headers: Record<string, string> = have > 0 ? { range: `bytes=${have}-` } : {};
  const res = await undiciFetch(url, { signal: o.signal, redirect: "follow", dispatcher: o.dispatcher, headers });
  if (res.status === 416 && have > 0) {
    // The range is past the file's end (it changed, or the part is stale): start over.
    await res.body?.cancel();
    await rm(part, { force: true });
    return { done: false, reason: "HTTP 416 for the resumed range" };
  }
  if (!res.ok || !res.body) {
    await res.body?.cancel();
    const reason = `HTTP ${res.status} ${res.statusText}`;
    if (transientStatus(res.status)) return { done: false, reason };
    throw new DownloadError(`GET ${url}: ${reason}`);
  }
  let from = 0;
  let total = Number(res.headers.get("content-length") ?? 0);
  if (res.status === 206 && have > 0) {
    const range = /^bytes (\d+)-\d+\/(\d+|\*)$/.exec(res.headers.get("content-range") ?? "");
    if (range && Number(range[1]) === have) {
      from = have;
      total = range[2] === "*" ? 0 : Number(range[2]);
      o.log(`${o.label}: resuming at byte ${have}`);
    } else {
      await res.body.cancel();
      await rm(part, { force: true });
      return { done: false, reason: `the server resumed at another byte (${res.headers.get("content-range")})` };
    }
  } else if (have > 0) {
    o.log(`${o.label}: the server does not resume downloads; starting over`);
  }
  setTotal(total);
  const bar = o.showProgress
    ? new cliProgress.SingleBar(
        { format: `${o.label} [{bar}] {percentage}% | {value}/{total} bytes | {eta}s left`, stream: process.stderr },
        cliProgress.Presets.shades_classic,
      )
    : undefined;
  bar?.start(total || 1, from);
  let bytes = from;
  const body = Readable.fromWeb(res.body as import("node:stream/web").ReadableStream<Uint8Array>);
  body.on("data", (chunk: Buffer) => {
    bytes += chunk.length;
    if (bar) {
      if (!total) bar.setTotal(bytes);
      bar.update(bytes);
    }
  });
  try {
    // From the start (truncating what was there) or appended to the bytes kept.
    await pipeline(body, createWriteStream(part, { flags: from > 0 ? "a" : "w" }));
  } finally {
    bar?.stop();
  }
  return { done: true };
}

/** Downloads, verifies and installs every artifact; returns what it did for each. */
export async function fetchModels(options: FetchModelsOptions): Promise<FetchedArtifact[]> {
  const artifacts = options.artifacts ?? defaultArtifacts();
  const log = options.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  const showProgress = options.progress ?? process.stderr.isTTY === true;
  const timeout = (options.timeoutSeconds ?? 60) * 1000;
  // HTTP_PROXY / HTTPS_PROXY / NO_PROXY (and their lower-case forms), as curl and npm read them.
  // An http:// target goes to the proxy as an absolute-URI request (as curl sends it); https:// through CONNECT.
  const dispatcher = new EnvHttpProxyAgent({ headersTimeout: timeout, bodyTimeout: timeout, proxyTunnel: false });
  const downloadOptions = {
    showProgress,
    dispatcher,
    retries: options.retries ?? 4,
    retryDelayMs: options.retryDelayMs ?? 1000,
    log,
    ...(options.signal ? { signal: options.signal } : {}),
  };
  try {
    return await fetchEach(artifacts, options, log, downloadOptions);
  } finally {
    await dispatcher.close();
  }
}

async function fetchEach(
  artifacts: Artifact[],
  options: FetchModelsOptions,
  log: (line: string) => void,
  downloadOptions: Omit<DownloadOptions, "label">,
): Promise<FetchedArtifact[]> {
  const results: FetchedArtifact[] = [];
  for (const a of artifacts) {
    const url = options.baseUrl ? `${options.baseUrl.replace(/\/+$/, "")}/${basename(new URL(a.url).pathname)}` : a.url;
    const dest = join(options.repository, a.dest);
    await mkdir(dirname(dest), { recursive: true });

    if (!options.force && (await exists(dest))) {
      const kept = await alreadyInstalled(a, dest);
      if (kept) {
        log(`${a.name}: already installed and verified at ${dest}`);
        results.push({ ...kept, name: a.name, path: dest, downloaded: false });
        continue;
      }
    }

    const part = `${dest}.part`;
    log(`${a.name}: downloading ${url}`);
    const got = await download(url, part, { ...downloadOptions, label: a.name });
    if (got.sha256 !== a.sha256) {
      await rm(part, { force: true });
      throw new ChecksumError(
        `${a.name}: SHA-256 mismatch for ${url}: expected ${a.sha256}, got ${got.sha256} (${got.bytes} bytes); the partial download was deleted`,
      );
    }
    let renamed = false;
    if (a.rename) {
      // Keep config.pbtxt as it is: give the graph the names it expects.
      const model = fromBinary(ModelProtoSchema, await readFile(part));
      if (!model.graph) throw new Error(`${a.name}: the download has no graph`);
      renameGraphTensors(model.graph, [a.rename.input, a.rename.output]);
      model.metadataProps = model.metadataProps.filter(
        (p) => p.key !== SYNTHETIC_METADATA_KEY && p.key !== SOURCE_SHA256_KEY,
      );
      model.metadataProps.push(create(StringStringEntryProtoSchema, { key: SOURCE_SHA256_KEY, value: got.sha256 }));
      await writeFile(part, toBinary(ModelProtoSchema, model));
      renamed = true;
    }
    await rename(part, dest);
    log(`${a.name}: verified sha256 ${got.sha256}${renamed ? ", graph tensors renamed" : ""} -> ${dest}`);
    results.push({ name: a.name, path: dest, sha256: got.sha256, bytes: got.bytes, downloaded: true, renamed });
  }
  return results;
}

/** An existing destination that provably came from this artifact, or undefined. */
async function alreadyInstalled(
  a: Artifact,
  dest: string,
): Promise<{ sha256: string; bytes: number; renamed: boolean } | undefined> {
  const bytes = (await stat(dest)).size;
  if (a.rename) {
    try {
      const meta = await readOnnxMetadata(dest);
      if (meta.metadata[SOURCE_SHA256_KEY] === a.sha256) return { sha256: a.sha256, bytes, renamed: true };
    } catch {
      // not a readable ONNX file: download again
    }
    return undefined;
  }
  const sha = await sha256File(dest);
  return sha === a.sha256 ? { sha256: sha, bytes, renamed: false } : undefined;
}
