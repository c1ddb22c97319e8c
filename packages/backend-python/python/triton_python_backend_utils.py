"""Trellis's triton_python_backend_utils: the parts of Triton's module that models commonly use.

Tensors are numpy arrays; the stub (stub.py) moves them to and from the Trellis server
as raw bytes. BLS requests go back to the server through the same stub.
"""
import json
import sys

import numpy as np

TRITONSERVER_LOG_INFO = 0
TRITONSERVER_LOG_WARN = 1
TRITONSERVER_LOG_ERROR = 2
TRITONSERVER_LOG_VERBOSE = 3

_NUMPY_OF = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}
# Config names (TYPE_FP32, and TYPE_STRING for BYTES) as well as the wire's (FP32, BYTES).
_TRITON_TO_NUMPY = {
    **_NUMPY_OF,
    **{"TYPE_" + k: v for k, v in _NUMPY_OF.items() if k != "BYTES"},
    "TYPE_STRING": np.object_,
}


def triton_string_to_numpy(triton_type_string):
    return _TRITON_TO_NUMPY[triton_type_string]


class TritonError(Exception):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message, code=None):
        super().__init__(message)
        self._message = message
        self._code = TritonError.INTERNAL if code is None else code

    def message(self):
        return self._message

    def code(self):
        return self._code


class TritonModelException(TritonError):
    pass


class Tensor:
    def __init__(self, name, array):
        if not isinstance(array, np.ndarray):
            array = np.asarray(array)
        self._name = name
        self._array = array

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array

    def is_cpu(self):
        return True

    def to_dlpack(self):
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name, capsule):
        if not hasattr(np, "from_dlpack"):
            raise TritonModelException("Tensor.from_dlpack needs numpy >= 1.22")
        return Tensor(name, np.from_dlpack(capsule))


class InferenceResponse:
    def __init__(self, output_tensors=None, error=None):
        self._outputs = list(output_tensors or [])
        self._error = error

    def output_tensors(self):
        return self._outputs

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error


class InferenceRequest:
    """A request: the one execute receives, or a BLS request to another Trellis model."""

    def __init__(self, model_name=None, inputs=None, requested_output_names=None, model_version=-1,
                 request_id="", parameters=None, **_ignored):
        self._model_name = model_name
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names or [])
        self._model_version = model_version
        self._request_id = request_id
        self._parameters = parameters if isinstance(parameters, str) else json.dumps(parameters or {})

    def inputs(self):
        return self._inputs

    def request_id(self):
        return self._request_id

    def requested_output_names(self):
        return self._requested

    def parameters(self):
        return self._parameters

    def model_name(self):
        return self._model_name

    def exec(self, decoupled=False):
        if _bls_caller is None:
            raise TritonModelException("BLS is only available while the model executes")
        return _bls_caller(self)

    async def async_exec(self, decoupled=False):
        return self.exec(decoupled)


_bls_caller = None


def get_input_tensor_by_name(request, name):
    for t in request.inputs():
        if t.name() == name:
            return t
    return None


def get_output_tensor_by_name(response, name):
    for t in response.output_tensors():
        if t.name() == name:
            return t
    return None


def _config_entry(model_config, key, name):
    for entry in model_config.get(key, []):
        if entry.get("name") == name:
            return entry
    return None


def get_input_config_by_name(model_config, name):
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config, name):
    return _config_entry(model_config, "output", name)


class Logger:
    @staticmethod
    def log(message, level=TRITONSERVER_LOG_INFO):
        names = {0: "INFO", 1: "WARN", 2: "ERROR", 3: "VERBOSE"}
        sys.stderr.write(f"{names.get(level, 'INFO')}: {message}\n")
        sys.stderr.flush()

    @staticmethod
    def log_info(message):
        Logger.log(message, TRITONSERVER_LOG_INFO)

    @staticmethod
    def log_warn(message):
        Logger.log(message, TRITONSERVER_LOG_WARN)

    @staticmethod
    def log_error(message):
        Logger.log(message, TRITONSERVER_LOG_ERROR)

    @staticmethod
    def log_verbose(message):
        Logger.log(message, TRITONSERVER_LOG_VERBOSE)
