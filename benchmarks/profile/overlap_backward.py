"""Would the backward gain from running its two products at once? Times dds (grad input) and sdd with the fused
bias gradient (grad blocks, grad bias) one after the other on one stream, and concurrently (sdd on a second
stream, joined back), interleaved over rounds on fresh random patterns.

    python benchmarks/profile/overlap_backward.py [--rounds 3] [--shape 8192x4096x4096]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import _C  # noqa: E402

from bench_linear import ab_setup, interleaved_times, ratio_report  # noqa: E402


def main():
    args, x, dy = ab_setup(__doc__, rounds=3)
    side = torch.cuda.Stream()
    for block in args.blocks:
        for density in args.densities:
            def variants(mat):
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

                return {"one stream": sequential, "two streams": concurrent}

            times = interleaved_times(args, block, density, variants)
            print(ratio_report(f"block {block:3d} density {density:4.2f} dds + sdd", times), flush=True)


if __name__ == "__main__":
    main()
