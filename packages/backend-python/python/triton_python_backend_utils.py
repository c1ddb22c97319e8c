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

# A decoupled response sender's flag: the request's last response.
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2

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
    """An error with Triton's code; the code reaches the client (INVALID_ARG: 400 / INVALID_ARGUMENT)."""
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message, code=None):
        if not isinstance(message, str):
            raise TypeError(f"TritonError: message must be a str, not {type(message).__name__}")
        if code is None:
            code = TritonError.INTERNAL
        if not isinstance(code, int) or isinstance(code, bool) or not 0 <= code <= 7:
            raise TypeError(f"TritonError: code must be one of TritonError's codes (0..7), not {code!r}")
        super().__init__(message)
        self._message = message
        self._code = code

    def message(self):
        return self._message

    def code(self):
        return self._code


class TritonModelException(TritonError):
    pass


def _check_name(what, name):
    if not isinstance(name, str):
        raise TypeError(f"{what}: name must be a str, not {type(name).__name__}")
    if not name:
        raise TritonModelException(f"{what}: name must not be empty", TritonError.INVALID_ARG)


def _check_list(what, items, cls, cls_name):
    if items is None:
        return []
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{what} must be a list of {cls_name}, not {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, cls):
            raise TypeError(f"{what}[{i}] must be a {cls_name}, not {type(item).__name__}")
    return list(items)


class Tensor:
    def __init__(self, name, array):
        _check_name("pb_utils.Tensor", name)
        if not isinstance(array, np.ndarray):
            raise TypeError(
                f"pb_utils.Tensor(\"{name}\", ...): the data must be a numpy.ndarray, not {type(array).__name__}")
        if array.dtype.kind not in "biufOSU":
            raise TypeError(f"pb_utils.Tensor(\"{name}\", ...): numpy dtype {array.dtype} has no Triton datatype")
        self._name = name
        self._array = array

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array

    def shape(self):
        return list(self._array.shape)

    def is_cpu(self):
        return True

    def to_dlpack(self):
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name, capsule):
        if not hasattr(np, "from_dlpack"):
            raise TritonModelException("Tensor.from_dlpack needs numpy >= 1.22")
        return Tensor(name, np.from_dlpack(capsule))


