//! isolane-engine: graph IR, built-in architectures, loaders (safetensors, ONNX) and backends.
