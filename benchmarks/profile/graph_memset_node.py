"""What a memset node costs on a CUDA graph's critical path: graphs of N launches of a kernel (a one-element
add, a 2048^3 bf16 matmul), each with and without a memset of 8 bytes before it (cudaMemsetAsync through
ctypes, as the bindings zeroed their kernel counters under capture before session 40), and N memsets alone.
Prints the time per launch (median of 50 replays) for three rounds.

    python benchmarks/profile/graph_memset_node.py
"""
import ctypes
import glob
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_linear import capture_graph, time_ms  # noqa: E402

LAUNCHES = 40


def cudart():
    """libcudart of the installed torch (its nvidia wheel), else the system's."""
    libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "**", "libcudart.so*"),
                     recursive=True)
    return ctypes.CDLL(sorted(libs)[0] if libs else "libcudart.so")


def main():
    runtime = cudart()
    counter = torch.zeros(2, dtype=torch.int32, device="cuda")
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    one = torch.zeros(1, device="cuda")

    def memset():
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        err = runtime.cudaMemsetAsync(ctypes.c_void_p(counter.data_ptr()), 0, ctypes.c_size_t(8), stream)
        assert err == 0, f"cudaMemsetAsync returned {err}"

    cases = {"add": lambda: one.add_(1), "memset + add": lambda: (memset(), one.add_(1)),
             "matmul": lambda: torch.mm(a, b), "memset + matmul": lambda: (memset(), torch.mm(a, b)),
             "memset": memset}
    graphs = {name: capture_graph(fn, LAUNCHES) for name, fn in cases.items()}
    print(f"{torch.cuda.get_device_name()}: us per launch, graphs of {LAUNCHES} launches")
    for _ in range(3):
        print("  " + " | ".join(f"{name} {time_ms(g.replay, 5, 50) * 1000 / LAUNCHES:.2f}"
                                for name, g in graphs.items()))


if __name__ == "__main__":
    main()
