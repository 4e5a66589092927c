"""Host time of an eager training step, part by part: what a plain PyTorch training loop pays on the CPU per
BlockSparseLinear step, against the same loop with dense F.linear and against STK's raw ops.

Each row is the host time per call (time.perf_counter over a few calls, before synchronising: the GPU queue
never fills, so the host is measured, not the GPU), median of --rounds rounds. Rows:
  launch        x.add_(0): one ATen kernel launch (this host's unit of cost)
  engine        autograd.grad through a Python autograd.Function whose backward returns its input: the engine's
                own cost (thread hand-off to the device thread, GIL, graph walk)
  dense step    F.linear forward + autograd.grad (cuBLAS: 1 + 3 launches)
  ours: forward no_grad / forward with grad / step (forward + autograd.grad: the C++ autograd node in eager
                mode), the same step through the Python autograd.Function, raw (the three backend calls, no
                autograd), and the bindings _C.dsd / _C.dds / _C.sdd alone
  stk step      STK's dds + dds + sdd + dy.sum (what bench_linear times for STK)
Then torch.profiler's CPU table of our step, by self CPU time.

    python benchmarks/profile/host_step.py --block 128 --density 0.1
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from pytorch_block_sparse_ng import BlockSparseLinear, _C, backend
from pytorch_block_sparse_ng.functional import BlockSparseLinearFunction

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_linear import stk_functions  # noqa: E402  (STK's training step as bench_linear times it)


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def host_us(fn, calls, rounds):
    """Median over rounds of the host time per call of `calls` calls (µs), synchronising between rounds."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) * 1e6 / calls)
        torch.cuda.synchronize()
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", default="8192x4096x4096", help="tokens x in x out")
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--density", type=float, default=0.1)
    parser.add_argument("--calls", type=int, default=10, help="calls per timing (keep launches << 1024)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--no-profiler", action="store_true")
    parser.add_argument("--ab-rounds", type=int, default=0, help="then time the steps interleaved, this many rounds")
    args = parser.parse_args()
    m, k, n = (int(v) for v in args.shape.split("x"))
    dtype = torch.bfloat16
    layer = BlockSparseLinear(k, n, density=args.density, block_shape=(args.block, args.block), device="cuda",
                              dtype=dtype)
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    xg = x.clone().requires_grad_(True)
    dy = torch.randn(m, n, device="cuda", dtype=dtype)
    w = torch.randn(n, k, device="cuda", dtype=dtype, requires_grad=True)
    b = torch.zeros(n, device="cuda", dtype=dtype, requires_grad=True)
    data, index = layer.weight.data, layer.weight.indices()
    params = (xg, data, layer.bias)
    block_shape = [args.block, args.block]

    def step():
        torch.autograd.grad(layer(xg), params, dy)

    def step_python_function():
        torch.autograd.grad(BlockSparseLinearFunction.apply(xg, data, layer.bias, *index), params, dy)

    def dense_step():
        torch.autograd.grad(F.linear(xg, w, b), (xg, w, b), dy)

    def forward_no_grad():
        with torch.no_grad():
            layer(x)

    def raw():
        backend.dsd(x, data.detach(), layer.bias.detach(), *index)
        backend.dds(dy, data.detach(), *index)
        backend.sdd_with_bias_grad(dy, x, data.detach(), *index)

    stk_step = None
    try:
        import stk
        if args.block == 128:
            stk_step = stk_functions(stk, layer.weight.to_dense().detach(), x, dy)["step"]
    except ImportError:
        pass

    rows = [("launch: x.add_(0)", lambda: x.add_(0)),
            ("engine: Identity + autograd.grad", lambda: torch.autograd.grad(_Identity.apply(xg), xg, dy)),
            ("dense step: F.linear + autograd.grad", dense_step),
            ("ours forward, no_grad", forward_no_grad),
            ("ours forward, with grad", lambda: layer(xg)),
            ("ours step: forward + autograd.grad", step),
            ("ours step through the Python Function", step_python_function),
            ("ours raw: dsd + dds + sdd, no autograd", raw),
            ("_C.dsd", lambda: _C.dsd(x, data.detach(), layer.bias.detach(), *index)),
            ("_C.dds", lambda: _C.dds(dy, data.detach(), *index)),
            ("_C.sdd with bias", lambda: _C.sdd(dy, x, *index, block_shape, True))]
    if stk_step is not None:
        rows.append(("stk step: dds + dds + sdd + sum", stk_step))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; bf16 {args.shape}, block {args.block}, "
          f"density {args.density}; host µs per call, median of {args.rounds} rounds of {args.calls} calls")
    for name, fn in rows:
        print(f"  {name:42s} {host_us(fn, args.calls, args.rounds):8.1f}", flush=True)
    if args.ab_rounds:
        # The device machine's host is noisy (the same row moved 2x between processes): the steps that are
        # compared are timed interleaved, round by round, host time and wall time per step.
        variants = {"ours step, C++ autograd node": step, "ours step, Python Function": step_python_function,
                    "dense step": dense_step}
        if stk_step is not None:
            variants["stk step"] = stk_step
        host = {name: [] for name in variants}
        wall = {name: [] for name in variants}
        for _ in range(args.ab_rounds):
            for name, fn in variants.items():
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                mid = time.perf_counter()
                torch.cuda.synchronize()
                end = time.perf_counter()
                host[name].append((mid - start) * 1e6 / args.calls)
                wall[name].append((end - start) * 1e3 / args.calls)
        print(f"interleaved A/B, {args.ab_rounds} rounds of {args.calls} steps: median host µs per step (p25-p75), "
              f"median wall ms per step")
        for name in variants:
            q = statistics.quantiles(host[name], n=4)
            print(f"  {name:32s} host {statistics.median(host[name]):7.1f} ({q[0]:.0f}-{q[2]:.0f})   wall "
                  f"{statistics.median(wall[name]):.3f}")
    if not args.no_profiler:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.calls):
                step()
            torch.cuda.synchronize()
        print(f"torch.profiler, {args.calls} steps (CPU), by self CPU time:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))


if __name__ == "__main__":
    main()
