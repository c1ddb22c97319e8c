/**
 * One worker-thread instance of a TypeScript stage (see worker-instances.ts):
 * imports the stage module, calls its factory with what can cross a thread
 * (config, modelDir, version, versionDir, and a logger that posts its calls
 * back), then runs the calls the main thread sends, one at a time. A response's
 * buffers move to the main thread: the stage hands its answer over.
 */
import { fileURLToPath } from "node:url";
import { parentPort, workerData } from "node:worker_threads";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { ModelConfigSchema } from "@trellis/protocol";
import {
  Code,
  defineStage,
  type InferOptions,
  type Stage,
  StageError,
  type StageFactory,
  type StageLogger,
} from "@trellis/stage";
import { isStageDefinition } from "@trellis/stage/backend";
import { errorToWire, type FromInstance, type InstanceLoad, portableResponse, type ToInstance } from "./protocol.js";

const port = parentPort;
if (!port) throw new Error("instance-worker.js runs as a worker thread (see startWorkerInstances)");
const load = workerData as InstanceLoad;
const model = load.model;

const post = (m: FromInstance, transfer: ArrayBuffer[] = []) => port.postMessage(m, transfer);

/** An object that can be posted: errors as their name, message and stack; bigints as strings. */
function plain(obj: object | string): object | string {
  if (typeof obj === "string") return obj;
  return JSON.parse(
    JSON.stringify(obj, (_k, v: unknown) =>
      v instanceof Error ? { type: v.name, message: v.message, stack: v.stack } : typeof v === "bigint" ? String(v) : v,
    ),
  ) as object;
}

const logger: StageLogger = Object.fromEntries(
  (["info", "warn", "error"] as const).map((level) => [
    level,
    (obj: object | string, msg?: string) => {
      const m: FromInstance = { type: "log", level, obj, ...(msg !== undefined ? { msg } : {}) };
      try {
        post(m);
      } catch {
        post({ ...m, obj: plain(obj) });
      }
    },
  ]),
) as unknown as StageLogger;

async function loadStage(): Promise<Stage | undefined> {
  let mod: Record<string, unknown>;
  try {
    for (const url of load.imports ?? []) await import(url);
    mod = (await import(load.specifier)) as Record<string, unknown>;
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    // Node names the importing file; this one says nothing about the model.
    const own = ` imported from ${fileURLToPath(import.meta.url)}`;
    const why = message.endsWith(own) ? message.slice(0, -own.length) : message;
    post({
      type: "load-error",
      error: errorToWire(new StageError(Code.NotFound, model, `cannot import ${load.label}: ${why}`), model),
    });
    return undefined;
  }
  const factory = (mod.createStage ?? mod.default) as StageFactory | undefined;
  if (typeof factory !== "function") {
    const why = `${load.label} exports neither createStage nor a default function`;
    post({ type: "load-error", error: errorToWire(new StageError(Code.InvalidArgument, model, why), model) });
    return undefined;
  }
  try {
    const config = fromBinary(ModelConfigSchema, load.config);
    const made = await factory({
      config,
      modelDir: load.modelDir,
      version: load.version,
      versionDir: load.versionDir,
      logger,
    });
    // A definition runs here one call at a time; the main thread's runtime batches and counts.
    return isStageDefinition(made) ? defineStage(made) : made;
  } catch (err) {
    post({ type: "load-error", error: errorToWire(err, model) });
    return undefined;
  }
}

const stage = await loadStage();
if (stage) {
  const controllers = new Map<number, AbortController>();
  port.on("message", async (m: ToInstance) => {
    if (m.type === "cancel") {
      controllers.get(m.id)?.abort();
      return;
    }
    if (m.type === "close") {
      await Promise.resolve(stage.close()).catch((err: unknown) =>
        logger.error({ err, model }, "closing the stage failed"),
      );
      post({ type: "closed" });
      return;
    }
    const controller = new AbortController();
    controllers.set(m.id, controller);
    const options: InferOptions = { ...m.options, signal: controller.signal };
    const send = (response: Parameters<typeof portableResponse>[0]) => {
      const transfer: ArrayBuffer[] = [];
      post({ type: "response", id: m.id, response: portableResponse(response, transfer, true) }, transfer);
    };
    try {
      if (m.stream && stage.inferStream) {
        for await (const response of stage.inferStream(m.request, options)) send(response);
        post({ type: "end", id: m.id });
      } else {
        send(await stage.infer(m.request, options));
      }
    } catch (err) {
      post({ type: "error", id: m.id, error: errorToWire(err, model) });
    } finally {
      controllers.delete(m.id);
    }
  });
  post({
    type: "ready",
    name: stage.name,
    version: stage.version,
    config: toBinary(ModelConfigSchema, stage.config),
    metadata: await stage.metadata(),
    stream: typeof stage.inferStream === "function",
  });
}
