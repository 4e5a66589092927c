"""A/B timing of the Hopper dsd / dds scheduling and pipeline choices, interleaved so that clock drift hits both sides.

    python benchmarks/ab_hopper_schedule.py [--rounds 5] [--shape 8192x4096x4096]

Variants per (block, density), on a fresh random pattern each round:
  pair+dyn  the pattern's row_order / col_order (layout.pair_order; length_order for blocks of 128), tiles from
            the counter and 4 pipeline stages (the default)
  pair+rr   the same orders, tiles dealt round-robin
  id+dyn    lines in natural order, tiles from the counter
  3stages   as pair+dyn with 3 pipeline stages (the output tile staged whole instead of in two halves)
(Pairs ordered by first row instead of largest union first, the other variant measured in session 5, is in
benchmarks/results/ab_hopper_schedule_lpt_*.txt; pair_order now does the latter.)
Each round times every variant once (median of 30 CUDA-event timings) in a rotating order; the table gives
the median over rounds of each variant's time and its ratio to pair+dyn of the same round, and the spread
(max / min over rounds) of pair+dyn itself. Also the host time per call of the binding at M = 256.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import BlockSparseMatrix  # noqa: E402
from pytorch_block_sparse_ng import _C, _ops  # noqa: E402

from bench_linear import ab_setup, interleaved_times, ratio_report, with_knobs  # noqa: E402
from bench_ops import per_call_us  # noqa: E402


def main():
    args, x, dy = ab_setup(__doc__, rounds=5)
    dtype = torch.bfloat16

    def with_dynamic_tiles(dynamic, fn):
        return with_knobs(fn, [(_ops.set_hopper_tile_schedule, "counter" if dynamic else "round_robin")])

    for block in args.blocks:
        for density in args.densities:
            for op in ("dsd", "dds"):
                def variants(mat):
                    data, index = mat.data.detach(), mat.indices()
                    natural = (*index[:6], torch.arange(mat.grid[0], device="cuda", dtype=torch.int32),
                               torch.arange(mat.grid[1], device="cuda", dtype=torch.int32))
                    run = {"dsd": lambda idx: _C.dsd(x, data, None, *idx), "dds": lambda idx: _C.dds(dy, data, *idx)}[op]
                    return {"pair+dyn": with_dynamic_tiles(True, lambda: run(index)),
                            "pair+rr": with_dynamic_tiles(False, lambda: run(index)),
                            "id+dyn": with_dynamic_tiles(True, lambda: run(natural)),
                            "3stages": with_knobs(with_dynamic_tiles(True, lambda: run(index)),
                                                  [(_ops.set_hopper_pipeline_stages, 3)])}

                times = interleaved_times(args, block, density, variants)
                print(ratio_report(f"block {block:3d} density {density:4.2f} {op}", times), flush=True)
    mat = BlockSparseMatrix.randn((4096, 4096), density=0.5, block_shape=(64, 64), dtype=dtype, device="cuda")
    data, index = mat.data.detach(), mat.indices()
    xs = torch.randn(256, 4096, device="cuda", dtype=dtype)
    for dynamic in (True, False, True, False):
        with _ops.forced_knobs((_ops.set_hopper_tile_schedule, "counter" if dynamic else "round_robin")):
            print(f"host time per _C.dsd call, M=256 4096x4096 block 64 d=0.5, dynamic={dynamic}: "
                  f"{per_call_us(lambda: _C.dsd(xs, data, None, *index)):.1f} us")


if __name__ == "__main__":
    main()
