/**
 * Triton's response cache: a server-wide, size-bounded store of inference
 * results, keyed by a hash of the request (model, version, inputs, and what
 * else shapes the answer), so a repeated request is answered without running
 * the model. Least recently used entries go first when space runs out.
 */
import { createHash } from "node:crypto";
import { tensorFromRaw, tensorToRaw } from "@trellis/kserve/wire";
import type { DataType, InferRequest, InferResponse, Parameters } from "@trellis/stage";
import { framedBytesOf } from "@trellis/stage/backend";

interface Entry {
  modelName: string;
  modelVersion: string;
  outputs: { name: string; datatype: DataType; shape: number[]; raw: Uint8Array }[];
  parameters?: Parameters;
  bytes: number;
}

/** Bookkeeping per entry beyond its tensors' bytes (key, headers), so many tiny entries still fill the cache. */
const ENTRY_OVERHEAD_BYTES = 256;

export interface ResponseCacheStats {
  entries: number;
  bytes: number;
  capacityBytes: number;
  evictions: number;
}

/**
 * Where cached responses live: this process (ResponseCache), or a store the server's
 * replicas share (the server's Redis cache), whose calls may take a round trip.
 */
export interface ResponseStore {
  /** The cached response for `key` (its id the request's), or undefined. */
  lookup(key: string, request: InferRequest): InferResponse | undefined | Promise<InferResponse | undefined>;
  /** Stores `response` under `key`. */
  insert(key: string, response: InferResponse): void | Promise<void>;
  /**
   * Shared by server processes: entries must be scoped by what the model is (its files'
   * contents), not by this process's own count of loads.
   */
  readonly shared?: boolean;
}

export class ResponseCache implements ResponseStore {
  private readonly entries = new Map<string, Entry>();
  private usedBytes = 0;
  private evictions = 0;

  constructor(readonly capacityBytes: number) {
    if (!(capacityBytes > 0)) throw new RangeError(`response cache size must be positive, got ${capacityBytes}`);
  }

  /** A copy of the cached response for `key` (fresh arrays: callers may own and change them), or undefined. */
  lookup(key: string, request: InferRequest): InferResponse | undefined {
    const entry = this.entries.get(key);
    if (!entry) return undefined;
    // Most recently used last.
    this.entries.delete(key);
    this.entries.set(key, entry);
    return {
      id: request.id,
      modelName: entry.modelName,
      modelVersion: entry.modelVersion,
      outputs: entry.outputs.map((o) => tensorFromRaw("output", o, o.raw.slice())),
      parameters: entry.parameters && { ...entry.parameters },
    };
  }

  /** Stores a copy of `response` under `key`; one too large for the whole cache is not stored. */
  insert(key: string, response: InferResponse): void {
    const outputs = response.outputs.map((t) => ({
      name: t.name,
      datatype: t.datatype,
      shape: [...t.shape],
      // tensorToRaw frames BYTES into a new buffer (unless still packed as they came) but views numeric data: copy only views.
      raw: t.datatype === "BYTES" && !framedBytesOf(t.data as Uint8Array[]) ? tensorToRaw(t) : tensorToRaw(t).slice(),
    }));
    const bytes = ENTRY_OVERHEAD_BYTES + key.length + outputs.reduce((n, o) => n + o.raw.byteLength, 0);
    if (bytes > this.capacityBytes) return;
    const previous = this.entries.get(key);
    if (previous) {
      this.entries.delete(key);
      this.usedBytes -= previous.bytes;
    }
    while (this.usedBytes + bytes > this.capacityBytes) {
      const [oldestKey, oldest] = this.entries.entries().next().value as [string, Entry];
      this.entries.delete(oldestKey);
      this.usedBytes -= oldest.bytes;
      this.evictions++;
    }
    this.entries.set(key, {
      modelName: response.modelName,
      modelVersion: response.modelVersion,
      outputs,
      parameters: response.parameters && { ...response.parameters },
      bytes,
    });
    this.usedBytes += bytes;
  }

  stats(): ResponseCacheStats {
    return {
      entries: this.entries.size,
      bytes: this.usedBytes,
      capacityBytes: this.capacityBytes,
      evictions: this.evictions,
    };
  }
}

/**
 * The cache key of `request` to model `scope` (its name, version and which load of it):
 * a SHA-256 over every input's name, datatype, shape and bytes, the requested outputs and
 * their parameters, and the request's parameters. The request id is left out: it does not
 * change the answer.
 */
export function responseCacheKey(scope: string, request: InferRequest): string {
  const hash = createHash("sha256");
  const field = (text: string) => hash.update(`${text.length}:${text}`);
  field(scope);
  const inputs = [...request.inputs].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const t of inputs) {
    field(t.name);
    field(t.datatype);
    field(t.shape.join(","));
    // BYTES elements are hashed as they are, length first, rather than framed into a copy first.
    const parts = t.datatype === "BYTES" ? (t.data as Uint8Array[]) : [tensorToRaw(t)];
    for (const part of parts) {
      field(String(part.byteLength));
      hash.update(part);
    }
  }
  field(typedJson(request.outputs ?? []));
  field(typedJson(request.parameters ?? {}));
  return hash.digest("base64");
}

/**
 * JSON with object keys sorted, so equal values hash equally whatever order they were built in,
 * and each value's type beside it: an int64 5, a double 5 and a string "5" ask different things.
 */
function typedJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(typedJson).join(",")}]`;
  if (value && typeof value === "object") {
    const entries = Object.entries(value)
      .filter(([, v]) => v !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${typedJson(v)}`).join(",")}}`;
  }
  if (value === undefined || value === null) return "null";
  return `${typeof value}:${JSON.stringify(String(value))}`;
}
