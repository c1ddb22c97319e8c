export { bridgeDefinition, createTrtBridge, type TrtBridgeOptions } from "./bridge.js";
export { type BridgePlan, checkRemote, type TensorPlan } from "./check.js";
export { bridgeOptionsFromConfig, createStage, PARAMETERS } from "./factory.js";
