/**
 * Hand-encodes tiny ONNX models (Identity graphs, or a few nodes) so tests can
 * exercise datatypes, fixed batch dims, metadata_props and stateful models
 * without model files.
 */

const ELEM: Record<string, number> = {
  float32: 1,
  uint8: 2,
  int8: 3,
  uint32: 12,
  uint64: 13,
  int32: 6,
  int64: 7,
  string: 8,
  bool: 9,
  float64: 11,
};

function varint(n: number): number[] {
  const out: number[] = [];
  while (n >= 0x80) {
    out.push((n % 128) | 0x80);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return out;
}

const enc = new TextEncoder();
const num = (field: number, n: number) => [...varint(field * 8), ...varint(n)];
const bytes = (field: number, b: number[] | Uint8Array) => [...varint(field * 8 + 2), ...varint(b.length), ...b];
const str = (field: number, s: string) => bytes(field, enc.encode(s));

export interface ToyTensor {
  name: string;
  type: keyof typeof ELEM;
  /** Numbers are fixed dims, strings symbolic (dynamic). */
  shape: (number | string)[];
}

function valueInfo(t: ToyTensor): number[] {
  const dims = t.shape.flatMap((d) => bytes(1, typeof d === "number" ? num(1, d) : str(2, d)));
  const tensorType = [...num(1, ELEM[t.type]!), ...bytes(2, dims)];
  return [...str(1, t.name), ...bytes(2, bytes(1, tensorType))];
}

export interface ToyNode {
  op: string;
  inputs: string[];
  outputs: string[];
  /** Integer attributes (GatherElements' axis, say). */
  ints?: Record<string, number>;
}

/** A constant of the graph (a MatMul's weights): FP32 values of `dims`. */
export interface ToyInitializer {
  name: string;
  dims: number[];
  values: Float32Array;
}

/** A model of `nodes` (opset 13, integer attributes only) from `inputs` to `outputs`, with FP32 `initializers`. */
export function graphModel(
  nodes: ToyNode[],
  inputs: ToyTensor[],
  outputs: ToyTensor[],
  metadata: Record<string, string> = {},
  initializers: ToyInitializer[] = [],
): Uint8Array {
  const graph: number[] = [];
  nodes.forEach((n, i) => {
    // AttributeProto: name (1), i (3), type (20) = INT (2).
    const attributes = Object.entries(n.ints ?? {}).flatMap(([k, v]) =>
      bytes(5, [...str(1, k), ...num(3, v), ...num(20, 2)]),
    );
    const node = [
      ...n.inputs.flatMap((x) => str(1, x)),
      ...n.outputs.flatMap((x) => str(2, x)),
      ...str(3, `n${i}`),
      ...str(4, n.op),
      ...attributes,
    ];
    graph.push(...bytes(1, node));
  });
  graph.push(...str(2, "toy"));
  // TensorProto: dims (1), data_type (2) = FLOAT (1), name (8), raw_data (9).
  for (const t of initializers) {
    const raw = new Uint8Array(t.values.buffer, t.values.byteOffset, t.values.byteLength);
    graph.push(...bytes(5, [...t.dims.flatMap((d) => num(1, d)), ...num(2, 1), ...str(8, t.name), ...bytes(9, raw)]));
  }
  for (const t of inputs) graph.push(...bytes(11, valueInfo(t)));
  for (const t of outputs) graph.push(...bytes(12, valueInfo(t)));
  const model = [
    ...num(1, 8),
    ...str(2, "trellis-test"),
    ...bytes(7, graph),
    ...bytes(8, [...str(1, ""), ...num(2, 13)]),
    ...Object.entries(metadata).flatMap(([k, v]) => bytes(14, [...str(1, k), ...str(2, v)])),
  ];
  return Uint8Array.from(model);
}

/** A model whose output i is Identity(input i), named `${input}_out`. */
export function identityModel(inputs: ToyTensor[], metadata: Record<string, string> = {}): Uint8Array {
  return graphModel(
    inputs.map((t) => ({ op: "Identity", inputs: [t.name], outputs: [`${t.name}_out`] })),
    inputs,
    inputs.map((t) => ({ ...t, name: `${t.name}_out` })),
    metadata,
  );
}

/**
 * A stateful model for sequence_batching (the accumulator of Triton's implicit-state docs):
 * OUTPUT = INPUT + STATE_IN = STATE_OUT, with the START and CORRID control tensors echoed
 * as START_SEEN and CORRID_SEEN; all [N, 1], FP32 but CORRID (UINT64).
 */
export function accumulatorModel(): Uint8Array {
  const t = (name: string, type: ToyTensor["type"] = "float32"): ToyTensor => ({ name, type, shape: ["N", 1] });
  return graphModel(
    [
      { op: "Add", inputs: ["INPUT", "STATE_IN"], outputs: ["OUTPUT"] },
      { op: "Identity", inputs: ["OUTPUT"], outputs: ["STATE_OUT"] },
      { op: "Identity", inputs: ["START"], outputs: ["START_SEEN"] },
      { op: "Identity", inputs: ["CORRID"], outputs: ["CORRID_SEEN"] },
    ],
    [t("INPUT"), t("STATE_IN"), t("START"), t("CORRID", "uint64")],
    [t("OUTPUT"), t("STATE_OUT"), t("START_SEEN"), t("CORRID_SEEN", "uint64")],
  );
}

/** accumulatorModel's config.pbtxt: sequence_batching with START, CORRID and the state from zero (the name is left out). */
export const ACCUMULATOR_CONFIG = `backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "START_SEEN" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "CORRID_SEEN" data_type: TYPE_UINT64 dims: [ 1 ] }
]
sequence_batching {
  oldest { max_candidate_sequences: 8 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ]
    initial_state { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zero" } } ]
}
`;

/** The width of gatherModel's rows. */
export const GATHER_WIDTH = 64;
/** gatherModel's matrix W [64, 64]: fixed values, so a test can compute each answer itself. */
export const GATHER_WEIGHTS = Float32Array.from(
  { length: GATHER_WIDTH * GATHER_WIDTH },
  (_, i) => (((i * 7) % 13) - 6) / 64,
);

/**
 * A model that fails a whole run on one row's value (issue 45): y[n] = (((x[n]·W)·W)·W)[idx[n]],
 * x [N, 64] FP32, idx [N, 1] INT64 (GatherElements on axis 1). An index out of [0, 64) makes
 * onnxruntime refuse the run, whatever the other rows hold.
 */
export function gatherModel(): Uint8Array {
  return graphModel(
    [
      { op: "MatMul", inputs: ["x", "W"], outputs: ["h1"] },
      { op: "MatMul", inputs: ["h1", "W"], outputs: ["h2"] },
      { op: "MatMul", inputs: ["h2", "W"], outputs: ["h3"] },
      { op: "GatherElements", inputs: ["h3", "idx"], outputs: ["y"], ints: { axis: 1 } },
    ],
    [
      { name: "x", type: "float32", shape: ["N", GATHER_WIDTH] },
      { name: "idx", type: "int64", shape: ["N", 1] },
    ],
    [{ name: "y", type: "float32", shape: ["N", 1] }],
    {},
    [{ name: "W", dims: [GATHER_WIDTH, GATHER_WIDTH], values: GATHER_WEIGHTS }],
  );
}

/** gatherModel's config.pbtxt: dynamic batching (max_batch_size 64, a 2 ms delay), one CPU instance. */
export function gatherConfig(name: string): string {
  return `name: "${name}"
backend: "onnxruntime"
max_batch_size: 64
input [
  { name: "x", data_type: TYPE_FP32, dims: [ ${GATHER_WIDTH} ] },
  { name: "idx", data_type: TYPE_INT64, dims: [ 1 ] }
]
output [ { name: "y", data_type: TYPE_FP32, dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
`;
}
