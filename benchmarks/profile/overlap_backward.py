"""Does the backward gain from running its two products at once? Times the layer's training step through the
eager autograd node (_C.linear: dsd, then sdd on the current stream and dds on a second one, joined back) with
_ops.set_backward_overlap on and off, eager and replayed from a CUDA graph of 4 steps (GPU time), interleaved
over rounds on fresh random patterns. --modes compiled,compiled_graph time the same step under torch.compile
(inductor), whose backward calls the linear_grads custom op (the same two streams).

    python benchmarks/profile/overlap_backward.py [--rounds 3] [--shape 8192x4096x4096] [--blocks 64,128]
        [--modes eager,graph,compiled,compiled_graph]
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import BlockSparseMatrix, _ops  # noqa: E402

from bench_linear import ab_setup, ratio_report, time_graph_ms, time_ms  # noqa: E402


def main():
    args, x, dy = ab_setup(__doc__, rounds=3, extra=[("--modes", "eager,graph")])
    xg = x.clone().requires_grad_(True)
    bias = torch.zeros(args.n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    from pytorch_block_sparse_ng import _C
    from pytorch_block_sparse_ng.functional import BlockSparseLinearFunction

    torch._dynamo.config.cache_size_limit = 64  # a graph per (block, density): nnz differs
    compiled_linear = torch.compile(lambda x, data, bias, *index: BlockSparseLinearFunction.apply(x, data, bias,
                                                                                                  *index))
    for mode in args.modes.split(","):
        graph = mode.endswith("graph")
        linear = compiled_linear if mode.startswith("compiled") else (
            lambda x, data, bias, *index: _C.linear(x, data, bias, list(index)))
        for block in args.blocks:
            for density in args.densities:
                times = {}
                for r in range(args.rounds):
                    mat = BlockSparseMatrix.randn((args.n, args.k), density=density, block_shape=(block, block),
                                                  dtype=torch.bfloat16, device="cuda")
                    data = mat.data.detach().requires_grad_(True)
                    index = list(mat.indices())

                    def step():
                        y = linear(xg, data, bias, *index)
                        torch.autograd.grad(y, (xg, data, bias), dy)

                    def timed(overlap):
                        with _ops.forced_knobs((_ops.set_backward_overlap, overlap)):  # a graph captures its streams
                            return time_graph_ms(step, 4, 30) if graph else time_ms(step)

                    variants = [("one stream", False), ("two streams", True)]
                    shift = r % len(variants)
                    for name, overlap in variants[shift:] + variants[:shift]:
                        times.setdefault(name, []).append(timed(overlap))
                print(ratio_report(f"{mode} step block {block:3d} density {density:4.2f}", times), flush=True)


if __name__ == "__main__":
    main()
