/**
 * The tensors the sequence batcher adds to one request of a sequence: its START, END and READY
 * controls, its CORRID (the sequence's ID), and a state's initial input for a sequence's first request.
 */
import { Code, elementCount, StageError, type Tensor, type TensorData } from "@trellis/stage";
import { allocate, bytesOf, type NumericType } from "@trellis/stage/backend";
import type { BooleanControl, CorridControl, StateSpec } from "./layout.js";

const encoder = new TextEncoder();

/** A START, END or READY control's tensor: its false or true value, `lead` its batch dim. */
export function controlTensor(c: BooleanControl, on: boolean, lead: number[]): Tensor {
  const value = c.values[on ? 1 : 0];
  const data =
    c.datatype === "FP32"
      ? Float32Array.of(value)
      : c.datatype === "INT32"
        ? Int32Array.of(value)
        : Uint8Array.of(value ? 1 : 0);
  return { name: c.name, datatype: c.datatype, shape: [...lead, 1], data } as Tensor;
}

/** The CORRID control's tensor: the sequence's ID, refused when it does not fit the control's datatype. */
export function corridTensor(model: string, c: CorridControl, id: bigint | string, lead: number[]): Tensor {
  const shape = [...lead, 1];
  if (c.datatype === "BYTES") return { name: c.name, datatype: "BYTES", shape, data: [encoder.encode(String(id))] };
  if (typeof id === "string") {
    throw new StageError(
      Code.InvalidArgument,
      model,
      `sequence_id "${id}" is a string, but control input ${c.name} (CONTROL_SEQUENCE_CORRID) takes ${c.datatype}: send an unsigned integer`,
    );
  }
  const limit =
    c.datatype === "UINT32"
      ? 2n ** 32n
      : c.datatype === "INT32"
        ? 2n ** 31n
        : c.datatype === "INT64"
          ? 2n ** 63n
          : 2n ** 64n;
  if (id >= limit)
    throw new StageError(
      Code.InvalidArgument,
      model,
      `sequence_id ${id} does not fit control input ${c.name} (CONTROL_SEQUENCE_CORRID, ${c.datatype})`,
    );
  const data =
    c.datatype === "UINT64"
      ? BigUint64Array.of(id)
      : c.datatype === "INT64"
        ? BigInt64Array.of(id)
        : c.datatype === "UINT32"
          ? Uint32Array.of(Number(id))
          : Int32Array.of(Number(id));
  return { name: c.name, datatype: c.datatype, shape, data } as Tensor;
}

/** A state's input for a sequence's first request: its initial_state data_file (`file`), else zeros. */
export function initialStateTensor(s: StateSpec, lead: number[], file: Uint8Array | undefined): Tensor {
  const shape = [...lead, ...s.initial.dims];
  const count = elementCount(shape);
  if (s.datatype === "BYTES")
    return { name: s.input, datatype: "BYTES", shape, data: Array.from({ length: count }, () => new Uint8Array(0)) };
  const data = allocate(s.datatype as NumericType, count) as Exclude<TensorData, Uint8Array[]>;
  if (file) bytesOf(data).set(file);
  return { name: s.input, datatype: s.datatype, shape, data } as Tensor;
}
