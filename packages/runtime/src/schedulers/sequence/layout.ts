/**
 * What a model's sequence_batching config adds to its requests, read and checked once at load:
 * the control inputs (START, END, READY, CORRID), the implicit states with their initial_state,
 * the idle timeout and slots per instance; the tensors that makes (sequenceTensors), and each
 * state's initial_state data_file, read from the model folder.
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { ModelSequenceBatching_Control_Kind as Kind, type ModelConfig } from "@trellis/protocol";
import { Code, type DataType, datatypeFromConfig, elementCount, formatShape, StageError } from "@trellis/stage";
import { elementSize, modelFilePath, viewAs } from "@trellis/stage/backend";

/** A tensor the sequence batcher adds to each request: its name, datatype and dims (without the batch dim). */
export interface SequenceTensorSpec {
  name: string;
  datatype: DataType;
  dims: number[];
}

export type BooleanKind = "START" | "END" | "READY";

export interface BooleanControl {
  kind: BooleanKind;
  name: string;
  datatype: "INT32" | "FP32" | "BOOL";
  /** [false value, true value] */
  values: [number, number];
}

export interface CorridControl {
  name: string;
  datatype: "UINT64" | "INT64" | "UINT32" | "INT32" | "BYTES";
}

export interface StateSpec {
  input: string;
  output: string;
  datatype: DataType;
  dims: number[];
  /** The first request's input state: what initial_state gives, else zeros with variable dims as 1 (Triton's). */
  initial: { dims: number[]; data?: Uint8Array };
}

export interface SequenceLayout {
  controls: BooleanControl[];
  corrid?: CorridControl;
  states: StateSpec[];
  idleMs: number;
  slotsPerInstance: number;
}

const KIND_NAMES: Record<number, BooleanKind | "CORRID"> = {
  [Kind.CONTROL_SEQUENCE_START]: "START",
  [Kind.CONTROL_SEQUENCE_END]: "END",
  [Kind.CONTROL_SEQUENCE_READY]: "READY",
  [Kind.CONTROL_SEQUENCE_CORRID]: "CORRID",
};
const CORRID_TYPES = ["UINT64", "INT64", "UINT32", "INT32", "BYTES"] as const;

/** The config's sequence_batching section, or undefined when the model has none. */
function sequenceSection(config: ModelConfig) {
  return config.schedulingChoice.case === "sequenceBatching" ? config.schedulingChoice.value : undefined;
}

/** Reads and checks the config's control inputs and states; a bad entry fails the load, named. */
export function readLayout(config: ModelConfig): SequenceLayout | undefined {
  const sb = sequenceSection(config);
  if (!sb) return undefined;
  const model = config.name;
  const bad = (msg: string) => new StageError(Code.InvalidArgument, model, `sequence_batching: ${msg}`);
  if (sb.iterativeSequence) {
    throw bad("iterative_sequence is not supported: each request of a sequence is sent by the client");
  }
  const controls: BooleanControl[] = [];
  let corrid: CorridControl | undefined;
  const seen = new Set<string>();
  for (const input of sb.controlInput) {
    if (!input.name) throw bad("a control_input has no name");
    if (input.control.length !== 1) {
      throw bad(`control_input ${input.name}: expected one control, got ${input.control.length}`);
    }
    const control = input.control[0]!;
    const kind = KIND_NAMES[control.kind];
    if (!kind) throw bad(`control_input ${input.name}: unknown control kind ${control.kind}`);
    if (seen.has(kind)) throw bad(`more than one control_input carries CONTROL_SEQUENCE_${kind}`);
    seen.add(kind);
    if (kind === "CORRID") {
      const datatype = datatypeFromConfig(control.dataType);
      if (!(CORRID_TYPES as readonly string[]).includes(datatype)) {
        throw bad(
          `control_input ${input.name}: CONTROL_SEQUENCE_CORRID needs data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING, got ${control.dataType === 0 ? "none" : `TYPE_${datatype === "BYTES" ? "STRING" : datatype}`}`,
        );
      }
      corrid = { name: input.name, datatype: datatype as CorridControl["datatype"] };
      continue;
    }
    const given = [
      ["INT32", control.int32FalseTrue],
      ["FP32", control.fp32FalseTrue],
      ["BOOL", control.boolFalseTrue.map(Number)],
    ].filter(([, v]) => (v as number[]).length > 0) as [BooleanControl["datatype"], number[]][];
    const [datatype, values] = given[0] ?? [];
    if (given.length !== 1 || !datatype || values?.length !== 2) {
      throw bad(
        `control_input ${input.name}: CONTROL_SEQUENCE_${kind} needs one of int32_false_true, fp32_false_true or bool_false_true, with two values [false, true]`,
      );
    }
    controls.push({ kind, name: input.name, datatype, values: [values[0]!, values[1]!] });
  }
  const states = sb.state.map((s): StateSpec => {
    if (!s.inputName || !s.outputName) throw bad("a state needs input_name and output_name");
    const datatype = datatypeFromConfig(s.dataType);
    const dims = s.dims.map(Number);
    const where = `state ${s.inputName}/${s.outputName}`;
    if (s.initialState.length > 1) throw bad(`${where}: at most one initial_state, got ${s.initialState.length}`);
    const init = s.initialState[0];
    if (!init)
      return { input: s.inputName, output: s.outputName, datatype, dims, initial: { dims: variableAsOne(dims) } };
    const initDims = init.dims.map(Number);
    if (init.dataType !== s.dataType) {
      throw bad(
        `${where}: initial_state data_type ${datatypeFromConfig(init.dataType)} differs from the state's ${datatype}`,
      );
    }
    const fits =
      initDims.length === dims.length && initDims.every((d, i) => d >= 0 && (dims[i] === -1 || dims[i] === d));
    if (!fits) {
      throw bad(
        `${where}: initial_state dims ${formatShape(initDims)} must be fixed and fit the state's ${formatShape(dims)}`,
      );
    }
    if (init.stateData.case === undefined) throw bad(`${where}: initial_state needs zero_data or data_file`);
    if (datatype === "BYTES" && init.stateData.case === "dataFile") {
      throw bad(`${where}: a TYPE_STRING state cannot be read from data_file`);
    }
    return { input: s.inputName, output: s.outputName, datatype, dims, initial: { dims: initDims } };
  });
  const idleUs = Number(sb.maxSequenceIdleMicroseconds);
  const oldest = sb.strategyChoice.case === "oldest" ? sb.strategyChoice.value : undefined;
  const slotsPerInstance =
    oldest && oldest.maxCandidateSequences > 0 ? oldest.maxCandidateSequences : Math.max(1, config.maxBatchSize);
  return { controls, corrid, states, idleMs: idleUs > 0 ? idleUs / 1000 : 1000, slotsPerInstance };
}

