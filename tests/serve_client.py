#!/usr/bin/env python3
"""`isolane serve` driven by Triton's own Python client, `tritonclient`, over HTTP and gRPC.

tests/serve.rs starts the server on a scenario of three models (a real CNN, `MODEL`; a
50 ms spin, `SPIN`; a 1 s spin, `SLOW`), computes the CNN's output on INPUT with `isolane infer`
(EXPECT), and runs this script, which checks what a client sees:

- health (server live and ready, model ready), server and model metadata, the model's
  configuration and the repository index;
- the CNN's outputs bit-identical to EXPECT, with binary tensor data, with JSON data and
  through system shared memory (HTTP), and with raw contents (gRPC);
- the classification extension (`class_count`): the CNN's top classes as Triton writes them
  (`"%f:index"`, largest first), from EXPECT; a version other than 1 is not ready and its
  inference is refused as not found (404 / NOT_FOUND); `deadline_ms` as a decimal string;
- a request whose own deadline (`deadline_ms` = 1) the 50 ms spin cannot meet refused at once:
  HTTP 429 / gRPC RESOURCE_EXHAUSTED, the message saying by how much it would be late;
- NaN and the infinities echoed by the spin and asked for as JSON: answered as Triton writes
  them (`NaN`, `Infinity`, `-Infinity`) and read back as they were;
- requests tritonclient compresses (gzip and deflate) answered over both protocols, and a
  batch past the spin's or a request in a sequence refused as invalid (400 / INVALID_ARGUMENT);
- streaming inference (gRPC ModelStreamInfer, tritonclient's start_stream and
  async_stream_infer): requests for MODEL and SPIN on one stream answered in the order sent,
  with their ids, the CNN's outputs bit-identical to EXPECT; an impossible deadline is an error
  on the stream, which goes on; each request counted in /metrics;
- the drain: with requests in flight on SLOW (HTTP, gRPC and a stream), SIGTERM to PID; the
  server turns unready, refuses a new request (HTTP 503 / gRPC UNAVAILABLE, or the connection
  is refused; on the stream an error saying it shuts down) and still answers those in flight,
  then ends the stream by itself. The test then checks that the server exits 0.

Each check that holds prints one `ok: ...` line; the first that fails ends the script with
`FAILED: ...` and exit code 1. Exit code 3: tritonclient or numpy cannot be imported (the test
skips, or fails under ISOLANE_STRICT=1).
"""

import argparse
import json
import os
import queue
import signal
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request

try:
    import grpc
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException
except ImportError as e:  # the test turns this into a skip (or a failure when strict)
    print(f"cannot import tritonclient[http,grpc] and numpy: {e}", file=sys.stderr)
    sys.exit(3)

# Generous: a loaded 2-core machine may be slow, and no check here is about speed.
TIMEOUT_S = 60.0


class Failed(Exception):
    pass


def check(cond, what, detail=""):
    if not cond:
        raise Failed(f"{what}{': ' + str(detail) if detail != '' else ''}")
    print(f"ok: {what}", flush=True)


def same_bits(got, want):
    """Bit-identical float32 arrays of one shape (NaNs included, -0.0 told from 0.0)."""
    got = np.ascontiguousarray(got, dtype=np.float32)
    want = np.ascontiguousarray(want, dtype=np.float32)
    return got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def diff(got, want):
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float32)
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    return f"max abs difference {float(np.max(np.abs(got - want)))}"


