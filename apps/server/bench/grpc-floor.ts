/**
 * The gRPC floor for server.bench: a process that answers every ModelInfer at
 * once with a fixed, classification-sized response, on a bare node:http2
 * server (no model, no Connect, no stage). What a call costs on this machine
 * before a server does any work: both ends' HTTP/2 and protobuf, loopback,
 * and waking each process. Run as a forked child; it sends its port over IPC.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create, toBinary } from "@bufbuild/protobuf";
import { encodeEnvelope } from "@connectrpc/connect/protocol";
import { frameBytes, HTTP2_SETTINGS, widenSessionWindow } from "@trellis/kserve/wire";
import { ModelInferResponseSchema } from "@trellis/protocol";

const top5 = new TextEncoder().encode(JSON.stringify({ top5_labels: ["tabby"], top5_probs: [0.5] }).padEnd(160));
const message = toBinary(
  ModelInferResponseSchema,
  create(ModelInferResponseSchema, {
    modelName: "resnet50_ensemble",
    modelVersion: "1",
    outputs: [{ name: "OUTPUT_RESULTS", datatype: "BYTES", shape: [1n, 1n] }],
    rawOutputContents: [frameBytes([top5])],
  }),
);
const frame = encodeEnvelope(0, message);

const server = http2.createServer({ settings: HTTP2_SETTINGS });
server.on("session", widenSessionWindow);
server.on("stream", (stream) => {
  // The request is read in full (as any server must) and not decoded.
  stream.on("data", () => {});
  stream.on("end", () => {
    stream.respond({ ":status": 200, "content-type": "application/grpc+proto" }, { waitForTrailers: true });
    stream.once("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
    stream.end(frame);
  });
});
server.listen(0, "127.0.0.1", () => process.send?.({ port: (server.address() as AddressInfo).port }));
process.on("disconnect", () => process.exit(0));
