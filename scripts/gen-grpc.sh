#!/usr/bin/env bash
# Regenerates crates/isolane-protocol/src/grpc/generated/inference.rs (the gRPC messages, server
# trait and client of isolane serve) from crates/isolane-protocol/proto/inference.proto, or with
# --check says whether the checked-in file is what the .proto generates (CI runs that).
#
# The generated file is committed so that building isolane needs no protoc and no build script;
# the generator is tools/grpc-gen, a crate outside the workspace, so that `cargo test` does not
# build tonic-prost-build's tree either. Run this after editing the .proto, or after updating
# tonic-prost-build in tools/grpc-gen/Cargo.toml.
#
# Needs: protoc (`apt-get install -y protobuf-compiler`, or PROTOC=/path/to/protoc) and cargo.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
command -v "${PROTOC:-protoc}" >/dev/null || {
  echo "gen-grpc.sh: needs protoc: apt-get install -y protobuf-compiler (or set PROTOC)" >&2
  exit 2
}
mode=--write
if [ "${1:-}" = --check ]; then mode=--check; fi
cd "$repo"
CARGO_TARGET_DIR="$repo/target/grpc-gen" cargo run -q --locked \
  --manifest-path tools/grpc-gen/Cargo.toml -- "$mode"
if [ "$mode" = --write ]; then
  git --no-pager diff --stat -- crates/isolane-protocol/src/grpc/generated/ || true
fi
