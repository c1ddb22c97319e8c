/**
 * @trellis/kserve/wire: KServe v2 protocol detail: tensors to and from raw bytes and typed
 * contents, inference messages to and from their protobuf form, request decompression within a
 * budget, system shared memory, and the HTTP/2 windows for tensor traffic.
 */
export {
  checkHeader,
  contentsFieldOf,
  frameBytes,
  type TensorHeader,
  type TensorRole,
  tensorFromContents,
  tensorFromRaw,
  tensorToContents,
  tensorToRaw,
} from "./codec.js";
export {
  type Coding,
  compressionDeflate,
  DEFAULT_DECOMPRESSION_BUDGET_BYTES,
  DecompressionBudget,
  DecompressionBudgetExhausted,
  holdDecompressedUntilClose,
  inflateDeflate,
  inflateWithin,
  inputTooLarge,
  isZlibWrapped,
  namingInputLimit,
  requestCompression,
} from "./compression.js";
export { HTTP2_SETTINGS, HTTP2_WINDOW_BYTES, widenSessionWindow } from "./http2-settings.js";
export {
  namesSharedMemory,
  type SharedMemoryRef,
  type SharedMemoryRegion,
  SystemSharedMemory,
  sharedMemoryNotTaken,
  sharedMemoryOutputParameters,
  sharedMemoryRef,
  withoutSharedMemory,
} from "./shared-memory.js";
export {
  inferRequestFromWire,
  inferRequestToWire,
  inferResponseFromWire,
  inferResponseToWire,
  metadataFromWire,
  metadataToWire,
  parametersFromWire,
  parametersToWire,
} from "./wire.js";
