"""The Hopper sdd's time against its number of working CTAs (wave quantization), over random patterns.

The sdd runs one CTA per (block row, chunk of up to 8 / 2 of its blocks, split of M): the number of CTAs
that work depends on how many rows leave a partial chunk, and one CTA per SM fits (~217 KB of shared memory).
For each pattern this prints the working CTAs, their waves on the GPU (CTAs / SMs, x the splits of M), and
the sdd's time (bench_linear.time_ms: median of 30, CUDA events), with and without the tail split (blocks of
128: the last partial wave's items split over M, kernel_sm90_sdd.cuh).

    python benchmarks/profile/sdd_waves.py --blocks 64,128 --densities 0.25,0.5 --seeds 8
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_linear import time_ms  # noqa: E402

from pytorch_block_sparse_ng import BlockSparseMatrix, _C, _ops  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="8192x4096x4096", help="tokens x in x out")
    parser.add_argument("--blocks", default="64,128")
    parser.add_argument("--densities", default="0.25,0.5")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--tail-split", type=int, default=1, help="1: the sdd's tail split on (default), 0: off; "
                        "each pattern is also timed with the other setting")
    args = parser.parse_args()
    m, k, n = (int(v) for v in args.shape.split("x"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    print(f"{torch.cuda.get_device_name()}, bf16 {args.shape}, {sms} SMs; sdd with the bias gradient")
    for block in (int(b) for b in args.blocks.split(",")):
        chunk = 8 if block == 64 else 2
        for density in (float(d) for d in args.densities.split(",")):
            rows = []
            for seed in range(args.seeds):
                mat = BlockSparseMatrix.randn((n, k), density=density, block_shape=(block, block),
                                              dtype=torch.bfloat16, generator=torch.Generator().manual_seed(seed))
                counts = (mat.row_offsets[1:] - mat.row_offsets[:-1]).tolist()
                ctas = sum((c + chunk - 1) // chunk for c in counts) + sum(1 for c in counts if c == 0)
                partial = sum(1 for c in counts if c % chunk)
                mat = mat.to("cuda")
                index = mat.indices()
                ms = time_ms(lambda: _C.sdd(dy, x, *index, [block, block], True))
                with _ops.forced_knobs((_C.set_hopper_sdd_tail_split, not args.tail_split)):
                    ms_other = time_ms(lambda: _C.sdd(dy, x, *index, [block, block], True))
                rows.append((ctas, partial, ms, ms_other))
            print(f"block {block} density {density}: working CTAs / rows with a partial chunk / ms (waves = CTAs / "
                  f"{sms}, before any split of M)")
            other = "without" if args.tail_split else "with"
            for ctas, partial, ms, ms_other in sorted(rows):
                print(f"  {ctas:5d} CTAs ({ctas / sms:5.2f} waves)  {partial:3d} partial  {ms:.4f} ms  ({other} the "
                      f"tail split: {ms_other:.4f} ms)")


if __name__ == "__main__":
    main()
