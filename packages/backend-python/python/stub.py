"""Trellis's Python stub: one process per model instance, as Triton's python backend runs.

It loads the model's TritonPythonModel and answers the Trellis server over stdin/stdout
with length-prefixed frames: [u32 header length][u32 body length][header JSON][body].
The header carries small metadata (names, shapes, offsets); tensor bytes travel raw in
the body, never as JSON. Everything the model prints goes to stderr, so stdout stays
the protocol's alone.
"""
import asyncio
import importlib.util
import inspect
import itertools
import json
import os
import queue
import struct
import sys
import threading
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


class Progress:
    """Which request the model last read: 8 bytes (execution id, request index + 1) in a file the
    server opened and passed as fd 3, mapped here. When the process crashes or hangs, the server
    reads it to run that request last while it finds the culprit (a model reads its requests one
    at a time, so the last one read is the one being computed), sparing a second restart."""

    def __init__(self, fd=3):
        self._map = None
        try:
            import mmap
            self._map = mmap.mmap(fd, 8)
        except (OSError, ValueError):
            pass  # no such fd (an older server): the culprit search runs without the hint

    def reading(self, execute_id, index):
        if self._map is not None:
            struct.pack_into("<II", self._map, 0, execute_id & 0xFFFFFFFF, index + 1)


PROGRESS = Progress()


class AnswerFile:
    """A large answer's body goes through a memory file (memfd) instead of the pipe: the server
    opens it once (/proc/<pid>/fd/<n>, named in the "ready" frame) and reads a body with one read
    in its thread pool, where the pipe's 64 KiB chunks each cost its event loop a wakeup and a copy,
    and each side a context switch. Only an execution's result uses it: the server reads it before
    it sends the next execution, so one file is never written while it is read. The body is copied
    into a mapping kept from one answer to the next: its pages are reused, and a copy in user space
    ran 5 times as fast as write() here (the kernel's copy paid more for the model's untouched pages)."""

    def __init__(self):
        self.fd = None
        self.map = None
        try:
            self.fd = os.memfd_create("trellis-answer", os.MFD_CLOEXEC)
        except (AttributeError, OSError):
            pass  # no memfd here: every answer goes through the pipe

    def takes(self, header, length):
        """The server asked for bodies from `answer_file` bytes on, up to its answer bound."""
        low = header.get("answer_file")
        return self.fd is not None and low is not None and low <= length <= header.get("answer_max", 0)

    # Kept from one answer to the next up to this size; a larger file is emptied when the next
    # execution comes (the server has read it by then), so a rare huge answer is not held for long.
    RETAIN_BYTES = 64 << 20

    def trim(self):
        if self.map is not None and len(self.map) > self.RETAIN_BYTES:
            self._resize(0)

    def write(self, np, parts, length):
        size = len(self.map) if self.map is not None else 0
        # Grown to the answer, shrunk when one is far smaller: memory held stays near the last
        # large answer's size.
        if length > size or length < size // 4:
            self._resize(length)
        target = np.frombuffer(self.map, dtype=np.uint8)
        offset = 0
        for part in parts:
            source = np.frombuffer(part, dtype=np.uint8)
            target[offset:offset + len(source)] = source
            offset += len(source)
        del target  # a view of the map must not outlive this call: _resize closes it

    def _resize(self, length):
        import mmap
        if self.map is not None:
            self.map.close()
            self.map = None
        os.ftruncate(self.fd, length)
        if length > 0:
            self.map = mmap.mmap(self.fd, length)


ANSWER_FILE = AnswerFile()

# Frames may be written from the model's own threads (BLS, a decoupled model's response sender).
_WRITE_LOCK = threading.Lock()
# async def execute / initialize / finalize run on this one loop, kept for the process's life.
_LOOP = asyncio.new_event_loop()


def write_frame(header, parts=()):
    encoded = json.dumps(header).encode()
    body_len = sum(len(p) for p in parts)
    with _WRITE_LOCK:
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
        # A view of the array's own memory: a copy (tobytes) costs as much as the pipe for large answers.
        contiguous = np.ascontiguousarray(array, dtype=_DTYPES[datatype])
        data = memoryview(contiguous).cast("B") if contiguous.size else b""
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


