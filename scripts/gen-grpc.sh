#!/usr/bin/env bash
# Regenerates crates/isolane-protocol/src/grpc/generated/inference.rs (the gRPC messages, server
# trait and client of isolane serve) from crates/isolane-protocol/proto/inference.proto.
#
# The generated file is committed so that building isolane needs no protoc and no build script.
# Run this after editing the .proto, or after updating tonic-prost-build in Cargo.lock; the test
# grpc::tests::the_checked_in_generated_code_is_fresh (the same generator and settings) fails
# until then, and skips on a machine without protoc (ISOLANE_STRICT=1 makes that a failure).
#
# Needs: protoc (`apt-get install -y protobuf-compiler`, or PROTOC=/path/to/protoc) and cargo.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
command -v "${PROTOC:-protoc}" >/dev/null || {
  echo "gen-grpc.sh: needs protoc: apt-get install -y protobuf-compiler (or set PROTOC)" >&2
  exit 2
}
cd "$repo"
ISOLANE_GRPC_REGEN=1 ISOLANE_STRICT=1 cargo test -q -p isolane-protocol --features grpc --lib \
  grpc::tests::the_checked_in_generated_code_is_fresh -- --exact --nocapture
git --no-pager diff --stat -- crates/isolane-protocol/src/grpc/generated/ || true
