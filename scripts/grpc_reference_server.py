#!/usr/bin/env python3
"""A reference for the gRPC protocol floor (issue 32): the KServe v2 / Triton gRPC protocol
served by gRPC's own C-core server (grpcio), for one model that computes nothing.

perf_analyzer (or any Triton client) can be pointed at it exactly as at `isolane serve`: what
it measures here is what the client, the socket and a C-core gRPC server cost for the same
request body, with no model behind it. Set beside isolane's floor model (serve_bench.py's
`floor` step), it says how much of isolane's added latency is its own front end (tonic/h2)
and how much any gRPC server would add.

    python3 scripts/grpc_reference_server.py --port 8101 [--model floor] \
        [--input input:FP32:1,3,224,224] [--output output:FP32:1,1000] [--workers 4]

It prints one line when ready, and its handler's own time per request (p50, mean) when it
stops (SIGTERM/SIGINT). The model's statistics (ModelStatistics) count the handler's time as
`compute_infer`, so perf_analyzer's server-side figures mean the same as isolane's.
Needs tritonclient[grpc] (its generated stubs) and grpcio.
"""

import argparse
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as rpc

SIZES = {"FP32": 4, "FP16": 2, "INT64": 8, "INT32": 4, "UINT8": 1, "INT8": 1}
CONFIG_TYPES = {"FP32": mc.TYPE_FP32, "FP16": mc.TYPE_FP16, "INT64": mc.TYPE_INT64,
                "INT32": mc.TYPE_INT32, "UINT8": mc.TYPE_UINT8, "INT8": mc.TYPE_INT8}


def tensor_arg(text):
    try:
        name, dtype, dims = text.split(":")
        shape = [int(d) for d in dims.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"`{text}`: NAME:DTYPE:D1,D2,... expected")
    if dtype not in SIZES:
        raise argparse.ArgumentTypeError(f"`{text}`: dtype one of {', '.join(SIZES)}")
    if not shape or any(d <= 0 for d in shape):
        raise argparse.ArgumentTypeError(f"`{text}`: dimensions must be positive")
    return name, dtype, shape


def nbytes(dtype, shape):
    n = SIZES[dtype]
    for d in shape:
        n *= d
    return n


class Reference(rpc.GRPCInferenceServiceServicer):
    def __init__(self, model, inp, out):
        self.model, self.inp, self.out = model, inp, out
        self.in_bytes = nbytes(inp[1], inp[2])
        self.answer = bytes(nbytes(out[1], out[2]))
        self.lock = threading.Lock()
        self.handled_ns = []

    def _known(self, name, context):
        if name != self.model:
            context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")

    def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    def ModelReady(self, request, context):
        return pb.ModelReadyResponse(ready=request.name == self.model)

    def ServerMetadata(self, request, context):
        return pb.ServerMetadataResponse(name="grpc-reference", version="0", extensions=[])

    def ModelMetadata(self, request, context):
        self._known(request.name, context)
        t = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=self.model, versions=["1"], platform="reference",
            inputs=[t(name=self.inp[0], datatype=self.inp[1], shape=self.inp[2])],
            outputs=[t(name=self.out[0], datatype=self.out[1], shape=self.out[2])])

    def ModelConfig(self, request, context):
        self._known(request.name, context)
        cfg = mc.ModelConfig(
            name=self.model, platform="reference", max_batch_size=0,
            input=[mc.ModelInput(name=self.inp[0], data_type=CONFIG_TYPES[self.inp[1]], dims=self.inp[2])],
            output=[mc.ModelOutput(name=self.out[0], data_type=CONFIG_TYPES[self.out[1]], dims=self.out[2])])
        return pb.ModelConfigResponse(config=cfg)

    def ModelStatistics(self, request, context):
        if request.name:
            self._known(request.name, context)
        with self.lock:
            n, total = len(self.handled_ns), sum(self.handled_ns)
        d = pb.StatisticDuration
        stats = pb.ModelStatistics(
            name=self.model, version="1", inference_count=n, execution_count=n,
            inference_stats=pb.InferStatistics(
                success=d(count=n, ns=total), fail=d(), queue=d(count=n),
                compute_input=d(count=n), compute_infer=d(count=n, ns=total),
                compute_output=d(count=n)))
        return pb.ModelStatisticsResponse(model_stats=[stats])

    def ModelInfer(self, request, context):
        t0 = time.perf_counter_ns()
        self._known(request.model_name, context)
        got = sum(len(c) for c in request.raw_input_contents)
        if got != self.in_bytes:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"expected {self.in_bytes} bytes of raw input, got {got}")
        t = pb.ModelInferResponse.InferOutputTensor
        answer = pb.ModelInferResponse(
            model_name=self.model, model_version="1", id=request.id,
            outputs=[t(name=self.out[0], datatype=self.out[1], shape=self.out[2])],
            raw_output_contents=[self.answer])
        with self.lock:
            self.handled_ns.append(time.perf_counter_ns() - t0)
        return answer


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=8101)
    ap.add_argument("--model", default="floor")
    ap.add_argument("--input", type=tensor_arg, default=tensor_arg("input:FP32:1,3,224,224"))
    ap.add_argument("--output", type=tensor_arg, default=tensor_arg("output:FP32:1,1000"))
    ap.add_argument("--workers", type=int, default=4)
    a = ap.parse_args()
    ref = Reference(a.model, a.input, a.output)
    # As isolane's gRPC front end: messages of any size a frame needs, large flow-control windows.
    opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=a.workers), options=opts)
    rpc.add_GRPCInferenceServiceServicer_to_server(ref, server)
    if server.add_insecure_port(f"127.0.0.1:{a.port}") == 0:
        print(f"grpc-reference: cannot listen on 127.0.0.1:{a.port}", file=sys.stderr)
        return 2
    server.start()
    print(f"grpc-reference: ready; gRPC on 127.0.0.1:{a.port}; model {a.model}", flush=True)
    stop = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    stop.wait()
    server.stop(2).wait()
    h = sorted(ref.handled_ns)
    if h:
        print(f"grpc-reference: {len(h)} requests; handler p50 {h[len(h) // 2] / 1000:.1f} µs, "
              f"mean {sum(h) / len(h) / 1000:.1f} µs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