def import_user_module(path):
    """Imports the user's model.py (its folder first on sys.path, as Triton's stub does) and
    checks that it defines TritonPythonModel."""
    _MODEL_DIR[0] = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location("trellis_user_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "TritonPythonModel"):
        raise ImportError(f"{os.path.basename(path)} defines no class TritonPythonModel")
    return module


def load_model(args, pb_utils):
    path = args["model_file"]
    module = import_user_module(path)
    model = module.TritonPythonModel()
    if hasattr(model, "initialize"):
        result = model.initialize(args["initialize"])
        if inspect.iscoroutine(result):
            _LOOP.run_until_complete(result)
    return model


def triton_code(exc, default=1):
    """The TritonError code an exception carries (TritonError.INTERNAL = 1 otherwise)."""
    code = getattr(exc, "code", None)
    if callable(code):
        try:
            value = code()
        except Exception:
            return default
        if isinstance(value, int) and 0 <= value <= 7:
            return value
    return default


class Inbox:
    """Reads every frame the server sends, on its own thread: BLS answers and cancellations are
    handled as they come (so a model may wait on several BLS calls at once), the rest is queued
    for the main loop in order."""

    def __init__(self):
        self.main = queue.Queue()
        self._waiting = {}
        self._lock = threading.Lock()
        self.cancel_events = {}
        # Decoupled requests' senders still open, to close when the server says so.
        self.senders = {}

    def expect(self, call_id, callback):
        with self._lock:
            self._waiting[call_id] = callback

    def run(self):
        while True:
            try:
                header, body = read_frame()
            except Exception:  # EOF or a broken frame: the server is gone or the pipe is unusable
                self._fail_waiting()
                self.main.put(None)
                return
            kind = header.get("type")
            if kind == "bls_result":
                with self._lock:
                    # A decoupled call's responses come one frame each (more: true) before its last.
                    if header.get("more"):
                        callback = self._waiting.get(header.get("id"))
                    else:
                        callback = self._waiting.pop(header.get("id"), None)
                if callback is not None:
                    callback(header, body)
            elif kind == "cancel":
                key = (header.get("execute"), header.get("index"))
                event = self.cancel_events.get(key)
                if event is not None:
                    event.set()
                # The server will take no more responses for that request (bound, deadline, gone).
                sender = self.senders.pop(key, None) if header.get("close") else None
                if sender is not None:
                    sender.closed = True
                    sender._request._cancelled.set()  # is_cancelled() says so from now on
            elif kind == "forget":
                self.senders.pop((header.get("execute"), header.get("index")), None)
            else:
                self.main.put((header, body))

    def _fail_waiting(self):
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for callback in waiting.values():
            callback({"error": "the server closed the stub's input", "code": 4}, b"")


def _settle(future, value):
    if not future.done():
        future.set_result(value)


class ResponseStream:
    """exec(decoupled=True)'s answer: iterates the callee's responses as the server passes them
    on, one frame each, ending with its last (an error one if the call failed)."""

    def __init__(self, bls):
        self._bls = bls
        self._frames = queue.Queue()
        self._ended = False

    def arrived(self, header, body):
        self._frames.put((header, body))

    def __iter__(self):
        return self

    def __next__(self):
        while not self._ended:
            header, body = self._frames.get()
            if header.get("more"):
                return self._bls._response(header.get("response") or {}, body)
            self._ended = True
            if header.get("error") is not None:
                return self._bls._response(header, body)
        raise StopIteration


class Bls:
    """BLS: requests from the model to the server's models, each with its own id, so several
    can be in flight at once (async_exec under asyncio.gather)."""

    def __init__(self, np, pb_utils, inbox):
        self.np = np
        self.pb = pb_utils
        self.inbox = inbox
        self.ids = itertools.count(1)

    def _send(self, header, parts, callback):
        call_id = next(self.ids)
        self.inbox.expect(call_id, callback)
        write_frame({**header, "id": call_id}, parts)

    def _send_request(self, request, decoupled, callback):
        if not request.model_name():
            raise self.pb.TritonModelException("InferenceRequest: model_name is needed for exec()",
                                               self.pb.TritonError.INVALID_ARG)
        parts = []
        metas, _ = encode_tensors(self.np, request.inputs(), parts, 0)
        version = request._model_version
        self._send({
            "type": "bls", "model": request.model_name(),
            "version": str(version) if version not in (-1, None, "") else "",
            "inputs": metas, "outputs": request.requested_output_names(),
            "parameters": request.parameters(), "decoupled": bool(decoupled),
        }, parts, callback)

    def _stream(self, request):
        stream = ResponseStream(self)
        self._send_request(request, True, stream.arrived)
        return stream

    def call(self, request, decoupled):
        if decoupled:
            return self._stream(request)
        done = threading.Event()
        box = []

        def arrived(header, body):
            box.append((header, body))
            done.set()

        self._send_request(request, False, arrived)
        done.wait()
        return self._response(*box[0])

    async def call_async(self, request, decoupled):
        if decoupled:
            # As Triton: the awaited call gives an iterator of the responses as they come.
            return self._stream(request)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._send_request(request, False,
                           lambda header, body: loop.call_soon_threadsafe(_settle, future, (header, body)))
        header, body = await future
        return self._response(header, body)

    def _response(self, r, body):
        pb = self.pb
        if r.get("error") is not None:
            return pb.InferenceResponse(error=pb.TritonError(str(r["error"]), int(r.get("code", 1))))
        outputs = [pb.Tensor(m["name"], decode_tensor(self.np, m, body)) for m in r.get("outputs", [])]
        return pb.InferenceResponse(output_tensors=outputs, parameters=r.get("parameters") or None)

    def metrics(self, message, wait):
        """Custom metrics: made (and bounded) by the server, so a refusal raises here, named; an
        update needs no answer (frames keep their order, so a later value() sees it)."""
        if not wait:
            write_frame({"type": "metric_update", **message})
            return None
        done = threading.Event()
        box = []

        def arrived(header, _body):
            box.append(header)
            done.set()

        self._send({"type": "metric", **message}, [], arrived)
        done.wait()
        header = box[0]
        if header.get("error") is not None:
            raise self.pb.TritonModelException(str(header["error"]), int(header.get("code", 1)))
        return header

    def control(self, action, model, version):
        if not isinstance(model, str) or not model:
            raise TypeError(f"model_name must be a non-empty str, not {model!r}")
        done = threading.Event()
        box = []

        def arrived(header, _body):
            box.append(header)
            done.set()

        self._send({"type": "control", "action": action, "model": model, "version": version}, [], arrived)
        done.wait()
        header = box[0]
        if header.get("error") is not None:
            raise self.pb.TritonModelException(str(header["error"]), int(header.get("code", 1)))
        return bool(header.get("ready"))


class ResponseSender:
    """A decoupled model's request's sender (request.get_response_sender()): send() as often as
    the model likes, from any thread, until a send with TRITONSERVER_RESPONSE_COMPLETE_FINAL
    closes it (or the server does: past its response bound, or its deadline)."""

    def __init__(self, np, pb_utils, execute_id, index, request):
        self._np = np
        self._pb = pb_utils
        self._execute = execute_id
        self._index = index
        self._request = request
        self._lock = threading.Lock()
        self.closed = False

    def send(self, response=None, flags=0):
        pb = self._pb
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if flags not in (0, final):
            raise TypeError(f"send: flags must be 0 or TRITONSERVER_RESPONSE_COMPLETE_FINAL, not {flags!r}")
        if response is not None and not isinstance(response, pb.InferenceResponse):
            raise TypeError(f"send: response must be a pb_utils.InferenceResponse, not {type(response).__name__}")
        if response is None and flags != final:
            raise pb.TritonModelException(
                "send: response may be None only with flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL",
                pb.TritonError.INVALID_ARG)
        with self._lock:
            if self.closed:
                raise pb.TritonModelException("Unable to send response. Response sender has been closed.")
            if flags == final:
                self.closed = True
            header = {"type": "response", "execute": self._execute, "index": self._index, "final": flags == final}
            parts = []
            if response is not None:
                header.update(response_answer(self._np, pb, response, parts, 0)[0])
            write_frame(header, parts)

    def is_cancelled(self):
        return self._request.is_cancelled()


def response_answer(np, pb_utils, response, parts, offset):
    """One response as the server reads it (outputs, or an error with its code), and the next offset."""
    if not isinstance(response, pb_utils.InferenceResponse):
        what = "None" if response is None else type(response).__name__
        return {"error": f"execute() answered {what}, not a pb_utils.InferenceResponse", "code": 1}, offset
    if response.has_error():
        err = response.error()
        return {"error": error_text(err), "code": triton_code(err)}, offset
    metas, offset = encode_tensors(np, response.output_tensors(), parts, offset)
    answer = {"outputs": metas}
    if response._parameters:
        answer["parameters"] = response._parameters
    return answer, offset


def make_requests(np, pb_utils, inbox, header, body):
    requests = []
    for index, r in enumerate(header["requests"]):
        inputs = [pb_utils.Tensor(m["name"], decode_tensor(np, m, body)) for m in r["inputs"]]
        request = pb_utils.InferenceRequest(
            inputs=inputs, requested_output_names=r.get("outputs", []), request_id=r.get("id", ""),
            parameters=r.get("parameters") or "{}")
        event = threading.Event()
        inbox.cancel_events[(header["id"], index)] = event
        request._cancelled = event
        request._on_read = (header["id"], index)
        if header.get("decoupled"):
            request._sender = ResponseSender(np, pb_utils, header["id"], index, request)
            inbox.senders[(header["id"], index)] = request._sender
        requests.append(request)
    return requests


def run_execute(np, pb_utils, inbox, model, header, body):
    ANSWER_FILE.trim()
    requests = make_requests(np, pb_utils, inbox, header, body)
    try:
        responses = model.execute(requests)
        if inspect.iscoroutine(responses):  # async def execute
            responses = _LOOP.run_until_complete(responses)
    except Exception as exc:  # the model's own failure: those requests fail with its message
        write_frame({"type": "failed", "id": header["id"], "message": error_text(exc), "code": triton_code(exc)})
        return
    finally:
        inbox.cancel_events.clear()
    if header.get("decoupled"):
        # Its responses went through the senders (maybe still going, from the model's threads).
        done = {"type": "executed", "id": header["id"]}
        if responses is not None:
            done.update(error="a decoupled model's execute() must return None "
                              "(it answers through request.get_response_sender())", code=1)
        write_frame(done)
        return
    if responses is None:
        responses = []
    parts = []
    offset = 0
    answers = []
    for response in responses:
        answer, offset = response_answer(np, pb_utils, response, parts, offset)
        answers.append(answer)
    result = {"type": "result", "id": header["id"], "responses": answers}
    if ANSWER_FILE.takes(header, offset):
        try:
            ANSWER_FILE.write(np, parts, offset)
        except (OSError, ValueError):
            pass  # the file could not take it (no memory for its pages): the pipe carries this one
        else:
            write_frame({**result, "body_in_file": offset})
            return
    write_frame(result, parts)


def auto_complete(header):
    """Runs TritonPythonModel.auto_complete_config on the config as the repository gives it, and
    answers the completed config (no instance is made: Triton calls it before any starts)."""
    import numpy  # noqa: F401  (a missing numpy fails the load, named)
    sys.path.insert(0, _STUB_DIR)
    import triton_python_backend_utils as pb_utils
    path = header["model_file"]
    module = import_user_module(path)
    config = pb_utils.ModelConfig(header["model_config"])
    complete = getattr(module.TritonPythonModel, "auto_complete_config", None)
    if complete is not None:
        config = complete(config)
        if not isinstance(config, pb_utils.ModelConfig):
            raise TypeError(f"auto_complete_config returned {type(config).__name__}, not the pb_utils.ModelConfig it was given")
    return config.as_dict()


def main():
    header, _ = read_frame()
    if header.get("type") == "auto_complete":
        try:
            completed = auto_complete(header)
        except BaseException:
            write_frame({"type": "load_failed", "message": last_lines()})
            return 1
        write_frame({"type": "config", "config": completed})
        return 0
    inbox = Inbox()
    try:
        import numpy as np  # a missing numpy fails the load, named
        sys.path.insert(0, _STUB_DIR)
        import triton_python_backend_utils as pb_utils
        threading.Thread(target=inbox.run, name="trellis-inbox", daemon=True).start()
        pb_utils._bls = Bls(np, pb_utils, inbox)
        pb_utils._progress = PROGRESS
        model = load_model(header, pb_utils)
    except BaseException:
        write_frame({"type": "load_failed", "message": last_lines()})
        return 1
    write_frame({"type": "ready", "answer_fd": ANSWER_FILE.fd})
    while True:
        item = inbox.main.get()
        if item is None:
            return 0
        header, body = item
        if header["type"] == "finalize":
            if hasattr(model, "finalize"):
                try:
                    result = model.finalize()
                    if inspect.iscoroutine(result):
                        _LOOP.run_until_complete(result)
                except Exception:
                    sys.stderr.write(last_lines() + "\n")
            write_frame({"type": "finalized"})
            return 0
        try:
            run_execute(np, pb_utils, inbox, model, header, body)
        except Exception as exc:
            write_frame({"type": "failed", "id": header.get("id"), "message": error_text(exc),
                         "code": triton_code(exc)})


if __name__ == "__main__":
    sys.exit(main())
