# TF-TRT: a trained Keras model -> TensorRT-converted SavedModel for Triton's TensorFlow backend.
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
    @tf.function(input_signature=[tf.TensorSpec([None, 3, 224, 224], tf.float32, name="input_1")])
    def serve(self, input_1):
        # The ensemble sends torchvision's normalised RGB CHW; Keras' ResNet50 wants BGR HWC, Caffe means.
        rgb = (input_1 * STD + MEAN) * 255.0
        bgr = tf.transpose(rgb, [0, 2, 3, 1])[..., ::-1] - CAFFE_BGR_MEAN
        return {"predictions": keras_model(bgr, training=False)}

serving = Serving()
tf.saved_model.save(serving, "/tmp/resnet50_savedmodel", signatures={"serving_default": serving.serve})

converter = trt.TrtGraphConverterV2(
    input_saved_model_dir="/tmp/resnet50_savedmodel",
    precision_mode=trt.TrtPrecisionMode.FP16,
)
converter.convert()
# Build the engines now for the profile's batch sizes, not at Triton's first request.
converter.build(input_fn=lambda: ((np.zeros((b, 3, 224, 224), np.float32),) for b in (1, 256, 512)))
converter.save("models/gpu/triton/resnet50_tftrt/1/model.savedmodel")
print("wrote models/gpu/triton/resnet50_tftrt/1/model.savedmodel")