def http_get(addr, path):
    """(status, body) of a plain GET; status None when the connection is refused."""
    try:
        with urllib.request.urlopen(f"http://{addr}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, ConnectionError, OSError):
        return None, ""


def check_http(a):
    c = httpclient.InferenceServerClient(
        url=a.http, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S
    )
    check(c.is_server_live(), "HTTP: the server is live")
    check(c.is_server_ready(), "HTTP: the server is ready")
    for m in (a.model, a.spin, a.slow):
        check(c.is_model_ready(m), f"HTTP: model {m} is ready")
    check(not c.is_model_ready("no_such_model"), "HTTP: an unknown model is not ready")

    meta = c.get_server_metadata()
    check(meta["name"] == "isolane", "HTTP: server metadata names isolane", meta)
    check("binary_tensor_data" in meta["extensions"], "HTTP: binary_tensor_data listed", meta)

    md = c.get_model_metadata(a.model)
    want_in = [-1] + list(a.x.shape[1:])
    want_out = [-1] + list(a.y.shape[1:])
    check(
        md["name"] == a.model
        and [i["name"] for i in md["inputs"]] == ["input"]
        and md["inputs"][0]["shape"] == want_in
        and md["inputs"][0]["datatype"] == "FP32"
        and md["outputs"][0]["shape"] == want_out,
        f"HTTP: model metadata has input [-1, ...] {want_in} and output {want_out}",
        md,
    )
    a.output_name = md["outputs"][0]["name"]

    cfg = c.get_model_config(a.model)
    check(
        cfg["name"] == a.model
        and cfg["max_batch_size"] == a.x.shape[0]
        and cfg["input"][0]["dims"] == list(a.x.shape[1:])
        and cfg["input"][0]["data_type"] == "TYPE_FP32",
        "HTTP: model config has max_batch_size and dims without the batch",
        cfg,
    )

    index = c.get_model_repository_index()
    states = {m["name"]: m.get("state") for m in index}
    check(
        states == {a.model: "READY", a.spin: "READY", a.slow: "READY"},
        "HTTP: the repository index lists the three models READY",
        index,
    )

    for binary in (True, False):
        kind = "binary tensor data" if binary else "JSON data"
        inp = httpclient.InferInput("input", list(a.x.shape), "FP32")
        inp.set_data_from_numpy(a.x, binary_data=binary)
        out = httpclient.InferRequestedOutput(a.output_name, binary_data=binary)
        r = c.infer(a.model, [inp], outputs=[out], request_id=f"h5-{kind}")
        got = r.as_numpy(a.output_name)
        check(same_bits(got, a.y), f"HTTP, {kind}: outputs equal isolane infer's", diff(got, a.y))
        check(r.get_response()["id"] == f"h5-{kind}", f"HTTP, {kind}: the id comes back")

    check_shared_memory(a, c)

    one = np.array([[7.25]], dtype=np.float32)
    inp = httpclient.InferInput("input", [1, 1], "FP32")
    inp.set_data_from_numpy(one)
    try:
        c.infer(a.spin, [inp], parameters={"deadline_ms": 1})
        raise Failed("HTTP: a 1 ms deadline on the 50 ms spin was answered, not refused")
    except InferenceServerException as e:
        check(
            e.status() == "429" and "after its deadline" in e.message(),
            "HTTP: an impossible deadline is refused with 429 and the predicted lateness",
            f"status {e.status()}: {e.message()}",
        )
    r = c.infer(a.spin, [inp], parameters={"deadline_ms": 60000})
    check(
        same_bits(r.as_numpy("output"), one),
        "HTTP: a deadline the spin can meet is answered (it echoes its input)",
        r.get_response(),
    )
    for algorithm in ("gzip", "deflate"):
        r = c.infer(a.spin, [inp], request_compression_algorithm=algorithm)
        check(
            same_bits(r.as_numpy("output"), one),
            f"HTTP: a request compressed with {algorithm} is answered",
            r.get_response(),
        )
    # Issue 32: NaN and the infinities asked for as JSON were a 500; Triton writes them as
    # NaN, Infinity and -Infinity, which tritonclient reads.
    for value in (np.nan, np.inf, -np.inf):
        special = np.array([[value]], dtype=np.float32)
        special_in = httpclient.InferInput("input", [1, 1], "FP32")
        special_in.set_data_from_numpy(special)
        as_json = httpclient.InferRequestedOutput("output", binary_data=False)
        r = c.infer(a.spin, [special_in], outputs=[as_json])
        check(
            same_bits(r.as_numpy("output"), special),
            f"HTTP: {value} asked for as JSON comes back as it was",
            r.get_response(),
        )
    # Triton parses request JSON with rapidjson's kParseNanAndInfFlag, so an input sent as
    # JSON (Python's json writes NaN, Infinity, -Infinity) is taken; isolane refused it (400).
    for value in (np.nan, np.inf, -np.inf):
        special = np.array([[value]], dtype=np.float32)
        special_in = httpclient.InferInput("input", [1, 1], "FP32")
        special_in.set_data_from_numpy(special, binary_data=False)
        r = c.infer(a.spin, [special_in])
        check(
            same_bits(r.as_numpy("output"), special),
            f"HTTP: {value} sent as JSON reaches the model as it was",
            r.get_response(),
        )
    check_refusals(a, c, httpclient, "HTTP", "400")
    check_classes_and_versions(a, c, httpclient, "HTTP", "404")
    c.close()


def top_classes(y, k):
    """What Triton answers for an output asked for with `class_count=k`: per row, the k
    largest values, largest first (equal ones in index order), as "%f:index" bytes."""
    rows = y.reshape(y.shape[0], -1)
    k = min(k, rows.shape[1])
    return np.array(
        [
            [b"%f:%d" % (float(r[i]), i) for i in np.argsort(-r, kind="stable")[:k]]
            for r in rows
        ],
        dtype=np.object_,
    )


def check_classes_and_versions(a, c, client, protocol, not_found):
    """The classification extension on the CNN, versions, and a deadline as a string."""
    want = top_classes(a.y, 3)
    for binary in (True, False) if client is httpclient else (None,):
        kind = "" if binary is None else (" binary" if binary else " JSON")
        inp = client.InferInput("input", list(a.x.shape), "FP32")
        inp.set_data_from_numpy(a.x)
        if binary is None:
            out = client.InferRequestedOutput(a.output_name, class_count=3)
        else:
            out = client.InferRequestedOutput(a.output_name, binary_data=binary, class_count=3)
        r = c.infer(a.model, [inp], outputs=[out])
        got = r.as_numpy(a.output_name)
        # tritonclient gives JSON strings as str, binary BYTES elements as bytes.
        if got is not None and got.size and isinstance(got.flat[0], str):
            got = np.vectorize(str.encode, otypes=[np.object_])(got)
        check(
            got is not None and got.shape == want.shape and (got == want).all(),
            f"{protocol}{kind}: class_count=3 answers the top classes as Triton writes them",
            f"got {got!r}, want {want!r}",
        )
    check(c.is_model_ready(a.model, "1"), f"{protocol}: version 1 is ready")
    check(not c.is_model_ready(a.model, "2"), f"{protocol}: version 2 is not ready")
    inp = client.InferInput("input", [1, 1], "FP32")
    inp.set_data_from_numpy(np.array([[7.25]], dtype=np.float32))
    try:
        c.infer(a.spin, [inp], model_version="2")
        raise Failed(f"{protocol}: an inference of version 2 was answered")
    except InferenceServerException as e:
        check(
            e.status() == not_found and "version 2 is not found" in e.message(),
            f"{protocol}: an inference of version 2 is refused as not found",
            f"status {e.status()}: {e.message()}",
        )
    r = c.infer(a.spin, [inp], parameters={"deadline_ms": "60000.5"})
    check(
        same_bits(r.as_numpy("output"), np.array([[7.25]], dtype=np.float32)),
        f"{protocol}: deadline_ms as a decimal string is read as its number",
        r.get_response(),
    )


def check_refusals(a, c, client, protocol, invalid):
    """A batch past the spin's (1) and a request in a sequence: refused as invalid, naming why."""
    two = client.InferInput("input", [2, 1], "FP32")
    two.set_data_from_numpy(np.array([[1.0], [2.0]], dtype=np.float32))
    one = client.InferInput("input", [1, 1], "FP32")
    one.set_data_from_numpy(np.array([[7.25]], dtype=np.float32))
    for what, inputs, kwargs, says in (
        ("a batch past the model's", [two], {}, "1 ≤ n ≤ 1"),
        ("a request in a sequence", [one], {"sequence_id": 7}, "sequence model"),
    ):
        try:
            c.infer(a.spin, inputs, **kwargs)
            raise Failed(f"{protocol}: {what} was answered, not refused")
        except InferenceServerException as e:
            check(
                e.status() == invalid and says in e.message(),
                f"{protocol}: {what} is refused with {invalid}",
                f"status {e.status()}: {e.message()}",
            )


def check_shared_memory(a, c):
    """The system shared memory extension: the input read from a region the client
    registered, the output written into another, equal to isolane infer's."""
    import tritonclient.utils.shared_memory as shm

    key = f"/isolane_serve_test_{os.getpid()}"
    out_bytes = a.y.nbytes
    regions = []
    try:
        h_in = shm.create_shared_memory_region("x", key + "_x", a.x.nbytes)
        regions.append(h_in)
        h_out = shm.create_shared_memory_region("y", key + "_y", out_bytes)
        regions.append(h_out)
        shm.set_shared_memory_region(h_in, [a.x])
        c.register_system_shared_memory("x", key + "_x", a.x.nbytes)
        c.register_system_shared_memory("y", key + "_y", out_bytes)
        status = {r["name"]: r["byte_size"] for r in c.get_system_shared_memory_status()}
        check(
            status == {"x": a.x.nbytes, "y": out_bytes},
            "HTTP: both shared memory regions are registered",
            status,
        )
        inp = httpclient.InferInput("input", list(a.x.shape), "FP32")
        inp.set_shared_memory("x", a.x.nbytes)
        out = httpclient.InferRequestedOutput(a.output_name, binary_data=True)
        out.set_shared_memory("y", out_bytes)
        r = c.infer(a.model, [inp], outputs=[out])
        # Named without data or binary size (as Triton does: perf_analyzer's HTTP client
        # refuses an output whose parameters lack `binary_data_size`).
        named = r.get_output(a.output_name)
        check(
            named is not None
            and "data" not in named
            and "binary_data_size" not in named.get("parameters", {}),
            "HTTP: the response names the output, without its data",
            r.get_response(),
        )
        got = shm.get_contents_as_numpy(h_out, np.float32, list(a.y.shape))
        check(
            same_bits(got, a.y),
            "HTTP, shared memory: outputs equal isolane infer's",
            diff(got, a.y),
        )
        c.unregister_system_shared_memory()
        check(c.get_system_shared_memory_status() == [], "HTTP: the regions are unregistered")
    finally:
        for h in regions:
            shm.destroy_shared_memory_region(h)


def check_grpc(a):
    c = grpcclient.InferenceServerClient(url=a.grpc)
    check(c.is_server_live(), "gRPC: the server is live")
    check(c.is_server_ready(), "gRPC: the server is ready")
    check(c.is_model_ready(a.model), f"gRPC: model {a.model} is ready")

    meta = c.get_server_metadata()
    check(meta.name == "isolane", "gRPC: server metadata names isolane", meta)

    md = c.get_model_metadata(a.model)
    check(
        md.name == a.model
        and list(md.inputs[0].shape) == [-1] + list(a.x.shape[1:])
        and md.outputs[0].name == a.output_name,
        "gRPC: model metadata matches HTTP's",
        md,
    )
    cfg = c.get_model_config(a.model).config
    check(
        cfg.name == a.model and cfg.max_batch_size == a.x.shape[0],
        "gRPC: model config has max_batch_size",
        cfg,
    )
    index = c.get_model_repository_index()
    check(
        sorted(m.name for m in index.models) == sorted([a.model, a.spin, a.slow]),
        "gRPC: the repository index lists the three models",
        index,
    )

    inp = grpcclient.InferInput("input", list(a.x.shape), "FP32")
    inp.set_data_from_numpy(a.x)
    r = c.infer(
        a.model,
        [inp],
        outputs=[grpcclient.InferRequestedOutput(a.output_name)],
        client_timeout=TIMEOUT_S,
    )
    got = r.as_numpy(a.output_name)
    check(same_bits(got, a.y), "gRPC: outputs equal isolane infer's", diff(got, a.y))

    one = np.array([[7.25]], dtype=np.float32)
    inp = grpcclient.InferInput("input", [1, 1], "FP32")
    inp.set_data_from_numpy(one)
    try:
        c.infer(a.spin, [inp], parameters={"deadline_ms": 1}, client_timeout=TIMEOUT_S)
        raise Failed("gRPC: a 1 ms deadline on the 50 ms spin was answered, not refused")
    except InferenceServerException as e:
        check(
            e.status() == "StatusCode.RESOURCE_EXHAUSTED" and "after its deadline" in e.message(),
            "gRPC: an impossible deadline is refused with RESOURCE_EXHAUSTED and the lateness",
            f"status {e.status()}: {e.message()}",
        )
    for algorithm in ("gzip", "deflate"):
        r = c.infer(
            a.spin, [inp], compression_algorithm=algorithm, client_timeout=TIMEOUT_S
        )
        check(
            same_bits(r.as_numpy("output"), one),
            f"gRPC: a request compressed with {algorithm} is answered",
            r.get_response(),
        )
    check_refusals(a, c, grpcclient, "gRPC", "StatusCode.INVALID_ARGUMENT")
    check_classes_and_versions(a, c, grpcclient, "gRPC", "StatusCode.NOT_FOUND")
    c.close()


def check_stream(a):
    """ModelStreamInfer as tritonclient's streaming API uses it: two models on one stream, an
    impossible deadline in between; answers in the order sent, each with its id."""
    c = grpcclient.InferenceServerClient(url=a.grpc)
    answers = queue.Queue()
    c.start_stream(
        callback=lambda result, error: answers.put((result, error)), stream_timeout=TIMEOUT_S
    )
    one = np.array([[7.25]], dtype=np.float32)
    sent = [
        ("s0", a.model, a.x, None),
        ("s1", a.spin, one, None),
        ("s2", a.spin, one, {"deadline_ms": 1}),
        ("s3", a.model, a.x, None),
        ("s4", a.spin, 2 * one, {"deadline_ms": 60000}),
    ]
    before = requests_received(a, a.spin)
    for rid, model, x, params in sent:
        inp = grpcclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        outputs = [grpcclient.InferRequestedOutput(a.output_name)] if model == a.model else None
        c.async_stream_infer(
            model, [inp], outputs=outputs, request_id=rid, parameters=params
        )
    got = [answers.get(timeout=TIMEOUT_S) for _ in sent]
    c.stop_stream()
    c.close()
    errors = [(i, str(e)) for i, (_, e) in enumerate(got) if e is not None]
    check(
        len(errors) == 1 and errors[0][0] == 2 and "after its deadline" in errors[0][1],
        "gRPC stream: an impossible deadline is an error on the stream, which goes on",
        errors,
    )
    final = [r.get_response().parameters["triton_final_response"].bool_param for r, _ in got if r]
    check(
        final == [True] * 4,
        "gRPC stream: each answer is marked its request's last (triton_final_response)",
        final,
    )
    ids = [r.get_response().id if r is not None else None for r, _ in got]
    check(
        ids == ["s0", "s1", None, "s3", "s4"],
        "gRPC stream: answers come in the order sent, with their ids",
        ids,
    )
    for i in (0, 3):
        out = got[i][0].as_numpy(a.output_name)
        check(
            same_bits(out, a.y),
            f"gRPC stream: outputs equal isolane infer's (request {sent[i][0]})",
            diff(out, a.y),
        )
    check(
        same_bits(got[1][0].as_numpy("output"), one)
        and same_bits(got[4][0].as_numpy("output"), 2 * one),
        "gRPC stream: two models on one stream, each its own answer",
        [got[1][0].get_response(), got[4][0].get_response()],
    )
    counted = requests_received(a, a.spin) - before
    check(counted == 3, "gRPC stream: each request is counted in /metrics", counted)


def raw_stream_request(model, rid, value):
    """A ModelInferRequest of one FP32 row, in tritonclient's generated protobuf types."""
    r = service_pb2.ModelInferRequest(model_name=model, id=rid)
    t = r.inputs.add()
    t.name = "input"
    t.datatype = "FP32"
    t.shape.extend([1, 1])
    r.raw_input_contents.append(np.array([[value]], dtype=np.float32).tobytes())
    return r


class RawStream:
    """A ModelStreamInfer call through tritonclient's generated stub, whose request side stays
    open until closed: what arrives, and whether the server ended the stream by itself."""

    def __init__(self, addr):
        self.channel = grpc.insecure_channel(addr)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        self.outbox = queue.Queue()
        self.seen = []
        self.ended = None

        def requests():
            while True:
                r = self.outbox.get()
                if r is None:
                    return
                yield r

        responses = stub.ModelStreamInfer(requests(), timeout=4 * TIMEOUT_S)

        def read():
            try:
                for resp in responses:
                    self.seen.append(resp)
                self.ended = "OK"
            except grpc.RpcError as e:
                self.ended = f"{e.code()}: {e.details()}"

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()

    def send(self, request):
        self.outbox.put(request)

    def close(self):
        self.outbox.put(None)
        self.channel.close()


def requests_received(a, model):
    """isolane_serve_requests_total of `model`, from /metrics."""
    _, text = http_get(a.http, "/metrics")
    for line in text.splitlines():
        if line.startswith("isolane_serve_requests_total{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def check_drain(a):
    """Requests in flight on the slow model, SIGTERM, a new request refused, the ones in
    flight answered."""
    results = {}

    def http_in_flight():
        try:
            c = httpclient.InferenceServerClient(
                url=a.http, connection_timeout=TIMEOUT_S, network_timeout=TIMEOUT_S
            )
            inp = httpclient.InferInput("input", [1, 1], "FP32")
            inp.set_data_from_numpy(np.array([[1.5]], dtype=np.float32))
            results["http"] = c.infer(a.slow, [inp]).as_numpy("output")
            c.close()
        except Exception as e:  # reported by the main thread
            results["http"] = e

    threads = [threading.Thread(target=http_in_flight)]
    grpc_client = None
    stream = None
    if a.grpc:
        stream = RawStream(a.grpc)
        grpc_client = grpcclient.InferenceServerClient(url=a.grpc)
        done = threading.Event()

        def grpc_answered(result, error):
            results["grpc"] = error if error is not None else result.as_numpy("output")
            done.set()

        inp = grpcclient.InferInput("input", [1, 1], "FP32")
        inp.set_data_from_numpy(np.array([[2.5]], dtype=np.float32))
    for t in threads:
        t.start()
    if grpc_client is not None:
        grpc_client.async_infer(a.slow, [inp], grpc_answered, client_timeout=TIMEOUT_S)
        stream.send(raw_stream_request(a.slow, "in-flight", 4.5))
    in_flight = 3 if a.grpc else 1
    # Taken once counted: wait for the count, then a little longer so that each request has
    # passed admission into the queue (the count comes first); the slow model takes a second
    # per request, so they are still in flight when the signal comes.
    until = time.monotonic() + TIMEOUT_S
    while requests_received(a, a.slow) < in_flight:
        if time.monotonic() > until:
            raise Failed(f"the {in_flight} requests to {a.slow} never reached the server")
        time.sleep(0.02)
    time.sleep(0.2)
    os.kill(a.pid, signal.SIGTERM)

    until = time.monotonic() + TIMEOUT_S
    while True:
        status, _ = http_get(a.http, "/v2/health/ready")
        if status != 200:
            break
        if time.monotonic() > until:
            raise Failed("the server still says it is ready long after SIGTERM")
        time.sleep(0.02)
    check(True, f"after SIGTERM the server is no longer ready (HTTP {status})")

    one = np.array([[3.0]], dtype=np.float32)
    try:
        c = httpclient.InferenceServerClient(url=a.http, connection_timeout=10, network_timeout=10)
        inp = httpclient.InferInput("input", [1, 1], "FP32")
        inp.set_data_from_numpy(one)
        c.infer(a.spin, [inp])
        raise Failed("HTTP: a new request after SIGTERM was answered")
    except InferenceServerException as e:
        check(
            e.status() == "503" and "shutting down" in e.message(),
            "HTTP: a new request after SIGTERM is refused (503, shutting down)",
            f"status {e.status()}: {e.message()}",
        )
    except (ConnectionError, OSError) as e:
        check(True, f"HTTP: a new request after SIGTERM finds the server closed ({e})")
    if grpc_client is not None:
        inp = grpcclient.InferInput("input", [1, 1], "FP32")
        inp.set_data_from_numpy(one)
        try:
            grpc_client.infer(a.spin, [inp], client_timeout=10)
            raise Failed("gRPC: a new request after SIGTERM was answered")
        except InferenceServerException as e:
            check(
                e.status() == "StatusCode.UNAVAILABLE",
                "gRPC: a new request after SIGTERM is refused (UNAVAILABLE)",
                f"status {e.status()}: {e.message()}",
            )
        stream.send(raw_stream_request(a.spin, "after", 3.0))

    for t in threads:
        t.join(TIMEOUT_S)
    got = results.get("http")
    check(
        isinstance(got, np.ndarray) and same_bits(got, np.array([[1.5]], dtype=np.float32)),
        "HTTP: the request in flight at SIGTERM is answered",
        got,
    )
    if grpc_client is not None:
        done.wait(TIMEOUT_S)
        got = results.get("grpc")
        check(
            isinstance(got, np.ndarray) and same_bits(got, np.array([[2.5]], dtype=np.float32)),
            "gRPC: the request in flight at SIGTERM is answered",
            got,
        )
        grpc_client.close()
        # The client never closes its side: the server ends the stream once it has answered.
        stream.reader.join(TIMEOUT_S)
        seen = [
            (r.infer_response.id, r.error_message,
             r.infer_response.parameters["triton_final_response"].bool_param)
            for r in stream.seen
        ]
        first = stream.seen[0] if stream.seen else None
        check(
            first is not None
            and first.error_message == ""
            and np.frombuffer(first.infer_response.raw_output_contents[0], np.float32).tolist()
            == [4.5],
            "gRPC stream: the request in flight at SIGTERM is answered",
            seen,
        )
        check(
            len(seen) == 2 and seen[1][0] == "after" and "shutting down" in seen[1][1] and seen[1][2],
            "gRPC stream: a request sent during the drain is told the server is shutting down",
            seen,
        )
        check(
            stream.ended == "OK",
            "gRPC stream: the server ends the stream after the drain",
            stream.ended,
        )
        stream.close()
    print(json.dumps({"in_flight_answered": in_flight}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--http", required=True, help="the server's HTTP HOST:PORT")
    p.add_argument("--grpc", help="the server's gRPC HOST:PORT (none: HTTP only)")
    p.add_argument("--pid", type=int, required=True, help="the server's process, for SIGTERM")
    p.add_argument("--model", required=True, help="a real model, compared with EXPECT")
    p.add_argument("--input", required=True, help=".npy input of --model")
    p.add_argument("--expect", required=True, help=".npy output of isolane infer on it")
    p.add_argument("--spin", required=True, help="a spin model slower than 1 ms")
    p.add_argument("--slow", required=True, help="a spin model of about a second (drain)")
    a = p.parse_args()
    # A bound on the whole script (each call has its own too), so that a server that stops
    # answering fails the test instead of hanging it: SIGALRM ends the process.
    signal.alarm(300)
    a.x = np.load(a.input).astype(np.float32, copy=False)
    a.y = np.load(a.expect).astype(np.float32, copy=False)
    try:
        check_http(a)
        if a.grpc:
            check_grpc(a)
            check_stream(a)
        check_drain(a)
    except Failed as e:
        print(f"FAILED: {e}", flush=True)
        sys.exit(1)
    except Exception as e:  # a client error where a check expected an answer
        traceback.print_exc()
        print(f"FAILED: {type(e).__name__}: {e}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
