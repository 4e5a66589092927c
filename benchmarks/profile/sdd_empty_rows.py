"""The block-128 Hopper sdd with the bias gradient, on patterns of a given block count with some block rows empty:
the one-block kernel (set_hopper_sdd_one_block_ctas=1) against the TMA sdd (=0). With the bias, the one-block
kernel launches one CTA per block row after the block CTAs; a row without blocks sums its bias there, after the
blocks when they fill both CTA slots of every SM (a second, short wave). GPU time in CUDA graphs of 20 calls.

    python benchmarks/profile/sdd_empty_rows.py [--shape 8192x4096x4096] [--counts 200,250,262] [--empty 0,1,4]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ab_experiment import with_env  # noqa: E402
from bench_linear import time_graph_ms  # noqa: E402
from pytorch_block_sparse_ng import BlockSparseMatrix, _C  # noqa: E402


def mask_with_empty_rows(rows, cols, count, empty, generator):
    """A random [rows, cols] block mask of `count` blocks whose first `empty` rows (in a random order) have none."""
    order = torch.randperm(rows, generator=generator)
    full = order[empty:]
    cells = torch.randperm(len(full) * cols, generator=generator)[:count]
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    mask[full[cells // cols], cells % cols] = True
    return mask


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="8192x4096x4096")
    parser.add_argument("--counts", default="200,250,262")
    parser.add_argument("--empty", default="0,1,4")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    m, k, n = (int(v) for v in args.shape.split("x"))
    block = 128
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    print(f"{torch.cuda.get_device_name()} bf16 M={m} K={k} N={n} block {block}, sdd with the bias gradient, "
          f"{torch.cuda.get_device_properties(0).multi_processor_count} SMs, median of {args.rounds} patterns")
    for count in (int(c) for c in args.counts.split(",")):
        for empty in (int(e) for e in args.empty.split(",")):
            times = {"tma": [], "one": []}
            for r in range(args.rounds):
                mask = mask_with_empty_rows(n // block, k // block, count, empty, generator)
                mat = BlockSparseMatrix.from_block_mask(mask.cuda(), (block, block), dtype=torch.bfloat16)
                index = mat.indices()
                names = ["tma", "one"] if r % 2 == 0 else ["one", "tma"]
                for name in names:
                    run = with_env({"set_hopper_sdd_one_block_ctas": str(int(name == "one"))},
                                   lambda: _C.sdd(dy, x, *index, [block, block], True))
                    times[name].append(time_graph_ms(run, 20, 30))
            tma, one = (sorted(times[name])[len(times[name]) // 2] for name in ("tma", "one"))
            print(f"blocks {count:4d} empty rows {empty}: tma {tma:.4f} ms  one {one:.4f} ms ({one / tma:.3f})",
                  flush=True)


if __name__ == "__main__":
    main()
