"""A PyTorch GEMM loop, the external program of mps-torch-beside-resnet18.toml.

Runs fp16 4096x4096 matmuls for --seconds and prints how many it did; as an MPS client it gets
the thread percentage and pinned memory limit isolane put in its environment.
"""
import argparse
import os
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=8.0)
p.add_argument("--n", type=int, default=4096)
args = p.parse_args()

a = torch.randn(args.n, args.n, device="cuda", dtype=torch.half)
b = torch.randn(args.n, args.n, device="cuda", dtype=torch.half)
torch.cuda.synchronize()
start, done = time.time(), 0
while time.time() - start < args.seconds:
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    done += 10
elapsed = time.time() - start
tflops = 2 * args.n**3 * done / elapsed / 1e12
print(
    f"{done} GEMMs in {elapsed:.2f} s: {tflops:.1f} TFLOP/s "
    f"(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={os.environ.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')})"
)
