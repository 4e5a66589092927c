"""Host time of BlockSparseLinear's eager forward, layer by layer down to the binding, against dense F.linear: where
the ~40 us per call go that bound the eager forward of small products (bench_linear: 6144 x 3072 -> 768 with
blocks of 64 took 0.040 ms eagerly against 0.015 in a CUDA graph).

    python benchmarks/profile/layer_host_time.py [--shape 6144x3072x768] [--density 0.5]

Each row: host time per call (200 calls without a synchronisation, few enough that the launch queue never
fills; binding_host_time.host_and_wall_us), then a cProfile of the layer's no-grad forward by own time.
"""
import argparse
import cProfile
import os
import pstats
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from pytorch_block_sparse_ng import BlockSparseLinear, _C, _ops, backend  # noqa: E402
from pytorch_block_sparse_ng.functional import block_sparse_linear  # noqa: E402

from binding_host_time import per_call_us  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="6144x3072x768", help="M x in x out")
    parser.add_argument("--density", type=float, default=0.5)
    args = parser.parse_args()
    m, k, n = (int(v) for v in args.shape.split("x"))
    dtype = torch.bfloat16
    x = torch.randn(m, k, device="cuda", dtype=dtype)
    dense = torch.nn.Linear(k, n, device="cuda", dtype=dtype)
    print(f"{torch.cuda.get_device_name()} bf16 M={m} {k} -> {n}, density {args.density}; host us per call")
    with torch.no_grad():
        print(f"  {'F.linear (dense)':44s} {per_call_us(lambda: F.linear(x, dense.weight, dense.bias)):7.1f}")
        print(f"  {'dense nn.Linear module':44s} {per_call_us(lambda: dense(x)):7.1f}")
        print(f"  {'torch.empty(M, N)':44s} {per_call_us(lambda: torch.empty(m, n, device='cuda', dtype=dtype)):7.1f}")
        print(f"  {'x.add_(0) (one launch)':44s} {per_call_us(lambda: x.add_(0)):7.1f}")
    for block in (32, 64, 128):
        layer = BlockSparseLinear(k, n, density=args.density, block_shape=(block, block), device="cuda", dtype=dtype)
        w, b = layer.weight, layer.bias
        data, index = w.data.detach(), w.indices()
        bd = b.detach()
        print(f" block {block}:")
        with torch.no_grad():
            rows = [("layer(x), no grad", lambda: layer(x)),
                    ("layer.forward(x), no grad (no module hooks)", lambda: layer.forward(x)),
                    ("block_sparse_linear, no grad", lambda: block_sparse_linear(x, w, b)),
                    ("backend.dsd", lambda: backend.dsd(x, data, bd, *index)),
                    ("_ops.dsd", lambda: _ops.dsd(x, data, bd, *index)),
                    ("_C.dsd", lambda: _C.dsd(x, data, bd, *index)),
                    ("_C.dsd, no bias", lambda: _C.dsd(x, data, None, *index)),
                    ("backend._kernels_for", lambda: backend._kernels_for(x, data)),
                    ("_ops.supports", lambda: _ops.supports(x, data)),
                    ("layer.weight.indices()", lambda: w.indices())]
            for name, fn in rows:
                print(f"  {name:44s} {per_call_us(fn):7.1f}", flush=True)
            with _ops.forced_knobs((_C.set_hopper_kernels, False)):
                print(f"  {'_C.dsd on the SM80 kernels':44s} {per_call_us(lambda: _C.dsd(x, data, bd, *index)):7.1f}")
        print(f"  {'layer(x) with grad (C++ autograd node)':44s} {per_call_us(lambda: layer(x)):7.1f}")
        if block == 64:
            profile = cProfile.Profile()
            with torch.no_grad():
                profile.enable()
                for _ in range(1000):
                    layer(x)
                profile.disable()
            torch.cuda.synchronize()
            print("  cProfile of 1000 no-grad calls of layer(x), by own time:")
            stats = pstats.Stats(profile)
            stats.sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
