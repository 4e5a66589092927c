"""dsd at few rows of M (decode): the decode kernel against the tiled path and dense cuBLAS.

    python benchmarks/bench_decode.py [--shape 4096x4096] [--rows 1,4,16,...] [--out benchmarks/results]

Times y = x W^T + bias per call inside a CUDA graph of --graph-calls calls (the GPU's time, without the
host's), for the decode kernel (kernel_decode.cuh, M <= 64), the tiled kernels it replaces at these M (the
SM80 kernel with the row's blocks split over CTAs, an fp32 workspace and a cast; set_decode_max_rows(0)) and
F.linear on the dense weight. Prints ms, the ratio to dense and the bandwidth of W's kept blocks (bytes / time),
and checks that both paths give the same result within rounding. With --out it writes the table to
bench_decode_<GPU>.txt there.

"hot": every call reads the same weight, which stays in L2 when it fits (50 MB on an H100: a 4096 x 4096 bf16
weight of density 0.5 is 16 MB). "cold": the calls cycle over copies of the weight (>= 160 MB in all), so each
call reads its weight from DRAM, as a model's decode step does (its layers' weights do not fit in L2).
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import BlockSparseMatrix, _extension  # noqa: E402

from bench_linear import time_graph_ms  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def cycling(fns):
    """One callable that runs fns[0], fns[1], ... in turn, one per call."""
    state = [0]

    def call():
        fns[state[0] % len(fns)]()
        state[0] += 1
    return call


def copies_for(tensor, total_bytes=160 << 20):
    """Enough copies of `tensor` (itself first) to hold >= total_bytes: cycling over them defeats the L2."""
    count = max(2, -(-total_bytes // max(1, tensor.numel() * tensor.element_size())))
    return [tensor] + [tensor.clone() for _ in range(count - 1)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="4096x4096", help="in_features x out_features")
    parser.add_argument("--rows", default="1,2,4,8,16,32,48,64,96,128")
    parser.add_argument("--blocks", default="32,64,128")
    parser.add_argument("--densities", default="0.1,0.25,0.5,1.0")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--graph-calls", type=int, default=20)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    k, n = (int(v) for v in args.shape.split("x"))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    ops = _extension.get()
    from pytorch_block_sparse_ng import _ops

    lines = [f"{torch.cuda.get_device_name()} {args.dtype} K={k} N={n}; per call inside a CUDA graph of "
             f"{args.graph_calls} calls, median of {args.reps}; hot: one weight, cold: cycling over >= 160 MB of "
             f"copies; GB/s = W's kept bytes / time (cold)",
             f"{'M':>3} {'block':>5} {'dens':>4} | {'ms, hot: dense':>14} {'decode':>7} {'tiled':>7} | "
             f"{'ms, cold: dense':>15} {'decode':>7} {'tiled':>7} | {'x dense, cold: decode':>21} {'tiled':>5} | "
             f"{'GB/s: decode':>12} {'tiled':>5}"]
    print("\n".join(lines), flush=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=dtype, generator=gen) / k ** 0.5
    w_copies = copies_for(w)
    bias = torch.randn(n, device="cuda", dtype=dtype, generator=gen)
    mats = {(block, density): BlockSparseMatrix.randn((n, k), density=density, block_shape=(block, block),
                                                      dtype=dtype, device="cuda",
                                                      generator=torch.Generator().manual_seed(1))
            for block in (int(b) for b in args.blocks.split(","))
            for density in (float(d) for d in args.densities.split(","))}
    nan = float("nan")
    for m in (int(r) for r in args.rows.split(",")):
        x = torch.randn(m, k, device="cuda", dtype=dtype, generator=gen)
        with torch.no_grad():
            dense = {"hot": time_graph_ms(lambda: F.linear(x, w, bias), args.graph_calls, args.reps),
                     "cold": time_graph_ms(cycling([lambda w=c: F.linear(x, w, bias) for c in w_copies]),
                                           args.graph_calls, args.reps)}
            for (block, density), mat in mats.items():
                data, index = mat.data.detach(), mat.indices()
                data_copies = copies_for(data)
                runs = {"hot": lambda: ops.dsd(x, data, bias, *index),
                        "cold": cycling([lambda d=c: ops.dsd(x, d, bias, *index) for c in data_copies])}
                times, outs = {}, {}
                for path, rows in (("decode", 64), ("tiled", 0)):
                    if path == "decode" and m > 64:
                        continue
                    with _ops.forced_knobs((_ops.set_decode_max_rows, rows)):
                        outs[path] = runs["hot"]()
                        for temp, run in runs.items():
                            times[path, temp] = time_graph_ms(run, args.graph_calls, args.reps)
                del data_copies
                if len(outs) == 2:
                    scale = outs["tiled"].float().abs().max().item() + 1e-6
                    diff = (outs["decode"].float() - outs["tiled"].float()).abs().max().item() / scale
                    assert diff < 2e-2, f"decode and tiled dsd differ by {diff:.3g} (M={m}, block {block})"
                nbytes = data.numel() * data.element_size()
                dec_hot, dec_cold = times.get(("decode", "hot"), nan), times.get(("decode", "cold"), nan)
                til_hot, til_cold = times["tiled", "hot"], times["tiled", "cold"]
                line = (f"{m:3d} {block:5d} {density:4.2f} | {dense['hot']:14.4f} {dec_hot:7.4f} {til_hot:7.4f} | "
                        f"{dense['cold']:15.4f} {dec_cold:7.4f} {til_cold:7.4f} | "
                        f"{dense['cold'] / dec_cold:21.2f} {dense['cold'] / til_cold:5.2f} | "
                        f"{nbytes / dec_cold / 1e6:12.0f} {nbytes / til_cold / 1e6:5.0f}")
                lines.append(line)
                print(line, flush=True)
    if args.out:
        name = torch.cuda.get_device_name().replace(" ", "_")
        path = os.path.join(args.out, f"bench_decode_{name}.txt")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
