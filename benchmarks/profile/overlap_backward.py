"""Would the backward gain from running its two products at once? Times dds (grad input) and sdd with the fused
bias gradient (grad blocks, grad bias) one after the other on one stream, and concurrently (sdd on a second
stream, joined back), interleaved over rounds on fresh random patterns.

    python benchmarks/profile/overlap_backward.py [--rounds 3] [--shape 8192x4096x4096]
"""
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import BlockSparseMatrix  # noqa: E402
from pytorch_block_sparse_ng import _C  # noqa: E402

from bench_linear import ab_setup, time_ms  # noqa: E402


def main():
    args, x, dy = ab_setup(__doc__, rounds=3)
    k, n, dtype = args.k, args.n, torch.bfloat16
    side = torch.cuda.Stream()
    for block in args.blocks:
        for density in args.densities:
            times = {"one stream": [], "two streams": []}
            for r in range(args.rounds):
                mat = BlockSparseMatrix.randn((n, k), density=density, block_shape=(block, block), dtype=dtype,
                                              device="cuda")
                data, index, shape = mat.data.detach(), mat.indices(), [block, block]

                def sequential():
                    _C.dds(dy, data, *index)
                    _C.sdd(dy, x, *index, shape, True)

                def concurrent():
                    main_stream = torch.cuda.current_stream()
                    side.wait_stream(main_stream)
                    with torch.cuda.stream(side):
                        _C.sdd(dy, x, *index, shape, True)
                    _C.dds(dy, data, *index)
                    main_stream.wait_stream(side)

                order = (("one stream", sequential), ("two streams", concurrent))
                for name, fn in (order if r % 2 == 0 else order[::-1]):
                    times[name].append(time_ms(fn))
            one, two = (statistics.median(t) for t in times.values())
            print(f"block {block:3d} density {density:4.2f}: dds + sdd one stream {one:.4f} ms, two streams "
                  f"{two:.4f} ms ({two / one:.3f})", flush=True)


if __name__ == "__main__":
    main()