def _response_parameters(parameters):
    """Triton takes a dict (or its JSON text) of str keys to bool, int or str values."""
    if parameters is None:
        return {}
    if isinstance(parameters, str):
        try:
            parameters = json.loads(parameters)
        except ValueError as exc:
            raise TritonModelException(f"InferenceResponse: parameters is not JSON: {exc}", TritonError.INVALID_ARG)
    if not isinstance(parameters, dict):
        raise TypeError(f"InferenceResponse: parameters must be a dict, not {type(parameters).__name__}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TypeError(f"InferenceResponse: parameter keys must be str, not {type(key).__name__}")
        if not isinstance(value, (bool, int, str)):
            raise TypeError(
                f"InferenceResponse: parameter \"{key}\" must be a bool, int or str, not {type(value).__name__}")
    return dict(parameters)


class InferenceResponse:
    def __init__(self, output_tensors=None, error=None, parameters=None):
        self._outputs = _check_list("InferenceResponse: output_tensors", output_tensors, Tensor, "pb_utils.Tensor")
        if error is not None and not isinstance(error, TritonError):
            raise TypeError(f"InferenceResponse: error must be a pb_utils.TritonError, not {type(error).__name__}")
        self._error = error
        self._parameters = _response_parameters(parameters)

    def output_tensors(self):
        return self._outputs

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        return json.dumps(self._parameters)


def _model_name_text(model_name):
    # A name read from a BYTES input (as_numpy()[0]) is bytes: Triton takes it as its UTF-8 text.
    if isinstance(model_name, (bytes, np.bytes_)):
        return bytes(model_name).decode("utf-8")
    if isinstance(model_name, np.str_):
        return str(model_name)
    return model_name


class InferenceRequest:
    """A request: the one execute receives, or a BLS request to another Trellis model."""

    def __init__(self, model_name=None, inputs=None, requested_output_names=None, model_version=-1,
                 request_id="", parameters=None, correlation_id=0, flags=0, timeout=0, preferred_memory=None,
                 trace=None):
        model_name = _model_name_text(model_name)
        if model_name is not None:
            _check_name("InferenceRequest: model_name", model_name)
        self._model_name = model_name
        self._inputs = _check_list("InferenceRequest: inputs", inputs, Tensor, "pb_utils.Tensor")
        self._requested = _check_list("InferenceRequest: requested_output_names", requested_output_names, str, "str")
        if not isinstance(model_version, int) or isinstance(model_version, bool):
            raise TypeError(f"InferenceRequest: model_version must be an int, not {type(model_version).__name__}")
        self._model_version = model_version
        if not isinstance(request_id, str):
            raise TypeError(f"InferenceRequest: request_id must be a str, not {type(request_id).__name__}")
        self._request_id = request_id
        if parameters is None:
            parameters = {}
        if isinstance(parameters, dict):
            parameters = json.dumps(parameters)
        if not isinstance(parameters, str):
            raise TypeError(f"InferenceRequest: parameters must be a dict or its JSON text, not {type(parameters).__name__}")
        self._parameters = parameters
        self._cancelled = None  # set by the stub for the requests execute receives
        self._sender = None
        self._on_read = None  # (execution id, index): set by the stub for the requests execute receives

    def inputs(self):
        if self._on_read is not None and _progress is not None:
            _progress.reading(*self._on_read)
        return self._inputs

    def request_id(self):
        return self._request_id

    def requested_output_names(self):
        return self._requested

    def parameters(self):
        """The request's parameters as JSON text, as Triton gives them."""
        return self._parameters

    def model_name(self):
        return self._model_name

    def is_cancelled(self):
        return bool(self._cancelled is not None and self._cancelled.is_set())

    def get_response_sender(self):
        if self._sender is None:
            raise TritonModelException(
                "get_response_sender() is for a decoupled model's requests "
                "(model_transaction_policy { decoupled: true })", TritonError.UNSUPPORTED)
        return self._sender

    def set_release_flags(self, flags):
        """Triton reschedules a request only for a decoupled model with iterative sequence batching,
        which this server does not load (a sequence's requests are answered once each here)."""
        if flags == TRITONSERVER_REQUEST_RELEASE_ALL:
            return
        if flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException(
                "set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE): request rescheduling is for "
                "decoupled models with iterative sequence batching, which this server does not serve",
                TritonError.UNSUPPORTED)
        raise TypeError(f"set_release_flags: flags must be TRITONSERVER_REQUEST_RELEASE_ALL or "
                        f"TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, not {flags!r}")

    def exec(self, decoupled=False):
        if _bls is None:
            raise TritonModelException("BLS is only available while the model executes")
        return _bls.call(self, decoupled)

    async def async_exec(self, decoupled=False):
        if _bls is None:
            raise TritonModelException("BLS is only available while the model executes")
        return await _bls.call_async(self, decoupled)


# Set by the stub: it sends BLS requests and model control to the server.
_bls = None
# Set by the stub: notes which request the model reads (see stub.Progress).
_progress = None


def is_model_ready(model_name, model_version=""):
    if _bls is None:
        raise TritonModelException("is_model_ready is only available while the model runs")
    return _bls.control("ready", _model_name_text(model_name), str(model_version or ""))


def load_model(model_name, config="", files=None):
    if _bls is None:
        raise TritonModelException("load_model is only available while the model runs")
    _bls.control("load", _model_name_text(model_name), "")


def unload_model(model_name, unload_dependents=False):
    if _bls is None:
        raise TritonModelException("unload_model is only available while the model runs")
    _bls.control("unload", _model_name_text(model_name), "")


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


def _int_dims(dims):
    # The server's JSON writes int64 dims as text; a model compares them as ints.
    return [int(d) for d in dims]


class ModelConfig:
    """The config auto_complete_config(auto_complete_model_config) receives and completes,
    with the checks Triton's makes: a conflicting value raises ValueError naming the model."""

    def __init__(self, model_config):
        config = json.loads(model_config) if isinstance(model_config, str) else dict(model_config)
        config.setdefault("max_batch_size", 0)
        config.setdefault("input", [])
        config.setdefault("output", [])
        config["max_batch_size"] = int(config["max_batch_size"])
        for tensor in config["input"] + config["output"]:
            tensor["dims"] = _int_dims(tensor.get("dims", []))
        self._model_config = config

    def _name(self):
        return self._model_config.get("name", "")

    def as_dict(self):
        return self._model_config

    def set_max_batch_size(self, max_batch_size):
        if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool):
            raise ValueError(f"max_batch_size must be an int, not {type(max_batch_size).__name__}")
        if max_batch_size < 0:
            raise ValueError("max_batch_size must be a non-negative int")
        current = self._model_config["max_batch_size"]
        if current != 0 and current != max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config function "
                f"for model '{self._name()}' specified max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        self._model_config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict):
        if not isinstance(transaction_policy_dict, dict):
            raise ValueError("set_model_transaction_policy takes a dict, e.g. {'decoupled': True}")
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(f"model_transaction_policy has no property '{key}'")
        current = self._model_config.get("model_transaction_policy", {}).get("decoupled")
        wanted = bool(transaction_policy_dict.get("decoupled", False))
        if current is not None and bool(current) != wanted:
            raise ValueError(
                f"trying to change decoupled property in auto-complete-config for model '{self._name()}', "
                f"which is already set to {bool(current)}")
        self._model_config["model_transaction_policy"] = {"decoupled": wanted}

    def _add_tensor(self, kind, tensor):
        if not isinstance(tensor, dict):
            raise ValueError(f"{kind} must be a dict, not {type(tensor).__name__}")
        for key in ("name", "data_type", "dims"):
            if key not in tensor:
                raise ValueError(
                    f"{kind} in auto-complete-config function for model '{self._name()}' "
                    f"is missing '{key}' property.")
        tensor = dict(tensor)
        tensor["dims"] = _int_dims(tensor["dims"])
        for current in self._model_config[kind]:
            if current.get("name") != tensor["name"]:
                continue
            given = current.get("data_type", "TYPE_INVALID")
            if given not in ("", "TYPE_INVALID") and given != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{self._name()}', configuration expects datatype {given} for "
                    f"{kind} '{tensor['name']}', model provides {tensor['data_type']}")
            if current.get("dims") and current["dims"] != tensor["dims"]:
                raise ValueError(
                    f"model '{self._name()}', tensor '{tensor['name']}': the model expects dims "
                    f"{tensor['dims']} but the model configuration specifies dims {current['dims']}")
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            return
        self._model_config[kind].append(tensor)

    def add_input(self, input):
        self._add_tensor("input", input)

    def add_output(self, output):
        self._add_tensor("output", output)

    def add_model_warmup(self, model_warmup):
        if not isinstance(model_warmup, dict) or "name" not in model_warmup:
            raise ValueError("model_warmup must be a dict with a 'name'")
        self._model_config.setdefault("model_warmup", []).append(model_warmup)


