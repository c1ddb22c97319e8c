/**
 * KServe v2 messages <-> the Stage contract's plain objects. Requests and
 * responses go out as raw_* contents; both raw and typed contents come in.
 */
import { create } from "@bufbuild/protobuf";
import {
  type InferParameter,
  InferParameterSchema,
  type ModelInferRequest,
  ModelInferRequest_InferInputTensorSchema,
  ModelInferRequest_InferRequestedOutputTensorSchema,
  ModelInferRequestSchema,
  type ModelInferResponse,
  ModelInferResponse_InferOutputTensorSchema,
  ModelInferResponseSchema,
  type ModelMetadataResponse,
  ModelMetadataResponse_TensorMetadataSchema,
  ModelMetadataResponseSchema,
} from "@trellis/protocol";
import type {
  DataType,
  InferRequest,
  InferResponse,
  Parameters,
  StageMetadata,
  Tensor,
  TensorMetadata,
} from "@trellis/stage";
import { Code, StageError } from "@trellis/stage";
import { tensorFromContents, tensorFromRaw, tensorToRaw } from "./codec.js";

export function parametersFromWire(params: Record<string, InferParameter> | undefined): Parameters | undefined {
  if (!params) return undefined;
  const out: Parameters = {};
  let any = false;
  for (const [key, p] of Object.entries(params)) {
    if (p.parameterChoice.case === undefined) continue;
    out[key] = p.parameterChoice.value;
    any = true;
  }
  return any ? out : undefined;
}

export function parametersToWire(params: Parameters | undefined): Record<string, InferParameter> {
  const out: Record<string, InferParameter> = {};
  for (const [key, v] of Object.entries(params ?? {})) {
    const choice =
      typeof v === "boolean"
        ? { case: "boolParam" as const, value: v }
        : typeof v === "bigint"
          ? { case: "int64Param" as const, value: v }
          : typeof v === "number"
            ? Number.isInteger(v)
              ? { case: "int64Param" as const, value: BigInt(v) }
              : { case: "doubleParam" as const, value: v }
            : { case: "stringParam" as const, value: v };
    out[key] = create(InferParameterSchema, { parameterChoice: choice });
  }
  return out;
}

/** Decodes a ModelInferRequest; tensors are views over the message's bytes. */
export function inferRequestFromWire(msg: ModelInferRequest, stage = ""): InferRequest {
  const raw = msg.rawInputContents;
  if (raw.length > 0 && raw.length !== msg.inputs.length) {
    throw new StageError(
      Code.InvalidArgument,
      stage,
      `raw_input_contents has ${raw.length} entries for ${msg.inputs.length} inputs`,
    );
  }
  const inputs = msg.inputs.map((input, i) => {
    const bytes = raw[i];
    if (bytes !== undefined) {
      if (input.contents) {
        throw new StageError(
          Code.InvalidArgument,
          "",
          // Triton's text (grpc/infer_handler.cc), which names the model itself.
          `contents field must not be specified when using raw_input_contents for '${input.name}' for model '${msg.modelName}'`,
        );
      }
      return tensorFromRaw("input", input, bytes, stage, msg.id || undefined);
    }
    if (!input.contents) {
      throw new StageError(
        Code.InvalidArgument,
        stage,
        `input ${input.name}: no data (neither contents nor raw_input_contents)`,
      );
    }
    return tensorFromContents("input", input, input.contents, stage);
  });
  return {
    id: msg.id || undefined,
    inputs,
    outputs: msg.outputs.map((o) => ({ name: o.name, parameters: parametersFromWire(o.parameters) })),
    parameters: parametersFromWire(msg.parameters),
  };
}

export function inferRequestToWire(req: InferRequest, modelName: string, modelVersion = ""): ModelInferRequest {
  return create(ModelInferRequestSchema, {
    modelName,
    modelVersion,
    id: req.id ?? "",
    parameters: parametersToWire(req.parameters),
    inputs: req.inputs.map((t) =>
      create(ModelInferRequest_InferInputTensorSchema, {
        name: t.name,
        datatype: t.datatype,
        shape: t.shape.map(BigInt),
      }),
    ),
    outputs: (req.outputs ?? []).map((o) =>
      create(ModelInferRequest_InferRequestedOutputTensorSchema, {
        name: o.name,
        parameters: parametersToWire(o.parameters),
      }),
    ),
    rawInputContents: req.inputs.map(tensorToRaw),
  });
}

export function inferResponseToWire(res: InferResponse): ModelInferResponse {
  return create(ModelInferResponseSchema, {
    modelName: res.modelName,
    modelVersion: res.modelVersion,
    id: res.id ?? "",
    parameters: parametersToWire(res.parameters),
    outputs: res.outputs.map((t) =>
      create(ModelInferResponse_InferOutputTensorSchema, {
        name: t.name,
        datatype: t.datatype,
        shape: t.shape.map(BigInt),
      }),
    ),
    rawOutputContents: res.outputs.map(tensorToRaw),
  });
}

export function inferResponseFromWire(msg: ModelInferResponse, stage = ""): InferResponse {
  const raw = msg.rawOutputContents;
  const outputs: Tensor[] = msg.outputs.map((o, i) => {
    const bytes = raw[i];
    if (bytes !== undefined) return tensorFromRaw("output", o, bytes, stage);
    if (!o.contents) throw new StageError(Code.Internal, stage, `output ${o.name}: response carries no data`);
    return tensorFromContents("output", o, o.contents, stage);
  });
  return {
    id: msg.id || undefined,
    modelName: msg.modelName,
    modelVersion: msg.modelVersion,
    outputs,
    parameters: parametersFromWire(msg.parameters),
  };
}

export function metadataToWire(m: StageMetadata): ModelMetadataResponse {
  const t = (x: TensorMetadata) =>
    create(ModelMetadataResponse_TensorMetadataSchema, {
      name: x.name,
      datatype: x.datatype,
      shape: x.shape.map(BigInt),
    });
  return create(ModelMetadataResponseSchema, {
    name: m.name,
    versions: m.versions,
    platform: m.platform,
    inputs: m.inputs.map(t),
    outputs: m.outputs.map(t),
  });
}

export function metadataFromWire(m: ModelMetadataResponse): StageMetadata {
  const t = (x: { name: string; datatype: string; shape: bigint[] }): TensorMetadata => ({
    name: x.name,
    datatype: x.datatype as DataType,
    shape: x.shape.map(Number),
  });
  return {
    name: m.name,
    versions: [...m.versions],
    platform: m.platform,
    inputs: m.inputs.map(t),
    outputs: m.outputs.map(t),
  };
}
