/**
 * One ONNX Runtime session per worker thread. InferenceSession.run blocks
 * the thread it runs on for the whole inference, so it runs here and the
 * main thread stays free for health, metadata and other models.
 */
import { parentPort, workerData } from "node:worker_threads";
import * as ort from "onnxruntime-node";
import {
  type ModelTensorInfo,
  transferList,
  type WireTensor,
  type WorkerInit,
  type WorkerReply,
  type WorkerRequest,
} from "./protocol.js";
import { framesFromStrings, stringsFromFrames } from "./string-frames.js";

const port = parentPort;
if (!port) throw new Error("worker.js runs as a worker thread of @trellis/inference-onnx");
const init = workerData as WorkerInit;
const hrNs = () => Number(process.hrtime.bigint());

function info(list: readonly ort.InferenceSession.ValueMetadata[]): ModelTensorInfo[] {
  return list.map((m) =>
    m.isTensor
      ? { name: m.name, type: m.type, shape: m.shape.map((d) => (typeof d === "number" && d >= 0 ? d : -1)) }
      : { name: m.name, type: "non-tensor", shape: [] },
  );
}

function toOrt(t: WireTensor): ort.Tensor {
  if (t.type === "string") {
    const count = t.dims.reduce((n, d) => n * d, 1);
    return new ort.Tensor("string", stringsFromFrames(t.data as Uint8Array, count), t.dims);
  }
  return new ort.Tensor(t.type as ort.Tensor.Type, t.data as ort.Tensor.DataType, t.dims);
}

function fromOrt(name: string, t: ort.Tensor): WireTensor {
  const data = t.type === "string" ? framesFromStrings(t.data as string[]) : (t.data as ArrayBufferView);
  return { name, type: t.type, dims: [...t.dims], data };
}

let session: ort.InferenceSession;
try {
  session = await ort.InferenceSession.create(
    init.modelPath,
    init.sessionOptions as ort.InferenceSession.SessionOptions,
  );
  port.postMessage({ type: "ready", inputs: info(session.inputMetadata), outputs: info(session.outputMetadata) });
} catch (err) {
  port.postMessage({ type: "load-error", message: err instanceof Error ? err.message : String(err) });
  process.exit(0);
}

port.on("message", async (msg: WorkerRequest) => {
  if (msg.type === "close") {
    await session.release();
    port.close();
    return;
  }
  // The feeds' buffers go back with the reply, once ORT is done with them, for the next request's input copy.
  let spent = transferList(msg.feeds);
  try {
    const feeds: Record<string, ort.Tensor> = {};
    for (const t of msg.feeds) feeds[t.name] = toOrt(t);
    const startNs = hrNs();
    const results = await session.run(feeds, msg.fetches);
    const endNs = hrNs();
    const outputs = msg.fetches.map((name) => fromOrt(name, results[name]!));
    // An output that shares an input's buffer (a pass-through) must not be reused as spare.
    const out = transferList(outputs);
    spent = spent.filter((b) => !out.includes(b));
    const reply: WorkerReply = { type: "result", id: msg.id, outputs, startNs, endNs, spent };
    port.postMessage(reply, [...out, ...spent]);
  } catch (err) {
    const reply: WorkerReply = {
      type: "error",
      id: msg.id,
      message: err instanceof Error ? err.message : String(err),
      spent,
    };
    port.postMessage(reply, spent);
  }
});
