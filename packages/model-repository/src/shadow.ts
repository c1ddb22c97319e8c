/**
 * Shadow mode: proving a replacement model answers as the model it replaces, on live traffic.
 *
 * A model whose config names `shadow_model` (say a TypeScript stage replacing a Python
 * `model.py`, both loaded) sends 1 in `shadow_sample_every` of its requests to that model too, and
 * compares the two answers output by output: numbers by max |Δ| and mismatching elements, strings
 * byte for byte. The client gets the model's own answer, never waits for the shadow's, and never
 * sees the shadow's errors. At most {@link SHADOW_MAX_IN_FLIGHT} shadow requests per model run at
 * once; a sample beyond that is skipped (and counted), so a slow shadow cannot pile up work.
 */
import type { ModelConfig } from "@trellis/protocol";
import type { Model, ModelInterceptor } from "@trellis/runtime";
import {
  Code,
  type InferRequest,
  type InferResponse,
  type RequestedOutput,
  type Stage,
  StageError,
  type StageLogger,
  type Tensor,
} from "@trellis/stage";

/** One output's agreement between a reference model and its replacement. */
export interface OutputAgreement {
  /** `<model>.<output>` */
  output: string;
  /** Requests compared. */
  requests: number;
  elements: number;
  /** Numbers: elements whose values differ; strings: elements whose bytes differ. */
  mismatching: number;
  /** Numbers only: the largest |reference - replacement|. */
  maxAbsDelta?: number;
  /** Requests both models refused (agreeing), and requests only one refused (disagreeing). */
  bothFailed?: number;
  oneFailed?: number;
}

/**
 * Adds one pair of answers to the running agreement of each output (keyed `<model>.<output>`);
 * returns the elements that differed. An output one side lacks, or of another length, is an error.
 */
export function compareAnswers(
  model: string,
  reference: InferResponse,
  replacement: InferResponse,
  into: Map<string, OutputAgreement>,
): number {
  let differing = 0;
  for (const p of reference.outputs) {
    const t = replacement.outputs.find((o) => o.name === p.name);
    const key = `${model}.${p.name}`;
    const row = into.get(key) ?? { output: key, requests: 0, elements: 0, mismatching: 0 };
    into.set(key, row);
    row.requests += 1;
    if (!t) throw new Error(`${key}: the replacement gave no output ${p.name}`);
    const before = row.mismatching;
    compareTensors(p, t, row);
    differing += row.mismatching - before;
  }
  return differing;
}

function compareTensors(p: Tensor, t: Tensor, row: OutputAgreement): void {
  const pd = p.data as ArrayLike<unknown>;
  const td = t.data as ArrayLike<unknown>;
  if (pd.length !== td.length)
    throw new Error(`${row.output}: ${pd.length} elements from the reference, ${td.length} from the replacement`);
  row.elements += pd.length;
  if (p.datatype === "BYTES") {
    for (let i = 0; i < pd.length; i++)
      if (Buffer.compare(pd[i] as Uint8Array, td[i] as Uint8Array) !== 0) row.mismatching++;
    return;
  }
  let max = row.maxAbsDelta ?? 0;
  for (let i = 0; i < pd.length; i++) {
    const d = Math.abs(Number(pd[i]) - Number(td[i]));
    if (d !== 0 || Number.isNaN(d)) row.mismatching++;
    if (d > max) max = d;
  }
  row.maxAbsDelta = max;
}

/** Shadow requests one model may have running at once; samples beyond are skipped. */
export const SHADOW_MAX_IN_FLIGHT = 4;

export interface ShadowSettings {
  /** The model compared against (config parameter `shadow_model`). */
  model: string;
  /** 1 in this many requests is also sent to it (`shadow_sample_every`, default 1: every request). */
  every: number;
}

/** The config's shadow settings, or undefined when it names no `shadow_model`; a bad value fails the load. */
export function shadowSettings(config: ModelConfig): ShadowSettings | undefined {
  const param = (key: string) => config.parameters[key]?.stringValue?.trim();
  const model = param("shadow_model");
  const every = param("shadow_sample_every");
  if (!model) {
    if (every)
      throw new StageError(Code.InvalidArgument, config.name, "shadow_sample_every is set without shadow_model");
    return undefined;
  }
  if (model === config.name) {
    throw new StageError(Code.InvalidArgument, config.name, "shadow_model names the model itself");
  }
  const n = every === undefined || every === "" ? 1 : Number(every);
  if (!Number.isInteger(n) || n < 1 || n > 1_000_000) {
    throw new StageError(
      Code.InvalidArgument,
      config.name,
      `shadow_sample_every must be an integer from 1 to 1000000, got ${every}`,
    );
  }
  return { model, every: n };
}

/** The running agreement of a model with its shadow, since it loaded. */
export interface ShadowAgreement {
  /** The model compared against. */
  shadow: string;
  every: number;
  /** Requests sampled and sent to the shadow. */
  sampled: number;
  /** Answers of both that agreed on every output, and those that did not. */
  agreed: number;
  differed: number;
  /** Sampled requests the shadow failed (or could not be reached) while the model answered. */
  shadowFailed: number;
  /** Samples not sent: the model itself failed them, or the shadow already had its most in flight. */
  skipped: number;
  outputs: OutputAgreement[];
}

