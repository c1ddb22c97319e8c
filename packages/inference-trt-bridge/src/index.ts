export { createTrtBridge, neverSent, type TrtBridgeOptions } from "./bridge.js";
export { type BridgePlan, checkRemote, type TensorPlan } from "./check.js";
export { bridgeOptionsFromConfig, createStage, PARAMETERS } from "./factory.js";
export { float16ArrayToFloat32, float16BitsToFloat32, float32ArrayToFloat16, float32ToFloat16Bits } from "./fp16.js";
