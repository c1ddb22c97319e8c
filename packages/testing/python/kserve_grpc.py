"""A C-core gRPC peer for tests: grpcio, the library Triton's own Python client
(tritonclient.grpc) and Triton's server share their gRPC core with, speaking
inference.GRPCInferenceService with message classes built at run time from
our own descriptors (a FileDescriptorSet the caller writes).

  kserve_grpc.py DESCRIPTORS client ADDRESS [--root-cert P [--cert P --key P]]  < calls.json  > results.json
  kserve_grpc.py DESCRIPTORS serve MODELS.json
      prints "listening PORT" and serves until stdin closes or SIGTERM;
      prints "cancelled ID" when a held call is cancelled.

A call is {"method", "request" | "requests" (a stream), "timeout" (s),
"compression": "gzip", "metadata": {k: v}}; messages are proto3 JSON. A
result is {"response"} | {"responses"} | {"error": {"code", "details"}}.

MODELS.json is {"models": [{"config": <ModelConfig JSON>, "compute":
"double_fp16" | "identity", "delay_ms": n}]}: a stand-in for Triton serving
TensorRT engines (what the TensorRT bridge talks to). Each output has its
input's shape; "double_fp16" doubles FP16 values exactly, as an FP16 engine
with y = 2x would.
"""

import json
import signal
import struct
import sys
import threading
import time
from concurrent import futures

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

SERVICE = "inference.GRPCInferenceService"
# tritonclient.grpc lifts both message-size caps to INT32_MAX; so do we.
MAX_MESSAGE = 2**31 - 1
OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE), ("grpc.max_receive_message_length", MAX_MESSAGE)]


def load_methods(path):
    """{method name: (request class, response class, client streaming)} of the service."""
    with open(path, "rb") as f:
        files = descriptor_pb2.FileDescriptorSet.FromString(f.read())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    get_class = getattr(message_factory, "GetMessageClass", None)
    if get_class is None:  # protobuf < 4.22
        get_class = message_factory.MessageFactory(pool).GetPrototype
    service = pool.FindServiceByName(SERVICE)
    return {m.name: (get_class(m.input_type), get_class(m.output_type), m.client_streaming) for m in service.methods}


