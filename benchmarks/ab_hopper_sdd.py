"""A/B timing of the Hopper sdd choices, interleaved so that clock drift hits both sides.

    python benchmarks/ab_hopper_sdd.py [--rounds 5] [--shape 8192x4096x4096]

Variants per (block, density), on a fresh random pattern each round:
  sdd+bias    the bias gradient summed inside the sdd (sdd_with_bias_grad, what the layer's backward calls)
  sdd         the sdd op alone
  sdd,sum     the sdd, then dy.sum(0) as a separate kernel (what the layer did before the fusion)
(A "split tail" variant, partial chunks run as two halves of M, measured in session 6 and dropped, is in
benchmarks/results/ab_hopper_sdd_split_tail_*.txt as split+bias / whole+bias / split / split,sum.)
Each round times every variant once (median of 30 CUDA-event timings) in a rotating order; the table gives the
median over rounds of each variant's time and its ratio to sdd+bias of the same round, and the spread
(max / min over rounds) of sdd+bias itself.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import _C  # noqa: E402

from bench_linear import ab_setup, interleaved_times, ratio_report  # noqa: E402


def main():
    args, x, dy = ab_setup(__doc__, rounds=5)
    for block in args.blocks:
        for density in args.densities:
            def variants(mat):
                index, shape = mat.indices(), [block, block]
                return {"sdd+bias": lambda: _C.sdd(dy, x, *index, shape, True),
                        "sdd": lambda: _C.sdd(dy, x, *index, shape, False),
                        "sdd,sum": lambda: (_C.sdd(dy, x, *index, shape, False), dy.sum(0))}

            times = interleaved_times(args, block, density, variants)
            print(ratio_report(f"block {block:3d} density {density:4.2f} sdd", times), flush=True)


if __name__ == "__main__":
    main()