def using_decoupled_model_transaction_policy(model_config):
    """Whether the config (initialize's args['model_config'], parsed) asks for decoupled responses."""
    if isinstance(model_config, str):
        model_config = json.loads(model_config)
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


class MetricFamily:
    """A custom metric family, shown on the server's /metrics. Made again with the same name,
    description and kind (another instance, a reload) it is the same family."""
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    _KINDS = {0: "counter", 1: "gauge", 2: "histogram"}

    def __init__(self, name, description, kind, buckets=None):
        if not isinstance(name, str) or not name:
            raise TypeError(f"MetricFamily: name must be a non-empty str, not {name!r}")
        if not isinstance(description, str):
            raise TypeError(f"MetricFamily: description must be a str, not {type(description).__name__}")
        if kind not in MetricFamily._KINDS or isinstance(kind, bool):
            raise TypeError("MetricFamily: kind must be MetricFamily.COUNTER, GAUGE or HISTOGRAM")
        self._name = name
        self._kind = kind
        self._buckets = _check_buckets(buckets)
        _metrics_call({"op": "family", "name": name, "description": description,
                       "kind": MetricFamily._KINDS[kind]})

    def Metric(self, labels=None, buckets=None):
        return Metric(self, labels, buckets)


def _check_buckets(buckets):
    if buckets is None:
        return None
    if not isinstance(buckets, (list, tuple)) or not all(
            isinstance(b, (int, float)) and not isinstance(b, bool) for b in buckets):
        raise TypeError("buckets must be a list of numbers")
    return [float(b) for b in buckets]


class Metric:
    """One label set of a MetricFamily: increment (counter, gauge), set (gauge), observe
    (histogram), value (counter, gauge)."""

    def __init__(self, family, labels=None, buckets=None):
        if not isinstance(family, MetricFamily):
            raise TypeError("Metric: make it with family.Metric(labels=...)")
        labels = {} if labels is None else labels
        if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in labels.items()):
            raise TypeError("Metric: labels must be a dict of str to str")
        buckets = _check_buckets(buckets) or family._buckets
        if family._kind == MetricFamily.HISTOGRAM and not buckets:
            raise TritonModelException("Metric: a HISTOGRAM family's metric needs buckets", TritonError.INVALID_ARG)
        self._family = family
        self._key = _metrics_call({"op": "metric", "name": family._name, "labels": labels,
                                   "buckets": buckets})["key"]

    def _update(self, op, value):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise TypeError(f"Metric.{op}: value must be a number, not {type(value).__name__}")
        _metrics_send({"op": op, "name": self._family._name, "key": self._key, "value": float(value)})

    def increment(self, value):
        if self._family._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("Metric.increment: a HISTOGRAM metric takes observe()")
        if self._family._kind == MetricFamily.COUNTER and value < 0:
            raise TritonModelException("Metric.increment: a COUNTER cannot be decremented")
        self._update("increment", value)

    def set(self, value):
        if self._family._kind != MetricFamily.GAUGE:
            raise TritonModelException("Metric.set: only a GAUGE metric can be set")
        self._update("set", value)

    def observe(self, value):
        if self._family._kind != MetricFamily.HISTOGRAM:
            raise TritonModelException("Metric.observe: only a HISTOGRAM metric observes")
        self._update("observe", value)

    def value(self):
        if self._family._kind == MetricFamily.HISTOGRAM:
            raise TritonModelException("Metric.value: a HISTOGRAM metric has no single value")
        return _metrics_call({"op": "value", "name": self._family._name, "key": self._key})["value"]


def _metrics_call(message):
    if _bls is None:
        raise TritonModelException("custom metrics are only available while the model runs")
    return _bls.metrics(message, wait=True)


def _metrics_send(message):
    if _bls is None:
        raise TritonModelException("custom metrics are only available while the model runs")
    _bls.metrics(message, wait=False)