def open_channel(address, tls):
    """Cleartext, or TLS when tls names a root certificate (and a client certificate and key, for mutual TLS)."""
    if not tls:
        return grpc.insecure_channel(address, options=OPTIONS)

    def read(key):
        path = tls.get(key)
        if not path:
            return None
        with open(path, "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(read("root_cert"), read("key"), read("cert"))
    return grpc.secure_channel(address, credentials, options=OPTIONS)


def run_client(methods, address, tls):
    results = []
    with open_channel(address, tls) as channel:
        for call in json.load(sys.stdin):
            name = call["method"]
            request_type, response_type, streaming = methods[name]
            path = f"/{SERVICE}/{name}"
            kwargs = {
                "timeout": call.get("timeout"),
                "metadata": list(call.get("metadata", {}).items()) or None,
                "compression": {"gzip": grpc.Compression.Gzip, "deflate": grpc.Compression.Deflate}.get(call.get("compression", "")),
            }
            serialize, deserialize = request_type.SerializeToString, response_type.FromString
            try:
                if streaming:
                    stub = channel.stream_stream(path, request_serializer=serialize, response_deserializer=deserialize)
                    requests = [json_format.ParseDict(r, request_type()) for r in call["requests"]]
                    responses = stub(iter(requests), **kwargs)
                    results.append({"responses": [json_format.MessageToDict(r) for r in responses]})
                else:
                    stub = channel.unary_unary(path, request_serializer=serialize, response_deserializer=deserialize)
                    response = stub(json_format.ParseDict(call.get("request", {}), request_type()), **kwargs)
                    results.append({"response": json_format.MessageToDict(response)})
            except grpc.RpcError as err:
                results.append({"error": {"code": err.code().name, "details": err.details()}})
    json.dump(results, sys.stdout)


def double_half(h):
    """2x of one FP16 bit pattern: exact (exponent + 1) unless it overflows to inf."""
    e = (h >> 10) & 0x1F
    if e == 0x1F:
        return h
    if e == 0:  # subnormal: the shift may carry into the exponent, as it should
        return (h & 0x8000) | ((h & 0x3FF) << 1)
    if e == 0x1E:
        return (h & 0x8000) | 0x7C00
    return h + 0x400


def compute(kind, datatype, raw):
    if kind == "identity":
        return raw
    if kind == "double_fp16" and datatype == "FP16":
        count = len(raw) // 2
        return struct.pack(f"<{count}H", *map(double_half, struct.unpack(f"<{count}H", raw)))
    raise ValueError(f"compute {kind} does not take {datatype}")


def kserve_datatype(config_type):
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def serve(methods, spec_path):
    with open(spec_path) as f:
        spec = json.load(f)
    models = {m["config"]["name"]: m for m in spec["models"]}
    types = {name: (req, res) for name, (req, res, _) in methods.items()}

    def model_of(name, context):
        model = models.get(name)
        if model is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        return model

    def tensors(model, key):
        config = model["config"]
        batch = [-1] if config.get("maxBatchSize", 0) > 0 else []
        return [
            {"name": t["name"], "datatype": kserve_datatype(t["dataType"]), "shape": batch + [int(d) for d in t["dims"]]}
            for t in config.get(key, [])
        ]

    def server_live(request, context):
        return types["ServerLive"][1](live=True)

    def server_ready(request, context):
        return types["ServerReady"][1](ready=True)

    def model_ready(request, context):
        return types["ModelReady"][1](ready=request.name in models)

    def model_metadata(request, context):
        model = model_of(request.name, context)
        return json_format.ParseDict(
            {
                "name": request.name,
                "versions": ["1"],
                "platform": model["config"].get("platform", ""),
                "inputs": tensors(model, "input"),
                "outputs": tensors(model, "output"),
            },
            types["ModelMetadata"][1](),
        )

    def model_config(request, context):
        model = model_of(request.name, context)
        return json_format.ParseDict({"config": model["config"]}, types["ModelConfig"][1]())

    def model_infer(request, context):
        model = model_of(request.model_name, context)
        delay = model.get("delay_ms", 0) / 1000
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline:
            if not context.is_active():
                print(f"cancelled {request.id}", flush=True)
                return types["ModelInfer"][1]()
            time.sleep(0.005)
        declared = {t["name"]: t for t in tensors(model, "input")}
        if len(request.raw_input_contents) != len(request.inputs):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "expected raw_input_contents for every input")
        response = types["ModelInfer"][1](model_name=request.model_name, model_version="1", id=request.id)
        outputs = tensors(model, "output")
        for index, tensor in enumerate(request.inputs):
            want = declared.get(tensor.name)
            if want is None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unexpected inference input '{tensor.name}'")
            if tensor.datatype != want["datatype"]:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"input '{tensor.name}': expected datatype {want['datatype']}, got {tensor.datatype}",
                )
            out = outputs[index]
            produced = response.outputs.add(name=out["name"], datatype=out["datatype"])
            produced.shape.extend(tensor.shape)
            response.raw_output_contents.append(
                compute(model.get("compute", "identity"), tensor.datatype, request.raw_input_contents[index])
            )
        return response

    handlers = {
        "ServerLive": server_live,
        "ServerReady": server_ready,
        "ModelReady": model_ready,
        "ModelMetadata": model_metadata,
        "ModelConfig": model_config,
        "ModelInfer": model_infer,
    }

    class Handler(grpc.GenericRpcHandler):
        def service(self, details):
            name = details.method.removeprefix(f"/{SERVICE}/")
            if name not in handlers:
                return None  # grpcio answers UNIMPLEMENTED
            request_type, response_type = types[name]
            return grpc.unary_unary_rpc_method_handler(
                handlers[name],
                request_deserializer=request_type.FromString,
                response_serializer=response_type.SerializeToString,
            )

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=OPTIONS)
    server.add_generic_rpc_handlers([Handler()])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"listening {port}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    done.wait()
    server.stop(0)


def main():
    descriptors, mode, target = sys.argv[1:4]
    # Client TLS: --root-cert PATH [--cert PATH --key PATH]
    extra = sys.argv[4:]
    tls = {extra[i].removeprefix("--").replace("-", "_"): extra[i + 1] for i in range(0, len(extra) - 1, 2)}
    methods = load_methods(descriptors)
    if mode == "client":
        run_client(methods, target, tls)
    elif mode == "serve":
        serve(methods, target)
    else:
        sys.exit(f"unknown mode {mode}: expected client or serve")


if __name__ == "__main__":
    main()
