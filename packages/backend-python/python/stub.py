"""Trellis's Python stub: one process per model instance, as Triton's python backend runs.

It loads the model's TritonPythonModel and answers the Trellis server over stdin/stdout
with length-prefixed frames: [u32 header length][u32 body length][header JSON][body].
The header carries small metadata (names, shapes, offsets); tensor bytes travel raw in
the body, never as JSON. Everything the model prints goes to stderr, so stdout stays
the protocol's alone.
"""
import importlib.util
import json
import os
import struct
import sys
import traceback

PROTOCOL_OUT = sys.stdout.buffer
PROTOCOL_IN = sys.stdin.buffer
# A model's print() must not corrupt the protocol.
sys.stdout = sys.stderr

_DTYPES = {
    "BOOL": "bool", "UINT8": "uint8", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "INT8": "int8", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
}


def read_exact(n):
    chunks = []
    while n > 0:
        chunk = PROTOCOL_IN.read(n)
        if not chunk:
            raise EOFError("the server closed the stub's input")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame():
    header_len, body_len = struct.unpack("<II", read_exact(8))
    header = json.loads(read_exact(header_len))
    body = read_exact(body_len) if body_len else b""
    return header, body


def write_frame(header, parts=()):
    encoded = json.dumps(header).encode()
    body_len = sum(len(p) for p in parts)
    PROTOCOL_OUT.write(struct.pack("<II", len(encoded), body_len))
    PROTOCOL_OUT.write(encoded)
    for p in parts:
        PROTOCOL_OUT.write(p)
    PROTOCOL_OUT.flush()


def decode_tensor(np, meta, body):
    raw = memoryview(body)[meta["offset"]:meta["offset"] + meta["length"]]
    shape = tuple(meta["shape"])
    if meta["datatype"] == "BYTES":
        items = []
        pos = 0
        while pos < len(raw):
            (n,) = struct.unpack_from("<I", raw, pos)
            items.append(bytes(raw[pos + 4:pos + 4 + n]))
            pos += 4 + n
        array = np.empty(len(items), dtype=np.object_)
        array[:] = items
        return array.reshape(shape)
    return np.frombuffer(raw, dtype=_DTYPES[meta["datatype"]]).reshape(shape)


def datatype_of(np, array):
    if array.dtype == np.object_ or array.dtype.kind in ("S", "U"):
        return "BYTES"
    for name, code in _DTYPES.items():
        if np.dtype(code) == array.dtype.newbyteorder("<") or np.dtype(code) == array.dtype:
            return name
    raise TypeError(f"unsupported numpy dtype {array.dtype}")


def encode_tensor(np, name, array, parts, offset):
    datatype = datatype_of(np, array)
    if datatype == "BYTES":
        pieces = []
        for item in array.reshape(-1):
            b = item.encode() if isinstance(item, str) else bytes(item)
            pieces.append(struct.pack("<I", len(b)))
            pieces.append(b)
        data = b"".join(pieces)
    else:
        data = np.ascontiguousarray(array, dtype=_DTYPES[datatype]).tobytes()
    parts.append(data)
    meta = {"name": name, "datatype": datatype, "shape": list(array.shape), "offset": offset, "length": len(data)}
    return meta, offset + len(data)


def encode_tensors(np, tensors, parts, offset):
    metas = []
    for t in tensors:
        meta, offset = encode_tensor(np, t.name(), t.as_numpy(), parts, offset)
        metas.append(meta)
    return metas, offset


def error_text(exc):
    message = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
    return message or type(exc).__name__


_STUB_DIR = os.path.dirname(os.path.abspath(__file__))
_MODEL_DIR = [""]


def _shown_path(filename):
    """A frame's file as a client may see it: relative to the model's folder, else its base name."""
    if _MODEL_DIR[0] and filename.startswith(_MODEL_DIR[0] + os.sep):
        return os.path.relpath(filename, _MODEL_DIR[0])
    return os.path.basename(filename)


def last_lines(limit=6):
    """The traceback's last lines, without the stub's own frames or the server's paths."""
    exc_type, exc, tb = sys.exc_info()
    frames = [f for f in traceback.extract_tb(tb)
              if not f.filename.startswith(_STUB_DIR) and not f.filename.startswith("<frozen")]
    lines = [f'  File "{_shown_path(f.filename)}", line {f.lineno}, in {f.name}' for f in frames]
    lines += [line.rstrip() for line in traceback.format_exception_only(exc_type, exc)]
    return "\n".join(lines[-limit:])


def load_model(args):
    import numpy  # noqa: F401  (a missing numpy fails the load, named)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import triton_python_backend_utils as pb_utils
    path = args["model_file"]
    _MODEL_DIR[0] = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location("trellis_user_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "TritonPythonModel"):
        raise ImportError(f"{os.path.basename(path)} defines no class TritonPythonModel")
    model = module.TritonPythonModel()
    if hasattr(model, "initialize"):
        model.initialize(args["initialize"])
    return model, pb_utils


def make_bls_caller(np, pb_utils):
    counter = [0]

    def call(request):
        counter[0] += 1
        parts = []
        metas, _ = encode_tensors(np, request.inputs(), parts, 0)
        write_frame({
            "type": "bls", "id": counter[0], "model": request.model_name(),
            "version": str(request._model_version) if request._model_version not in (-1, None, "") else "",
            "inputs": metas, "outputs": request.requested_output_names(),
        }, parts)
        header, body = read_frame()
        if header.get("error"):
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(header["error"]))
        outputs = [pb_utils.Tensor(m["name"], decode_tensor(np, m, body)) for m in header["outputs"]]
        return pb_utils.InferenceResponse(output_tensors=outputs)

    return call


def run_execute(np, pb_utils, model, header, body):
    requests = []
    for r in header["requests"]:
        inputs = [pb_utils.Tensor(m["name"], decode_tensor(np, m, body)) for m in r["inputs"]]
        requests.append(pb_utils.InferenceRequest(
            inputs=inputs, requested_output_names=r.get("outputs", []), request_id=r.get("id", "")))
    try:
        responses = model.execute(requests)
    except Exception as exc:  # the model's own failure: those requests fail with its message
        write_frame({"type": "failed", "id": header["id"], "message": error_text(exc)})
        return
    if responses is None:
        responses = []
    parts = []
    offset = 0
    answers = []
    for response in responses:
        if response is None or response.has_error():
            err = response.error() if response is not None else None
            answers.append({"error": error_text(err) if err is not None else "the model answered None"})
            continue
        metas, offset = encode_tensors(np, response.output_tensors(), parts, offset)
        answers.append({"outputs": metas})
    write_frame({"type": "result", "id": header["id"], "responses": answers}, parts)


def main():
    header, _ = read_frame()
    try:
        model, pb_utils = load_model(header)
        import numpy as np
    except BaseException:
        write_frame({"type": "load_failed", "message": last_lines()})
        return 1
    pb_utils._bls_caller = make_bls_caller(np, pb_utils)
    write_frame({"type": "ready"})
    while True:
        try:
            header, body = read_frame()
        except EOFError:
            return 0
        if header["type"] == "finalize":
            if hasattr(model, "finalize"):
                try:
                    model.finalize()
                except Exception:
                    sys.stderr.write(last_lines() + "\n")
            write_frame({"type": "finalized"})
            return 0
        try:
            run_execute(np, pb_utils, model, header, body)
        except Exception as exc:
            write_frame({"type": "failed", "id": header.get("id"), "message": error_text(exc)})


if __name__ == "__main__":
    sys.exit(main())
