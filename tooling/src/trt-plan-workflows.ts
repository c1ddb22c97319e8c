/**
 * The two GPU workflows besides trtexec that the source tutorial serves from Triton:
 * Torch-TensorRT (a TorchScript module, platform pytorch_libtorch) and TF-TRT (a SavedModel,
 * platform tensorflow_savedmodel). For each: the names and files Triton's backend looks for,
 * and the short Python build script, run in NVIDIA's framework container of the release.
 */

/** Which tool builds the optimised model, and so which Triton platform serves it. */
export type TrtWorkflow = "trtexec" | "torch-trt" | "tf-trt";
export const TRT_WORKFLOWS: readonly TrtWorkflow[] = ["trtexec", "torch-trt", "tf-trt"];

export interface WorkflowRules {
  /** config.pbtxt's platform and backend. */
  platform: string;
  backend: string;
  /** What Triton loads from the version folder (a file, or a folder for a SavedModel). */
  modelFile: string;
  /** Suffix of the generated Trellis bridge and ensemble names, and of the Triton model's default name. */
  suffix: string;
  /** The framework container that runs the build script (the release is appended). */
  container: (release: string) => string;
}

export const WORKFLOW_RULES: Readonly<Record<TrtWorkflow, WorkflowRules>> = {
  trtexec: {
    platform: "tensorrt_plan",
    backend: "tensorrt",
    modelFile: "model.plan",
    suffix: "_trt",
    container: (r) => `nvcr.io/nvidia/tensorrt:${r}-py3`,
  },
  // Triton's PyTorch backend: TorchScript keeps no tensor names, so they are <name>__<index>.
  "torch-trt": {
    platform: "pytorch_libtorch",
    backend: "pytorch",
    modelFile: "model.pt",
    suffix: "_torchtrt",
    container: (r) => `nvcr.io/nvidia/pytorch:${r}-py3`,
  },
  // Triton's TensorFlow backend: the serving signature's names, a SavedModel folder.
  "tf-trt": {
    platform: "tensorflow_savedmodel",
    backend: "tensorflow",
    modelFile: "model.savedmodel",
    suffix: "_tftrt",
    container: (r) => `nvcr.io/nvidia/tensorflow:${r}-tf2-py3`,
  },
};

/** Keras' ResNet50 serving signature names (the tutorial's): its input layer and its top layer. */
export const TF_SIGNATURE = { input: "input_1", output: "predictions" } as const;

/** The name Triton knows each tensor by, for this workflow; `undefined` keeps the ONNX config's names. */
export function remoteTensorNames(
  workflow: TrtWorkflow,
  inputs: readonly string[],
  outputs: readonly string[],
): { inputs: string[]; outputs: string[] } | undefined {
  if (workflow === "torch-trt") {
    return { inputs: inputs.map((_, i) => `input__${i}`), outputs: outputs.map((_, i) => `output__${i}`) };
  }
  if (workflow === "tf-trt") {
    if (inputs.length !== 1 || outputs.length !== 1) return undefined;
    return { inputs: [TF_SIGNATURE.input], outputs: [TF_SIGNATURE.output] };
  }
  return undefined;
}

export interface ScriptInputs {
  /** Where the script writes model.pt or model.savedmodel (the Triton model's version folder). */
  versionDir: string;
  /** Item dims of the one input (CHW, as the ensemble's preprocess sends it). */
  itemDims: number[];
  batch: { min: number; opt: number; max: number };
  fp16: boolean;
  ioFp16: boolean;
}

const shape = (batch: number, dims: number[]) => `(${[batch, ...dims].join(", ")})`;

/**
 * Torch-TensorRT: torchvision's ResNet-50 (replace it with your trained module), compiled for
 * the batch profile through TorchScript, saved where Triton's PyTorch backend looks.
 */
