/**
 * What the page asks the server, over Connect (binary protobuf) to the same
 * GRPCInferenceService the gRPC port serves, on the HTTP port that served the page.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import {
  DataType,
  GRPCInferenceService,
  type ModelConfig,
  ModelInferRequestSchema,
  type ModelStatistics,
} from "@trellis/protocol";
import { bytesElements, type Label, labelsOf } from "./outputs.js";

const client = createClient(
  GRPCInferenceService,
  createConnectTransport({ baseUrl: location.origin, useBinaryFormat: true }),
);

export interface IndexRow {
  name: string;
  version: string;
  state: string;
  reason: string;
}

export const repositoryIndex = async (): Promise<IndexRow[]> => (await client.repositoryIndex({})).models;

/** A model the page can send an image to: one BYTES input, and an output it can read a top-5 from. */
export interface Classifier {
  name: string;
  input: string;
  batched: boolean;
  output: string;
  /** The output is numbers: ask the server for Triton's classification extension ("score:index:label"). */
  classify: boolean;
  /** An ensemble's step models, in order (timings are shown per step); the model itself otherwise. */
  steps: string[];
}

/** The classifier a model's config describes, or undefined when it takes no single encoded image. */
export function classifierOf(config: ModelConfig): Classifier | undefined {
  const [input, ...moreInputs] = config.input;
  const output = config.output[0];
  if (!input || moreInputs.length > 0 || input.dataType !== DataType.TYPE_STRING || !output) return undefined;
  // A numeric output must be one score per class (a preprocessing model's image tensor is not).
  if (output.dataType !== DataType.TYPE_STRING && output.dims.length !== 1) return undefined;
  const sched = config.schedulingChoice;
  const steps = sched.case === "ensembleScheduling" ? sched.value.step.map((s) => s.modelName) : [];
  return {
    name: config.name,
    input: input.name,
    batched: config.maxBatchSize > 0,
    output: output.name,
    classify: output.dataType !== DataType.TYPE_STRING,
    steps: steps.length > 0 ? steps : [config.name],
  };
}

export async function classifiers(names: string[]): Promise<Classifier[]> {
  const found: Classifier[] = [];
  for (const name of names) {
    const config = await client.modelConfig({ name }).then(
      (r) => r.config,
      () => undefined,
    );
    const c = config && classifierOf(config);
    if (c) found.push(c);
  }
  // Ensembles first: they are the pipelines.
  return found.sort((a, b) => Number(b.steps[0] !== b.name) - Number(a.steps[0] !== a.name));
}

/** The server's answer for one image: its top-5, or its error in its own words; and the request's id (its trace). */
export type Answer = ({ labels: Label[] } | { error: string; code: string }) & { requestId: string };

/** Asks the server to trace this one request (kept among its recent traces for the waterfall). */
const TRACE_ASK = { "trellis-trace": "1" };

export async function classify(c: Classifier, image: Uint8Array): Promise<Answer> {
  const framed = new Uint8Array(4 + image.length);
  new DataView(framed.buffer).setUint32(0, image.length, true);
  framed.set(image, 4);
  const requestId = crypto.randomUUID();
  const request = create(ModelInferRequestSchema, {
    id: requestId,
    modelName: c.name,
    inputs: [{ name: c.input, datatype: "BYTES", shape: c.batched ? [1n, 1n] : [1n] }],
    rawInputContents: [framed],
    outputs: [
      {
        name: c.output,
        parameters: c.classify ? { classification: { parameterChoice: { case: "int64Param", value: 5n } } } : {},
      },
    ],
  });
  try {
    const res = await client.modelInfer(request, { headers: TRACE_ASK });
    const raw = res.rawOutputContents[0];
    const strings = raw
      ? bytesElements(raw)
      : (res.outputs[0]?.contents?.bytesContents ?? []).map((b) => new TextDecoder().decode(b));
    return { labels: labelsOf(strings).slice(0, 5), requestId };
  } catch (err) {
    const e = ConnectError.from(err);
    return { error: e.rawMessage, code: Code[e.code] ?? String(e.code), requestId };
  }
}

/** Per model name, its statistics summed over its versions. */
export type Stats = Map<string, Totals>;
export interface Totals {
  version: string;
  success: number;
  successNs: number;
  fail: number;
  queueNs: number;
  computeNs: number;
}

const n = (x: bigint | undefined) => Number(x ?? 0n);

export async function statistics(): Promise<Stats> {
  const res = await client.modelStatistics({ name: "", version: "" });
  const out: Stats = new Map();
  const add = (s: ModelStatistics) => {
    const t = out.get(s.name) ?? { version: "", success: 0, successNs: 0, fail: 0, queueNs: 0, computeNs: 0 };
    const i = s.inferenceStats;
    t.version = t.version ? `${t.version}, ${s.version}` : s.version;
    t.success += n(i?.success?.count);
    t.successNs += n(i?.success?.ns);
    t.fail += n(i?.fail?.count);
    t.queueNs += n(i?.queue?.ns);
    t.computeNs += n(i?.computeInput?.ns) + n(i?.computeInfer?.ns) + n(i?.computeOutput?.ns);
    out.set(s.name, t);
  };
  res.modelStats.forEach(add);
  return out;
}

/** What one step took between two statistics snapshots, per request that step answered in between. */
export interface StepTime {
  model: string;
  requests: number;
  totalMs: number;
  queueMs: number;
  computeMs: number;
}

export function stepTimes(steps: string[], before: Stats, after: Stats): StepTime[] {
  return steps.map((model) => {
    const a = after.get(model);
    const b = before.get(model);
    const requests = (a?.success ?? 0) - (b?.success ?? 0);
    const per = (k: "successNs" | "queueNs" | "computeNs") =>
      requests > 0 ? ((a?.[k] ?? 0) - (b?.[k] ?? 0)) / requests / 1e6 : 0;
    return { model, requests, totalMs: per("successNs"), queueMs: per("queueNs"), computeMs: per("computeNs") };
  });
}