/** Finds the shadow model's stage when a sample is sent (it may be loaded, unloaded or reloaded meanwhile). */
export type ShadowResolver = (name: string) => Stage;

/** How many disagreements of a model are logged, each with what differed (the counts go on). */
const LOGGED_DISAGREEMENTS = 5;

export class ShadowComparer {
  private seen = 0;
  private inFlight = 0;
  private logged = 0;
  private readonly counts = { sampled: 0, agreed: 0, differed: 0, shadowFailed: 0, skipped: 0 };
  private readonly outputs = new Map<string, OutputAgreement>();

  constructor(
    private readonly model: string,
    readonly settings: ShadowSettings,
    private readonly resolveShadow: ShadowResolver,
    private readonly logger?: StageLogger,
  ) {}

  /**
   * Called before the model runs a request: when this one is sampled, a copy of it (the model may
   * take its input buffers over); otherwise undefined.
   */
  sample(request: InferRequest): InferRequest | undefined {
    this.seen++;
    if (this.seen % this.settings.every !== 0) return undefined;
    if (this.inFlight >= SHADOW_MAX_IN_FLIGHT) {
      this.counts.skipped++;
      return undefined;
    }
    const copy: InferRequest = {
      ...request,
      inputs: request.inputs.map((t) => ({ ...t, data: copyData(t.data) }) as Tensor),
    };
    // Compared before classification (the model's answer is, too): the shadow is not asked for it.
    if (request.outputs) copy.outputs = request.outputs.map(withoutClassification);
    return copy;
  }

  /** Sends the sampled copy to the shadow and compares its answer with the model's, in the background. */
  compare(copy: InferRequest, answer: Promise<InferResponse>): void {
    this.inFlight++;
    const shadowAnswer = (async () => this.resolveShadow(this.settings.model).infer(copy))();
    void Promise.allSettled([answer, shadowAnswer]).then(([own, shadow]) => {
      this.inFlight--;
      if (own.status === "rejected") {
        this.counts.skipped++;
        return;
      }
      this.counts.sampled++;
      if (shadow.status === "rejected") {
        this.counts.shadowFailed++;
        this.disagreement({ shadowError: String((shadow.reason as Error)?.message ?? shadow.reason) });
        return;
      }
      try {
        const differing = compareAnswers(this.model, shadow.value, own.value, this.outputs);
        if (differing === 0) {
          this.counts.agreed++;
          return;
        }
        this.counts.differed++;
        this.disagreement({ mismatchingElements: differing });
      } catch (err) {
        this.counts.differed++;
        this.disagreement({ reason: (err as Error).message });
      }
    });
  }

  private disagreement(details: object): void {
    if (this.logged >= LOGGED_DISAGREEMENTS) return;
    this.logged++;
    this.logger?.warn(
      { model: this.model, shadow: this.settings.model, ...details },
      "shadow model disagrees with this model",
    );
  }

  report(): ShadowAgreement {
    return {
      shadow: this.settings.model,
      every: this.settings.every,
      ...this.counts,
      outputs: [...this.outputs.values()].map((o) => ({ ...o })),
    };
  }
}

/** A copy of a tensor's elements: a typed array's, or each of a BYTES tensor's elements. */
function copyData(data: Tensor["data"]): Tensor["data"] {
  if (ArrayBuffer.isView(data)) return (data as unknown as { slice(): Tensor["data"] }).slice();
  return Array.from(data as ArrayLike<Uint8Array>, (b) => Uint8Array.from(b)) as unknown as Tensor["data"];
}

/** A requested output without the classification parameter. */
function withoutClassification(output: RequestedOutput): RequestedOutput {
  if (output.parameters?.classification === undefined) return output;
  const { classification: _, ...parameters } = output.parameters;
  return { ...output, parameters };
}

/** Shadow mode as a model's interceptor ("shadow"), with the running agreement it keeps. */
export interface ShadowInterceptor extends ModelInterceptor {
  agreement(): ShadowAgreement;
}

/**
 * Shadow mode in a model's chain: a sampled request is copied before the model runs it (it may
 * take the input buffers over), and its answer compared with the shadow's in the background.
 */
export function shadowInterceptor(comparer: ShadowComparer): ShadowInterceptor {
  return {
    name: "shadow",
    infer: (next) => (request, options) => {
      const copy = comparer.sample(request);
      const answer = next(request, options);
      if (copy) comparer.compare(copy, answer);
      return answer;
    },
    agreement: () => comparer.report(),
  };
}

/** The running agreement of `model` with the model its config names as `shadow_model`; undefined without one. */
export function shadowAgreementOf(model: Partial<Pick<Model, "interceptor">>): ShadowAgreement | undefined {
  return (model.interceptor?.("shadow") as ShadowInterceptor | undefined)?.agreement();
}
