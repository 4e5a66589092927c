"""Times each kernel (dsd, dds, sdd) alone, to see where a BlockSparseLinear training step spends its time.

    python benchmarks/bench_ops.py [--shape 8192x4096x4096] [--dtype bf16]

Prints ms and TFLOP/s on the kept blocks (2 * M * N * K * density / time) next to cuBLAS on the dense problem,
the SM80 kernel of each product on Hopper GPUs, and dsd / dds with lines in their natural order ("(id)")
instead of the pattern's row_order / col_order (layout.pair_order), which decide the lines paired in a tile,
and with the tile schedule that "auto" does not take: round-robin ("(rr)").
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import BlockSparseLinear, BlockSparseMatrix, _extension  # noqa: E402

from bench_linear import time_ms  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def per_call_us(fn, calls=300):
    """Wall time per call of `calls` back-to-back calls: the host overhead when the kernels are tiny."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def host_overhead(dtype):
    """Per-call cost of each layer of the stack at M = 16, 4096 x 4096, block 64, density 0.5."""
    from pytorch_block_sparse_ng import _C, _ops

    layer = BlockSparseLinear(4096, 4096, density=0.5, block_shape=(64, 64), device="cuda", dtype=dtype)
    x = torch.randn(16, 4096, device="cuda", dtype=dtype)
    w = torch.randn(4096, 4096, device="cuda", dtype=dtype)
    data, index, bias = layer.weight.data.detach(), layer.weight.indices(), layer.bias.detach()
    xg = x.clone().requires_grad_(True)
    cases = {"F.linear": lambda: torch.nn.functional.linear(x, w, bias),
             "_C.dsd (binding)": lambda: _C.dsd(x, data, bias, *index),
             "_ops.dsd (eager path)": lambda: _ops.dsd(x, data, bias, *index),
             "custom op _ops._dsd": lambda: _ops._dsd(x, data, bias, *index)}
    with torch.no_grad():
        results = {name: per_call_us(fn) for name, fn in cases.items()}
        results["layer(x), no_grad"] = per_call_us(lambda: layer(x))
    results["layer(x), x requires grad"] = per_call_us(lambda: layer(xg))
    for name, us in results.items():
        print(f"host overhead {name:28s} {us:7.1f} us/call")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="8192x4096x4096", help="M x in_features x out_features")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--blocks", default="32,64,128")
    parser.add_argument("--densities", default="0.1,0.5,1.0")
    parser.add_argument("--overhead", action="store_true", help="also time the host overhead per call")
    args = parser.parse_args()
    m, k, n = (int(v) for v in args.shape.split("x"))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    ops = _extension.get()
    from pytorch_block_sparse_ng import _C, _ops

    if args.overhead:
        host_overhead(dtype)
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
            products = {"dsd": lambda: ops.dsd(x, data, None, *index), "dds": lambda: ops.dds(dy, data, *index),
                        "sdd": lambda: ops.sdd(dy, x, *index, (block, block))}
            hopper = _C.uses_hopper_kernels(torch.cuda.current_device(), block)
            times = {}
            natural = (*index[:6], torch.arange(mat.grid[0], device="cuda", dtype=torch.int32),
                       torch.arange(mat.grid[1], device="cuda", dtype=torch.int32))
            for op, run in products.items():
                times[op] = time_ms(run)
                if hopper and op == "dsd":
                    times["dsd(id)"] = time_ms(lambda: ops.dsd(x, data, None, *natural))
                if hopper and op == "dds":
                    times["dds(id)"] = time_ms(lambda: ops.dds(dy, data, *natural))
                if hopper and op in ("dsd", "dds"):  # the tile schedule that "auto" does not take
                    with _ops.forced_knobs((_ops.set_hopper_tile_schedule, "round_robin")):
                        times[f"{op}(rr)"] = time_ms(run)
                if hopper:  # the SM80 kernel of the same product, for comparison
                    with _ops.forced_knobs((_ops.set_hopper_kernels, False)):
                        times[f"{op}(sm80)"] = time_ms(run)
            print(f"block {block:3d} density {density:4.2f}: " + "  ".join(
                f"{op} {t:7.4f} ms {kept / t / 1e9:6.1f} TF/s" for op, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
