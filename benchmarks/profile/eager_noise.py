"""How much eager (host-bound) timings drift within one process: the eager training step and no-grad forward of
BlockSparseLinear (8192 x 4096 -> 4096 bf16; block 128 at density 0.1 / 0.25, block 64 at 0.1) and STK's
(block 128, density 0.1), each timed as bench_linear.py times a cell (time_ms: median of 30 CUDA-event timings),
repeatedly: in a fresh process, with the garbage collector off, after a run of bench_linear.run on the same
shape (blocks 64 / 128, peers on), after gc.collect() and after torch.cuda.empty_cache().

    python benchmarks/profile/eager_noise.py

Written in session 12 to find why bench_linear.py's eager cells at low density had come out 2x their
CUDA-graph time in one run and not in another: the answer is in benchmarks/results/eager_noise_*.txt.
"""
import argparse
import contextlib
import gc
import io
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_linear  # noqa: E402
from bench_linear import stk_functions, time_ms, try_import_stk  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from pytorch_block_sparse_ng import BlockSparseLinear  # noqa: E402


def main():
    m, k, n = 8192, 4096, 4096
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xg = x.clone().requires_grad_(True)
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    stk = try_import_stk()
    if stk is None:
        sys.exit("eager_noise.py compares with STK: pip install stanford-stk")
    layers = {(b, d): BlockSparseLinear(k, n, density=d, block_shape=(b, b), device="cuda", dtype=torch.bfloat16,
                                        generator=torch.Generator().manual_seed(1))
              for b, d in ((128, 0.1), (128, 0.25), (64, 0.1))}
    peer = stk_functions(stk, layers[(128, 0.1)].weight.to_dense().detach(), x, dy)

    def measure(label):
        cells = []
        for (block, density), layer in layers.items():
            params = (xg, layer.weight.data, layer.bias)

            def step():
                y = layer(xg)
                torch.autograd.grad(y, params, dy)

            with torch.no_grad():
                forward = time_ms(lambda: layer(x))
            cells.append(f"b{block} d{density}: step {time_ms(step):.3f} fwd {forward:.3f}")
        cells.append(f"stk b128 d0.1: step {time_ms(peer['step']):.3f} fwd {time_ms(peer['forward']):.3f}")
        print(f"{label:32s} " + " | ".join(cells), flush=True)

    print(f"{torch.cuda.get_device_name()}: ms per call, each cell one bench_linear.time_ms (median of 30 CUDA-event "
          f"timings), bf16 8192 x 4096 -> 4096; {len(gc.get_objects())} objects tracked by gc")
    measure("fresh process")
    gc.disable()
    measure("fresh process, gc off")
    gc.enable()
    started = time.time()
    args = argparse.Namespace(dtypes=["bf16"], blocks=[64, 128], densities=[0.1, 0.25, 0.5, 1.0],
                              shapes=[(m, k, n)], reps=30, warmup=5, graph_calls=20, graph_steps=4, eager_rounds=1,
                              no_peers=False)
    with contextlib.redirect_stdout(io.StringIO()):
        bench_linear.run(args)
    print(f"(bench_linear.run, blocks 64 / 128, peers: {time.time() - started:.0f} s; {len(gc.get_objects())} "
          "objects tracked by gc)")
    measure("after bench_linear.run")
    gc.collect()
    measure("after gc.collect()")
    gc.disable()
    measure("gc off")
    gc.enable()
    torch.cuda.empty_cache()
    measure("after torch.cuda.empty_cache()")
    measure("again")


if __name__ == "__main__":
    main()
