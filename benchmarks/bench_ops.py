"""Times each kernel (dsd, dds, sdd) alone, to see where a BlockSparseLinear training step spends its time.

    python benchmarks/bench_ops.py [--shape 8192x4096x4096] [--dtype bf16]

Prints ms and TFLOP/s on the kept blocks (2 * M * N * K * density / time) next to cuBLAS on the dense problem.
"""

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import BlockSparseMatrix, _extension  # noqa: E402


def time_ms(fn, warmup=5, reps=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="8192x4096x4096", help="M x in_features x out_features")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--blocks", default="32,64,128")
    parser.add_argument("--densities", default="0.1,0.5,1.0")
    args = parser.parse_args()
    m, k, n = (int(v) for v in args.shape.split("x"))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    ops = _extension.get()
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype)
    flop = 2.0 * m * n * k
    dense = {"fwd x Wt": time_ms(lambda: x @ w.t()), "dx = dy W": time_ms(lambda: dy @ w),
             "dW = dyT x": time_ms(lambda: dy.t() @ x)}
    print(f"{torch.cuda.get_device_name()} {args.dtype} M={m} K={k} N={n}")
    for name, t in dense.items():
        print(f"dense {name:12s} {t:8.4f} ms {flop / t / 1e9:7.1f} TFLOP/s")
    for block in (int(b) for b in args.blocks.split(",")):
        for density in (float(d) for d in args.densities.split(",")):
            mat = BlockSparseMatrix.randn((n, k), density=density, block_shape=(block, block), dtype=dtype,
                                          device="cuda")
            data, index = mat.data.detach(), mat.indices()
            kept = flop * mat.nnz_blocks / max(1, mat.grid[0] * mat.grid[1])
            times = {"dsd": time_ms(lambda: ops.dsd(x, data, None, *index)),
                     "dds": time_ms(lambda: ops.dds(dy, data, *index)),
                     "sdd": time_ms(lambda: ops.sdd(dy, x, *index, (block, block)))}
            print(f"block {block:3d} density {density:4.2f}: " + "  ".join(
                f"{op} {t:7.4f} ms {kept / t / 1e9:6.1f} TF/s" for op, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