export function torchTrtScript(s: ScriptInputs): string {
  const dtype = s.ioFp16 ? "torch.half" : "torch.float32";
  const precisions = s.fp16 ? "{torch.half}" : "{torch.float32}";
  return `# Torch-TensorRT: a trained torch.nn.Module -> TensorRT-compiled TorchScript for Triton's PyTorch backend.
import os
import torch
import torch_tensorrt
import torchvision

# Your trained model here; torchvision's ImageNet ResNet-50 is the tutorial's.
model = torchvision.models.resnet50(weights="IMAGENET1K_V1").eval().cuda()${s.ioFp16 ? ".half()" : ""}
compiled = torch_tensorrt.compile(
    model,
    ir="ts",  # TorchScript: what Triton's pytorch_libtorch platform loads
    inputs=[torch_tensorrt.Input(
        min_shape=${shape(s.batch.min, s.itemDims)},
        opt_shape=${shape(s.batch.opt, s.itemDims)},
        max_shape=${shape(s.batch.max, s.itemDims)},
        dtype=${dtype},
    )],
    enabled_precisions=${precisions},
)
os.makedirs("${s.versionDir}", exist_ok=True)
torch.jit.save(compiled, "${s.versionDir}/model.pt")
print("wrote ${s.versionDir}/model.pt")
`;
}

/**
 * TF-TRT: Keras' ResNet50 (replace it with your trained model) behind a serving signature that
 * takes the ensemble's CHW, torchvision-normalised tensor (Keras' weights want NHWC, BGR minus
 * the Caffe means), converted by TrtGraphConverterV2 and saved as the SavedModel Triton loads.
 */
export function tfTrtScript(s: ScriptInputs): string {
  const precision = s.fp16 ? "FP16" : "FP32";
  const [c, h, w] = s.itemDims;
  return `# TF-TRT: a trained Keras model -> TensorRT-converted SavedModel for Triton's TensorFlow backend.
import numpy as np
import tensorflow as tf
from tensorflow.python.compiler.tensorrt import trt_convert as trt

# Your trained model here; Keras' ImageNet ResNet50 is the tutorial's. Logits out, as the
# ONNX model's output (the postprocess applies the softmax): no activation on the top layer.
keras_model = tf.keras.applications.ResNet50(weights="imagenet", classifier_activation=None)
MEAN = tf.constant([0.485, 0.456, 0.406], shape=[1, 3, 1, 1])
STD = tf.constant([0.229, 0.224, 0.225], shape=[1, 3, 1, 1])
CAFFE_BGR_MEAN = tf.constant([103.939, 116.779, 123.68])

class Serving(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, ${c}, ${h}, ${w}], tf.float32, name="${TF_SIGNATURE.input}")])
    def serve(self, ${TF_SIGNATURE.input}):
        # The ensemble sends torchvision's normalised RGB CHW; Keras' ResNet50 wants BGR HWC, Caffe means.
        rgb = (${TF_SIGNATURE.input} * STD + MEAN) * 255.0
        bgr = tf.transpose(rgb, [0, 2, 3, 1])[..., ::-1] - CAFFE_BGR_MEAN
        return {"${TF_SIGNATURE.output}": keras_model(bgr, training=False)}

serving = Serving()
tf.saved_model.save(serving, "/tmp/resnet50_savedmodel", signatures={"serving_default": serving.serve})

converter = trt.TrtGraphConverterV2(
    input_saved_model_dir="/tmp/resnet50_savedmodel",
    precision_mode=trt.TrtPrecisionMode.${precision},
)
converter.convert()
# Build the engines now for the profile's batch sizes, not at Triton's first request.
converter.build(input_fn=lambda: ((np.zeros((b, ${c}, ${h}, ${w}), np.float32),) for b in (${s.batch.min}, ${s.batch.opt}, ${s.batch.max})))
converter.save("${s.versionDir}/model.savedmodel")
print("wrote ${s.versionDir}/model.savedmodel")
`;
}
