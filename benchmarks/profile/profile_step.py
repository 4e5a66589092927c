"""Where the time of one BlockSparseLinear training step goes: host time per step (Python + launches, measured
without synchronising, while the GPU queue is not full), wall time per step, and torch.profiler's table;
with --python-profile, also cProfile's view of the host side (the Python functions by own time).

    python benchmarks/profile/profile_step.py --shape 8192x4096x4096 --block 128 --density 0.1
"""
import argparse
import cProfile
import pstats
import time

import torch
from torch.profiler import ProfilerActivity, profile

from pytorch_block_sparse_ng import BlockSparseLinear


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="8192x4096x4096", help="tokens x in x out")
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--density", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--python-profile", action="store_true", help="cProfile the host side of the steps")
    args = parser.parse_args()
    m, k, n = (int(v) for v in args.shape.split("x"))
    layer = BlockSparseLinear(k, n, density=args.density, block_shape=(args.block, args.block), device="cuda",
                              dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    params = (x, layer.weight.data, layer.bias)

    def step():
        torch.autograd.grad(layer(x), params, dy)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    # The default 20 steps launch ~200 kernels, far below the launch queue's depth: the host never waits
    # for the GPU, so the first time is the host's alone.
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    host_ms = (time.perf_counter() - start) * 1e3 / args.steps
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - start) * 1e3 / args.steps
    print(f"host {host_ms:.3f} ms per step (launching), wall {wall_ms:.3f} ms per step")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
    print(f"{args.shape} block {args.block} density {args.density}, {args.steps} steps")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))
    if args.python_profile:
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.steps):
            step()
        profiler.disable()
        torch.cuda.synchronize()
        print(f"cProfile of {args.steps} steps (host side), by own time:")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
