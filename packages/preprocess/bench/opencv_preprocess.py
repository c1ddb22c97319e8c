"""The seed's preprocessing (Triton Python backend, OpenCV) timed on the same files.

Usage: opencv_preprocess.py REPS FILE...   Prints JSON: {"images": n, "seconds": s}.
Pipeline exactly as the seed: imdecode (BGR) -> short side 256 (INTER_LINEAR,
long side truncated) -> BGR to RGB -> center crop 224 -> /255 -> mean/std -> CHW.
"""
import json
import sys
import time

import cv2
import numpy as np

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def preprocess(data: bytes) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    h, w = img.shape[:2]
    if h < w:
        nh, nw = 256, int(w * 256 / h)
    else:
        nh, nw = int(h * 256 / w), 256
    img = cv2.resize(img, (nw, nh), interpolation=cv2.INTER_LINEAR)
    img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    top, left = (nh - 224) // 2, (nw - 224) // 2
    img = img[top : top + 224, left : left + 224].astype(np.float32) / 255.0
    img = (img - MEAN) / STD
    return np.ascontiguousarray(img.transpose(2, 0, 1))


def main() -> None:
    reps = int(sys.argv[1])
    blobs = [open(f, "rb").read() for f in sys.argv[2:]]
    for b in blobs:  # warm-up
        preprocess(b)
    start = time.perf_counter()
    n = 0
    for _ in range(reps):
        for b in blobs:
            preprocess(b)
            n += 1
    print(json.dumps({"images": n, "seconds": time.perf_counter() - start, "opencv": cv2.__version__}))


if __name__ == "__main__":
    main()
