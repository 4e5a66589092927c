"""dsd between decode and large M: which path the binding takes at M = 64-384 and what each would take.

    python benchmarks/profile/dsd_mid_rows.py

For 4096 x 4096 bf16 weights (blocks 64 / 128, densities 0.1-1.0) and M = 64 ... 384: dense F.linear, the
decode kernel (M <= 64), the SM80 tiled kernels (Hopper kernels off; below ~128 x SMs / block rows tokens they
split each row's blocks over CTAs into an fp32 workspace) and the binding with the Hopper minimum rows lowered
to 1 (it still takes the SM80 split path wherever the split rule applies). Per call in a CUDA graph of 20
calls, the same weight at every call (hot in L2). Written in session 13 to size the mid-M gap:
benchmarks/results/dsd_mid_rows_*.txt.
"""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import BlockSparseMatrix, _extension, _ops  # noqa: E402

from bench_linear import time_graph_ms  # noqa: E402


def main():
    ops = _extension.get()
    k = n = 4096
    print(f"{torch.cuda.get_device_name()} bf16 K={k} N={n}; ms per call in a CUDA graph of 20 calls (hot weight)")
    print("   M block dens |  dense | decode | sm80 tiled | Hopper min rows 1")
    for m in (64, 96, 128, 160, 192, 224, 255, 256, 384):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        dense = time_graph_ms(lambda: F.linear(x, w), 20, 30)
        for block in (64, 128):
            for density in (0.1, 0.25, 0.5, 1.0):
                mat = BlockSparseMatrix.randn((n, k), density=density, block_shape=(block, block),
                                              dtype=torch.bfloat16, device="cuda")
                data, index = mat.data.detach(), mat.indices()
                run = lambda: ops.dsd(x, data, None, *index)  # noqa: E731
                times = {}
                previous_decode = _ops.set_decode_max_rows(64)
                previous_min = _ops.set_hopper_min_rows(1 << 30)
                try:
                    times["decode"] = time_graph_ms(run, 20, 30) if m <= 64 else float("nan")
                    _ops.set_decode_max_rows(0)
                    times["sm80"] = time_graph_ms(run, 20, 30)
                    _ops.set_hopper_min_rows(1)
                    times["hopper"] = time_graph_ms(run, 20, 30)
                finally:
                    _ops.set_hopper_min_rows(previous_min)
                    _ops.set_decode_max_rows(previous_decode)
                print(f"{m:4d} {block:5d} {density:4.2f} | {dense:.4f} | {times['decode']:.4f} | "
                      f"{times['sm80']:10.4f} | {times['hopper']:.4f}", flush=True)


if __name__ == "__main__":
    main()
