"""Energy per call under sustained load: for dense F.linear (cuBLAS), BlockSparseLinear (blocks of 64 and 128)
and STK when installed, the forward (a CUDA graph of 20 calls) and the training step (a graph of 4 steps), each
replayed back to back for --seconds: the time per call, the board's mean power and SM clock over the window, and
the energy per call (from NVML's energy counter, through nvidia-ml-py: `pip install nvidia-ml-py`, NVIDIA's NVML
bindings, needed by this script only).

    python benchmarks/profile/energy_per_call.py [--shape 8192x4096x4096] [--blocks 64,128]
        [--densities 0.1,0.25,0.5,1.0] [--seconds 1.5] [--settle 0.5]

Why (session 45): bar_cells.py --settle, which times each method at the clock of its own sustained load, put ours /
STK at blocks of 128 at 1.33-1.47 in graphs, where burst timings had read ~1.5. Under a power cap a method's
sustained time is its energy per call over the capped power, so this prints both: which methods run at the cap, and
how much energy per call ours would have to shed for a ratio. Each window follows --settle seconds of the same
replays (not measured), so every method starts from its own steady clock. Keep windows of a second or more: NVML's
power readings lag, and a 0.5 s window read 826 W from the energy counter against 401 W sampled for dense's step.

With benchmarks/profile/energy_skip_loads.patch applied (an experiment build, wrong results on purpose;
PBSNG_EXPERIMENT_SKIP=1 / 2 / 4 / 8 skips or fixes some of the block-128 dsd's loads, see the patch) it measured
what the bytes from L2 cost at the cap (session 45, benchmarks/results/energy_skip_loads_NVIDIA_H200.txt).
"""
import os
import statistics
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_linear import ab_setup, bar_methods, capture_graph, run_for, try_import_stk  # noqa: E402

try:
    import pynvml
except ImportError as error:
    raise SystemExit(f"energy_per_call.py reads NVML through nvidia-ml-py ({error}): pip install nvidia-ml-py")


class ClockSampler:
    """SM clock (MHz) and power (W) read from NVML every `period_s` in a background thread while in the block."""

    def __init__(self, handle, period_s=0.01):
        self.handle, self.period_s, self.samples = handle, period_s, []

    def __enter__(self):
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def run(self):
        while not self.stop.is_set():
            self.samples.append((pynvml.nvmlDeviceGetClockInfo(self.handle, pynvml.NVML_CLOCK_SM),
                                 pynvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0))
            time.sleep(self.period_s)

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def measure(handle, graph, calls, seconds, settle):
    """(ms per call, mean W, mean SM MHz, mean sampled W, mJ per call) over `seconds` of back-to-back replays."""
    run_for(graph.replay, settle, sync_every=10)
    with ClockSampler(handle) as sampler:
        energy0, t0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle), time.perf_counter()
        replays = run_for(graph.replay, seconds, sync_every=10)
        energy1, t1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle), time.perf_counter()
    n = replays * calls
    clocks = [c for c, _ in sampler.samples]
    watts = [w for _, w in sampler.samples]
    return ((t1 - t0) * 1e3 / n, (energy1 - energy0) / 1e3 / (t1 - t0), statistics.mean(clocks),
            statistics.mean(watts), (energy1 - energy0) / n)


def main():
    args, x, dy = ab_setup(__doc__, rounds=1, extra=(("--seconds", "1.5"), ("--settle", "0.5")))
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    limit = pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
    print(f"power limit {limit:.0f} W; each method replayed for {args.seconds} s after {args.settle} s of the same")
    forwards, steps, _ = bar_methods(args, x, dy, try_import_stk())
    for label, fns, calls in (("forward, graph of 20 calls", forwards, 20), ("training step, graph of 4", steps, 4)):
        print(f"{label}: ms per call | W (energy counter) | SM MHz | W (sampled) | mJ per call", flush=True)
        with torch.no_grad() if fns is forwards else torch.enable_grad():
            graphs = {name: capture_graph(fn, calls) for name, fn in fns.items()}
        for name, graph in graphs.items():
            ms, watts, mhz, sampled, mj = measure(handle, graph, calls, float(args.seconds), float(args.settle))
            print(f"  {name:12s} {ms:.4f} | {watts:5.0f} | {mhz:5.0f} | {sampled:5.0f} | {mj:.2f}", flush=True)
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
