"""What a memset node costs on a CUDA graph's critical path: graphs of N launches of a kernel (a one-element
add, a 2048^3 bf16 matmul), each with and without a memset of 8 bytes before it (cudaMemsetAsync through
ctypes, as the bindings zeroed their kernel counters under capture before session 40), and N memsets alone.
Prints the time per launch (median of 50 replays) for three rounds.

    python benchmarks/profile/graph_memset_node.py
"""
import ctypes
import glob
import os
import statistics

import torch

LAUNCHES = 40


def cudart():
    """libcudart of the installed torch (its nvidia wheel), else the system's."""
    libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "**", "libcudart.so*"),
                     recursive=True)
    return ctypes.CDLL(sorted(libs)[0] if libs else "libcudart.so")


def capture(fn, launches):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the capture (cuBLAS workspaces)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(launches):
            fn()
    return graph


def replay_us(graph, reps=50):
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) * 1000


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
    graphs = {name: capture(fn, LAUNCHES) for name, fn in cases.items()}
    print(f"{torch.cuda.get_device_name()}: us per launch, graphs of {LAUNCHES} launches")
    for _ in range(3):
        print("  " + " | ".join(f"{name} {replay_us(g) / LAUNCHES:.2f}" for name, g in graphs.items()))


if __name__ == "__main__":
    main()
