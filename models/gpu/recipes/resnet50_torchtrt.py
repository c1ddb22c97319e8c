# Torch-TensorRT: a trained torch.nn.Module -> TensorRT-compiled TorchScript for Triton's PyTorch backend.
import os
import torch
import torch_tensorrt
import torchvision

# Your trained model here; torchvision's ImageNet ResNet-50 is the tutorial's.
model = torchvision.models.resnet50(weights="IMAGENET1K_V1").eval().cuda()
compiled = torch_tensorrt.compile(
    model,
    ir="ts",  # TorchScript: what Triton's pytorch_libtorch platform loads
    inputs=[torch_tensorrt.Input(
        min_shape=(1, 3, 224, 224),
        opt_shape=(256, 3, 224, 224),
        max_shape=(512, 3, 224, 224),
        dtype=torch.float32,
    )],
    enabled_precisions={torch.half},
)
os.makedirs("models/gpu/triton/resnet50_torchtrt/1", exist_ok=True)
torch.jit.save(compiled, "models/gpu/triton/resnet50_torchtrt/1/model.pt")
print("wrote models/gpu/triton/resnet50_torchtrt/1/model.pt")
