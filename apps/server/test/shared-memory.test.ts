/**
 * Triton's system shared memory extension, black-box: the test creates shared
 * memory objects in /dev/shm (as tritonclient's shm utilities do through
 * shm_open), registers them over HTTP and gRPC, and sends the shared
 * MobileNetV2 its input through one and takes its output through another.
 */
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { create } from "@bufbuild/protobuf";
import { Code, type ConnectError } from "@connectrpc/connect";
import { ModelInferRequestSchema } from "@trellis/protocol";
import {
  makeSeedRepository,
  readReferenceTensor,
  referenceTop5OnThisCpu,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { floats, grpcClientOf, jsonOf, postJson } from "./helpers.js";

/** ONNX Runtime run directly on this CPU: the int8 model's kernels differ between CPUs. */
const references = await referenceTop5OnThisCpu();
// A photo whose top-1 holds on every CPU seen (STABLE_TOP1), so thread counts and batch sizes that
// change the int8 kernels' last bits on some CPUs cannot change it.
const photo = "chelsea.jpg";
const top1 = references[photo]?.top5_index[0];
const tensor = readReferenceTensor(photo);
const INPUT_BYTES = tensor.byteLength; // 3 × 224 × 224 FP32
const OUTPUT_BYTES = 1000 * 4;

const key = (what: string) => `/trellis-test-${process.pid}-${what}`;
const file = (what: string) => `/dev/shm${key(what)}`;
const argmax = (values: Float32Array) => values.indexOf(Math.max(...values));
/** The model's answer as the output region holds it. */
const outputInShm = () => floats(readFileSync(file("out")).subarray(0, OUTPUT_BYTES));

let repo: string;
beforeAll(async () => {
  repo = await makeSeedRepository();
  writeFileSync(file("in"), new Uint8Array(tensor.buffer, tensor.byteOffset, tensor.byteLength));
  writeFileSync(file("out"), new Uint8Array(OUTPUT_BYTES + 64));
});
afterAll(async () => {
  for (const what of ["in", "out"]) rmSync(file(what), { force: true });
  await removeDir(repo);
});

const shmParameters = (region: string, byteSize: number) => ({
  shared_memory_region: { parameterChoice: { case: "stringParam" as const, value: region } },
  shared_memory_byte_size: { parameterChoice: { case: "int64Param" as const, value: BigInt(byteSize) } },
});

describe("--allow-client-shm true", () => {
  let server: ServerProcess;
  beforeAll(async () => {
    server = await startServerProcess(["--model-repository", repo, "--allow-client-shm", "true"]);
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
  });

  it("registers regions over HTTP and gRPC, reads inputs from them and writes outputs to them", async () => {
    expect((await jsonOf(await fetch(`${server.http}/v2`))).extensions).toContain("system_shared_memory");
    const registered = await postJson(`${server.http}/v2/systemsharedmemory/region/input_data/register`, {
      key: key("in"),
      offset: 0,
      byte_size: INPUT_BYTES,
    });
    expect(registered.status).toBe(200);
    const client = grpcClientOf(server);
    await client.systemSharedMemoryRegister({ name: "output_data", key: key("out"), byteSize: BigInt(OUTPUT_BYTES) });
    expect(await jsonOf(await fetch(`${server.http}/v2/systemsharedmemory/status`))).toEqual([
      { name: "input_data", key: key("in"), offset: 0, byte_size: INPUT_BYTES },
      { name: "output_data", key: key("out"), offset: 0, byte_size: OUTPUT_BYTES },
    ]);
    expect(Object.keys((await client.systemSharedMemoryStatus({})).regions).sort()).toEqual([
      "input_data",
      "output_data",
    ]);

    // gRPC: both tensors in shared memory, no tensor bytes in the messages.
    const response = await client.modelInfer(
      create(ModelInferRequestSchema, {
        modelName: "resnet50_inference",
        inputs: [
          {
            name: "input",
            datatype: "FP32",
            shape: [1n, 3n, 224n, 224n],
            parameters: shmParameters("input_data", INPUT_BYTES),
          },
        ],
        outputs: [{ name: "output", parameters: shmParameters("output_data", OUTPUT_BYTES) }],
      }),
    );
    expect(response.outputs[0]?.parameters.shared_memory_region?.parameterChoice.value).toBe("output_data");
    expect(Number(response.outputs[0]?.parameters.shared_memory_byte_size?.parameterChoice.value)).toBe(OUTPUT_BYTES);
    expect(response.rawOutputContents[0]?.byteLength ?? 0).toBe(0);
    const viaGrpc = outputInShm();
    expect(argmax(viaGrpc)).toBe(top1);

    // HTTP: the same, the answer saying where its output went; then the output sent back as usual.
    writeFileSync(file("out"), new Uint8Array(OUTPUT_BYTES + 64));
    const http = await postJson(`${server.http}/v2/models/resnet50_inference/infer`, {
      inputs: [
        {
          name: "input",
          datatype: "FP32",
          shape: [1, 3, 224, 224],
          parameters: { shared_memory_region: "input_data", shared_memory_byte_size: INPUT_BYTES },
        },
      ],
      outputs: [
        { name: "output", parameters: { shared_memory_region: "output_data", shared_memory_byte_size: OUTPUT_BYTES } },
      ],
    });
    expect(http.status, JSON.stringify(http.json)).toBe(200);
    expect(http.json.outputs[0]).toEqual({
      name: "output",
      datatype: "FP32",
      shape: [1, 1000],
      parameters: { shared_memory_region: "output_data", shared_memory_byte_size: OUTPUT_BYTES },
    });
    expect([...outputInShm()]).toEqual([...viaGrpc]);
    const mixed = await postJson(`${server.http}/v2/models/resnet50_inference/infer`, {
      inputs: [
        {
          name: "input",
          datatype: "FP32",
          shape: [1, 3, 224, 224],
          parameters: { shared_memory_region: "input_data", shared_memory_byte_size: INPUT_BYTES },
        },
      ],
    });
    expect(mixed.json.outputs[0].data).toEqual([...viaGrpc]);
  });

  it("refuses what does not fit or is not registered, naming it; a bad key opens nothing", async () => {
    const infer = (output: object) =>
      postJson(`${server.http}/v2/models/resnet50_inference/infer`, {
        inputs: [
          {
            name: "input",
            datatype: "FP32",
            shape: [1, 3, 224, 224],
            parameters: { shared_memory_region: "input_data", shared_memory_byte_size: INPUT_BYTES },
          },
        ],
        outputs: [{ name: "output", parameters: output }],
      });
    expect((await infer({ shared_memory_region: "nope", shared_memory_byte_size: OUTPUT_BYTES })).json.error).toBe(
      "output 'output': Unable to find shared memory region: 'nope'",
    );
    expect((await infer({ shared_memory_region: "output_data", shared_memory_byte_size: 100 })).json.error).toBe(
      "output 'output': shared_memory_byte_size 100 is too small for the output's 4000 bytes",
    );
    const beyond = await infer({
      shared_memory_region: "output_data",
      shared_memory_byte_size: OUTPUT_BYTES,
      shared_memory_offset: 8,
    });
    expect(beyond.json.error).toMatch(/invalid offset \+ byte size for shared memory region 'output_data'/);
    expect((await infer({ shared_memory_region: "output_data" })).json.error).toBe(
      "output 'output': shared_memory_region and shared_memory_byte_size go together",
    );
    const outside = await postJson(`${server.http}/v2/systemsharedmemory/region/evil/register`, {
      key: "/../../etc/passwd",
      byte_size: 10,
    });
    expect(outside.status).toBe(400);
    expect(outside.json.error).toMatch(/key '\/\.\.\/\.\.\/etc\/passwd' is not a shared memory object name/);
    const client = grpcClientOf(server);
    const twice = await client
      .systemSharedMemoryRegister({ name: "input_data", key: key("in"), byteSize: 10n })
      .catch((e: ConnectError) => e);
    expect((twice as ConnectError).code).toBe(Code.AlreadyExists);
    const tooBig = await client
      .systemSharedMemoryRegister({ name: "big", key: key("out"), byteSize: 10n ** 9n })
      .catch((e: ConnectError) => e);
    expect((tooBig as ConnectError).code).toBe(Code.InvalidArgument);
    expect((tooBig as ConnectError).rawMessage).toMatch(
      /^failed to register shared memory region 'big': invalid args \(.*runs past the \d+ bytes of/,
    );
    // Triton's codes and words: an object shm_open cannot open is INTERNAL; a key of only slashes INVALID_ARGUMENT.
    const missing = await client
      .systemSharedMemoryRegister({ name: "missing", key: "/trellis-no-such-object", byteSize: 8n })
      .catch((e: ConnectError) => e);
    expect((missing as ConnectError).code).toBe(Code.Internal);
    expect((missing as ConnectError).rawMessage).toBe("Unable to open shared memory region: '/trellis-no-such-object'");
    const missingHttp = await postJson(`${server.http}/v2/systemsharedmemory/region/missing/register`, {
      key: "/trellis-no-such-object",
      byte_size: 8,
    });
    expect(missingHttp.status).toBe(500);
    expect(missingHttp.json.error).toBe("Unable to open shared memory region: '/trellis-no-such-object'");
    const slashes = await client
      .systemSharedMemoryRegister({ name: "slashes", key: "//", byteSize: 8n })
      .catch((e: ConnectError) => e);
    expect((slashes as ConnectError).code).toBe(Code.InvalidArgument);
    expect((slashes as ConnectError).rawMessage).toBe(
      "cannot register shared memory region 'slashes' - invalid shm key '//'",
    );

    // Unregistered, a region is no longer there to name.
    await client.systemSharedMemoryUnregister({ name: "output_data" });
    expect((await infer({ shared_memory_region: "output_data", shared_memory_byte_size: OUTPUT_BYTES })).status).toBe(
      400,
    );
    expect((await postJson(`${server.http}/v2/systemsharedmemory/unregister`, {})).status).toBe(200);
    expect(await jsonOf(await fetch(`${server.http}/v2/systemsharedmemory/status`))).toEqual([]);
  });
});

it("without --allow-client-shm, refuses to register regions and requests that name them", async () => {
  const server = await startServerProcess(["--model-repository", repo]);
  try {
    const register = await postJson(`${server.http}/v2/systemsharedmemory/region/input_data/register`, {
      key: key("in"),
      byte_size: INPUT_BYTES,
    });
    // Triton's refusal (src/common.h kClientShmDisabledErrorStr).
    expect(register).toEqual({
      status: 501,
      json: { error: "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable." },
    });
    const named = await postJson(`${server.http}/v2/models/resnet50_inference/infer`, {
      inputs: [
        {
          name: "input",
          datatype: "FP32",
          shape: [1, 3, 224, 224],
          parameters: { shared_memory_region: "input_data", shared_memory_byte_size: INPUT_BYTES },
        },
      ],
    });
    expect(named.status).toBe(400);
    expect(named.json.error).toMatch(/names shared memory regions, but this server takes none/);
  } finally {
    expect(await server.stop()).toBe(0);
  }
});
