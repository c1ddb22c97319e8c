#!/usr/bin/env python3
"""The seed deployment's preprocessing, as its Triton Python model does it, for one photo.

Usage: reference-tensor.py IMAGE OUT [IMAGE OUT ...]
Writes each OUT: the float32 [3, 224, 224] tensor (raw little-endian, no header) that the seed's
OpenCV preprocessing gives for its IMAGE: decode (BGR), resize so the short side is 256
(INTER_LINEAR; the long side int(long * 256 / short), truncated), BGR to RGB, centre crop
224 at ((w - 224) // 2, (h - 224) // 2), / 255, minus the ImageNet mean, over its std, CHW.
The tests pin each output's SHA-256 (fixtures/reference/sha256.json), so an OpenCV that
decodes or resizes differently is caught rather than silently compared against.
Many pairs in one run: importing OpenCV costs more than preprocessing a photo.
"""
import sys

import cv2
import numpy as np

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def preprocess(path: str) -> np.ndarray:
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None:
        raise SystemExit(f"cannot decode {path}")
    h, w = image.shape[:2]
    if h < w:
        size = (int(w * 256 / h), 256)
    else:
        size = (256, int(h * 256 / w))
    image = cv2.resize(image, size, interpolation=cv2.INTER_LINEAR)
    image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    h, w = image.shape[:2]
    top, left = (h - 224) // 2, (w - 224) // 2
    image = image[top : top + 224, left : left + 224]
    x = image.astype(np.float32) / 255.0
    x = (x - MEAN) / STD
    return np.ascontiguousarray(x.transpose(2, 0, 1), dtype="<f4")


if __name__ == "__main__":
    pairs = sys.argv[1:]
    if not pairs or len(pairs) % 2:
        raise SystemExit(__doc__)
    for image_path, out_path in zip(pairs[0::2], pairs[1::2]):
        with open(out_path, "wb") as out:
            out.write(preprocess(image_path).tobytes())
