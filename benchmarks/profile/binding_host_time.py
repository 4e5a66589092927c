"""Host time of one binding call and of its parts' torch-side equivalents (M = 256, 4096 x 4096, block 64,
density 0.5, bf16): the per-call cost that bounds eager mode for small M. Run it under
`nsys profile -t cuda --stats=true` to see the CUDA API calls (launches, memsets, tensor-map encodes) each
binding call makes and their host times.

    python benchmarks/profile/binding_host_time.py
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from pytorch_block_sparse_ng import BlockSparseMatrix, _C, _ops  # noqa: E402


def host_and_wall_us(fn, calls=200, warmup=50):
    """(host, wall) time per call in us: the host's taken before synchronising (bench_ops.per_call_us includes
    the GPU's drain), with few enough calls that the launch queue never fills (with 2000, a first run measured
    the dsd's GPU time, 51 us, instead of its host time); the wall time after."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host * 1e6 / calls, (time.perf_counter() - start) * 1e6 / calls


def per_call_us(fn, calls=200):
    """Host time per call (host_and_wall_us)."""
    return host_and_wall_us(fn, calls)[0]


def main():
    dtype = torch.bfloat16
    mat = BlockSparseMatrix.randn((4096, 4096), density=0.5, block_shape=(64, 64), dtype=dtype, device="cuda")
    data, index = mat.data.detach(), mat.indices()
    x = torch.randn(256, 4096, device="cuda", dtype=dtype)
    dy = torch.randn(256, 4096, device="cuda", dtype=dtype)
    w = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    rows = [("_C.dsd (Hopper path)", lambda: _C.dsd(x, data, None, *index)),
            ("_C.dds (Hopper path)", lambda: _C.dds(dy, data, *index)),
            ("_C.sdd (Hopper path, split M)", lambda: _C.sdd(dy, x, *index, [64, 64], True)),
            ("_ops.dsd (custom op)", lambda: _ops.dsd(x, data, None, *index)),
            ("torch.empty(256, 4096)", lambda: torch.empty(256, 4096, device="cuda", dtype=dtype)),
            ("torch.zeros(1, int32)", lambda: torch.zeros(1, device="cuda", dtype=torch.int32)),
            ("F.linear(x, W) (cuBLAS)", lambda: torch.nn.functional.linear(x, w)),
            ("x.add_(0) (one launch)", lambda: x.add_(0))]
    with _ops.forced_knobs((_ops.set_hopper_min_rows, 1)):
        for name, fn in rows:
            print(f"{name:32s} {per_call_us(fn):7.1f} us per call (host)", flush=True)


if __name__ == "__main__":
    main()