const variableAsOne = (dims: number[]) => dims.map((d) => (d < 0 ? 1 : d));

/**
 * The inputs the sequence batcher gives a model beyond its config's `input`
 * section (control inputs, then state inputs), and the state outputs it takes
 * back: what a stage's request checks must let through, and what an ONNX
 * model's own inputs are checked against. Empty for a model without
 * sequence_batching.
 */
export function sequenceTensors(config: ModelConfig): { inputs: SequenceTensorSpec[]; outputs: SequenceTensorSpec[] } {
  const layout = readLayout(config);
  return layout ? tensorsOf(layout) : { inputs: [], outputs: [] };
}

export function tensorsOf(layout: SequenceLayout): { inputs: SequenceTensorSpec[]; outputs: SequenceTensorSpec[] } {
  const controls = [...layout.controls, ...(layout.corrid ? [layout.corrid] : [])].map((c) => ({
    name: c.name,
    datatype: c.datatype,
    dims: [1],
  }));
  const states = layout.states.map((s) => ({ name: s.input, datatype: s.datatype, dims: s.dims }));
  return {
    inputs: [...controls, ...states],
    outputs: layout.states.map((s) => ({ name: s.output, datatype: s.datatype, dims: s.dims })),
  };
}

/** Each state's initial_state data_file, read and checked against its dims: `<modelDir>/initial_state/<file>`. */
export async function readInitialStates(
  config: ModelConfig,
  layout: SequenceLayout,
  modelDir: string | undefined,
): Promise<Map<string, Uint8Array>> {
  const out = new Map<string, Uint8Array>();
  const sb = sequenceSection(config)!;
  for (const [i, s] of layout.states.entries()) {
    const init = sb.state[i]!.initialState[0];
    if (init?.stateData.case !== "dataFile") continue;
    const where = `sequence_batching: state ${s.input}/${s.output}: initial_state data_file ${init.stateData.value}`;
    if (!modelDir) throw new StageError(Code.InvalidArgument, config.name, `${where}: no model folder to read it from`);
    const path = modelFilePath(join(modelDir, "initial_state"), init.stateData.value, `${where}:`, config.name);
    const bytes = await readFile(path).catch((err: NodeJS.ErrnoException) => {
      throw new StageError(Code.InvalidArgument, config.name, `${where}: cannot read it (${err.code ?? "unreadable"})`);
    });
    const need = elementCount(s.initial.dims) * elementSize(s.datatype);
    if (bytes.byteLength !== need) {
      throw new StageError(
        Code.InvalidArgument,
        config.name,
        `${where}: ${s.datatype} ${formatShape(s.initial.dims)} needs ${need} bytes, got ${bytes.byteLength}`,
      );
    }
    out.set(s.input, viewAs("UINT8", bytes));
  }
  return out;
}
