"""Dense F.linear (cuBLAS) against BlockSparseLinear and its peers, side by side on one GPU.

Times y = x Wᵀ + b (forward) and a training step (forward + grad input + grad weight + grad bias) with CUDA
events: median of --reps timings after warm-up. Where STK runs (block 128), its eager forward and step and ours,
and its step and ours replayed from CUDA graphs, are timed alternately in --eager-rounds rounds and each cell
is the median over rounds: at low density the eager steps are bound by the host, whose speed drifts
within a process (benchmarks/profile/eager_noise.py), and the GPU's clock drifts with its power cap
(benchmarks/profile/graph_step_timeline.py). The training step is timed twice: in eager mode ("train", what
a plain training loop sees, host time included) and replayed from a CUDA graph of --graph-steps steps
("train_graph", the GPU time: at low density the eager step is bound by Python and launch time); the forward
likewise ("forward" eager, "forward_graph" replayed from a CUDA graph of --graph-calls calls). Decode shapes
(M = 1, 16) are timed as a CUDA graph of --graph-calls forward calls, reported per call. Peers, when
importable: PyTorch BSR (torch.sparse._triton_ops.bsr_dense_mm, forward only) and STK (stanford-stk, block
128: dds for the forward, dds + dds + sdd for the training step).

speedup = dense time (same dtype, same run) / method time. Each BlockSparseLinear configuration is also checked
against F.linear on its dense weight (max relative error, in the JSON) so that no broken kernel is timed.
These are short runs, each at whatever clock the work before it left; under sustained load every method runs at the
GPU's power cap, and benchmarks/bar_cells.py --settle times the project's bar cells that way (session 45).

    python benchmarks/bench_linear.py --out benchmarks/results            # full grid (a few minutes)
    python benchmarks/bench_linear.py --quick --out /tmp/bench            # one shape, block 64, bf16

Writes bench_linear_<GPU>.json / .md / .png into --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import BlockSparseLinear, BlockSparseMatrix, backend  # noqa: E402

SHAPES = ((8192, 4096, 4096), (16384, 1024, 4096), (6144, 3072, 768))  # (M tokens, in_features, out_features)
DECODE = ((1, 4096, 4096), (16, 4096, 4096))
DENSITIES = (0.1, 0.25, 0.5, 1.0)
BLOCKS = (32, 64, 128)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def time_ms(fn, warmup=5, reps=30):
    """Median of `reps` CUDA-event timings of fn() after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def ab_setup(description, rounds=5, extra=()):
    """The command line shared by the interleaved A/B scripts (--shape, --rounds, --blocks, --densities, and
    `extra` (flag, default) string options), parsed, and the bf16 activations x (M, K) and dy (M, N) they time
    on."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    for flag, default in extra:
        parser.add_argument(flag, default=default)
    parser.add_argument("--shape", default="8192x4096x4096")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--blocks", default="64,128")
    parser.add_argument("--densities", default="0.1,0.25,0.5,1.0")
    args = parser.parse_args()
    args.m, args.k, args.n = (int(v) for v in args.shape.split("x"))
    args.blocks = [int(b) for b in args.blocks.split(",")]
    args.densities = [float(d) for d in args.densities.split(",")]
    x = torch.randn(args.m, args.k, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(args.m, args.n, device="cuda", dtype=torch.bfloat16)
    print(f"{torch.cuda.get_device_name()} bf16 M={args.m} K={args.k} N={args.n}, {args.rounds} rounds")
    return args, x, dy


def interleaved_times(args, block, density, variants_for, timer=time_ms):
    """The rounds of an A/B: each round draws a fresh random bf16 (N, K) pattern `mat`, takes {name: fn} from
    variants_for(mat) and times every fn once (timer, by default time_ms), in an order rotating by round so that
    clock drift hits every variant alike. Returns {name: [ms, one per round]}."""
    times = {}
    for r in range(args.rounds):
        mat = BlockSparseMatrix.randn((args.n, args.k), density=density, block_shape=(block, block),
                                      dtype=torch.bfloat16, device="cuda")
        variants = list(variants_for(mat).items())
        shift = r % len(variants)
        for name, fn in variants[shift:] + variants[:shift]:
            times.setdefault(name, []).append(timer(fn))
    return times


def ratio_report(label, times):
    """One line: each variant's median time and median ratio to the first variant of the same round, and the
    first variant's spread (max / min over rounds)."""
    base = next(iter(times.values()))
    cells = [f"{name} {statistics.median(t):.4f} ms ({statistics.median(a / b for a, b in zip(t, base)):.3f})"
             for name, t in times.items()]
    return f"{label}: " + "  ".join(cells) + f"  spread {max(base) / min(base):.3f}"


def run_for(fn, seconds, sync_every=0):
    """Calls fn() again and again for `seconds` of wall time and returns the number of calls: a method run by itself
    so that the GPU's clock settles on its load. sync_every > 0 waits for the GPU after every that many calls (for
    an fn that only queues work: the host would otherwise queue far more than `seconds` of it)."""
    calls, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()
        calls += 1
        if sync_every > 0 and calls % sync_every == 0:
            torch.cuda.synchronize()
    if sync_every > 0 and calls % sync_every:
        torch.cuda.synchronize()
    return calls


def rounds_ms(timers, rounds, order="rotate", settle_s=0.0):
    """{name: [ms, one per round]}: every timer() called once per round, in an order rotating by round, so that
    drift (the host's speed, the GPU's clock) hits every method alike. order="shuffle" draws each round's order at
    random instead (seeded by the round), so that no method keeps its neighbours. settle_s > 0 first calls the
    timer again and again for that many seconds (results dropped), so that each method is timed at the clock its
    own sustained load leaves: under the power cap a light kernel timed right after a heavy one reads up to 1.2x
    slower (session 45, benchmarks/results/neighbour_effect_*.txt)."""
    if order not in ("rotate", "shuffle"):
        raise ValueError(f"rounds_ms: order={order!r} must be 'rotate' or 'shuffle'")
    if not settle_s >= 0:
        raise ValueError(f"rounds_ms: settle_s={settle_s!r} must be a number of seconds >= 0")
    times = {name: [] for name in timers}
    items = list(timers.items())
    for r in range(rounds):
        if order == "shuffle":
            ordered = random.Random(r).sample(items, len(items))
        else:
            shift = r % len(items)
            ordered = items[shift:] + items[:shift]
        for name, timer in ordered:
            run_for(timer, settle_s)
            times[name].append(timer())
    return times


def eager_rounds_ms(fns, args):
    """{name: ms} for eager (host-bound at low density) timings compared across methods: every fn timed once per
    round (time_ms), in an order rotating by round, for --eager-rounds rounds; the median over rounds. On the
    H100 machine's host the same eager step measured 0.24-0.38 ms (ours) and 0.35-0.63 ms (STK) in successive
    single time_ms calls of one process (benchmarks/results/eager_noise_*.txt), so one-shot cells taken minutes
    apart compare the host's moods, not the methods."""
    timers = {name: (lambda fn=fn: time_ms(fn, args.warmup, args.reps)) for name, fn in fns.items()}
    return {name: statistics.median(t) for name, t in rounds_ms(timers, args.eager_rounds).items()}


def stk_functions(stk, dense_masked, x, dy):
    """STK's forward (dds with the transposed sparse weight) and training step (dds + dds + sdd + the bias sum),
    and its forward's relative error against F.linear."""
    sw = stk.ops.to_sparse(dense_masked, blocking=128)
    swt, dyt = sw.t(), dy.t()

    def step():
        stk.ops.dds(x, swt)
        stk.ops.dds(dy, sw)
        stk.ops.sdd(dyt, x, sw)
        dy.sum(0)

    return dict(forward=lambda: stk.ops.dds(x, swt), step=step,
                rel_err=rel_err(stk.ops.dds(x, swt), F.linear(x, dense_masked)))


def bar_methods(args, x, dy, stk):
    """The methods of the bar cells (bar_cells.py, profile/energy_per_call.py) on the activations x (M, K) and
    gradients dy (M, N) of ab_setup: {name: forward} and {name: training step} of dense F.linear ("dense"),
    BlockSparseLinear for each of args.blocks x args.densities ("b{block} d={density}") and, for blocks of 128 when
    `stk` (try_import_stk) is not None, STK on the same pattern ("stk d={density}"); and the (numerator,
    denominator) pairs of the ratios to report, dense or STK over ours."""
    xg = x.clone().requires_grad_(True)
    w = (torch.randn(args.n, args.k, device="cuda", dtype=torch.bfloat16) / args.k ** 0.5).requires_grad_(True)
    b = torch.zeros(args.n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    forwards = {"dense": lambda: F.linear(x, w, b)}
    steps = {"dense": lambda: torch.autograd.grad(F.linear(xg, w, b), (xg, w, b), dy)}
    pairs = []
    for block in args.blocks:
        for density in args.densities:
            layer = BlockSparseLinear(args.k, args.n, density=density, block_shape=(block, block), device="cuda",
                                      dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1))
            name = f"b{block} d={density}"
            forwards[name] = lambda layer=layer: layer(x)
            steps[name] = lambda layer=layer: torch.autograd.grad(layer(xg), (xg, layer.weight.data, layer.bias), dy)
            pairs.append(("dense", name))
            if stk is not None and block == 128:
                peer = stk_functions(stk, layer.weight.to_dense().detach(), x, dy)
                forwards[f"stk d={density}"], steps[f"stk d={density}"] = peer["forward"], peer["step"]
                pairs.append((f"stk d={density}", name))
    return forwards, steps, pairs


def capture_graph(fn, calls):
    """fn() `calls` times in one CUDA graph, captured after 3 warm-up calls on the capture stream."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # Capture on the warmed stream: cuBLAS keeps a workspace per stream, and one first asked for during
    # capture may change what dense runs (dense was measured slower in graphs than eager; session 5).
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    return graph


def time_graph_ms(fn, calls, reps, settle_s=0.0):
    """Per-call time of fn() replayed `calls` times inside one CUDA graph (replayed first for settle_s seconds)."""
    graph = capture_graph(fn, calls)
    run_for(graph.replay, settle_s, sync_every=10)
    return time_ms(graph.replay, 3, reps) / calls


def with_knobs(fn, knobs):
    """fn() with each (setter, value) of `knobs` set for the call and restored after it (_ops.forced_knobs): the
    extension's path knobs act when a call is made or captured, so an A/B can interleave paths, eagerly or as CUDA
    graphs captured under them."""
    from pytorch_block_sparse_ng import _ops  # needs the built extension, unlike the rest of this module

    def call():
        with _ops.forced_knobs(*knobs):
            return fn()

    return call


def graph_timers(fns, calls, reps):
    """{name: timer}: each fn captured once in a CUDA graph of `calls` calls; the timer returns the per-call time
    of its graph's replay (median of `reps`)."""
    graphs = {name: capture_graph(fn, calls) for name, fn in fns.items()}
    return {name: (lambda graph=graph: time_ms(graph.replay, 3, reps) / calls) for name, graph in graphs.items()}


def graph_rounds_ms(fns, calls, args):
    """eager_rounds_ms for CUDA graphs of `calls` calls each (per call). The GPU's clock drifts with its power cap
    (on the H100 1.26-1.98 GHz within a second of sustained load, benchmarks/results/graph_step_timeline_*.txt),
    so graph cells compared across methods are timed alternately too."""
    times = rounds_ms(graph_timers(fns, calls, args.reps), args.eager_rounds)
    return {name: statistics.median(t) for name, t in times.items()}


def rel_err(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def try_import_stk():
    try:
        import stk  # noqa: F401

        return stk
    except Exception as error:  # noqa: BLE001 - any failure means "not available"
        print(f"[bench] STK not importable: {error}")
        return None


def bsr_forward(weight_dense, block):
    from torch.sparse._triton_ops import bsr_dense_mm

    bsr = weight_dense.to_sparse_bsr((block, block))
    return lambda x: bsr_dense_mm(bsr, x.t())  # (N, M) = W xᵀ


def run(args):
    device = torch.device("cuda")
    gpu = torch.cuda.get_device_name(device)
    assert backend.kernels_available(), "the CUDA extension is not built: pip install --no-build-isolation -e ."
    from pytorch_block_sparse_ng import _C, _ops

    stk = try_import_stk() if not args.no_peers else None
    records = []

    def record(**kw):
        records.append(kw)
        fields = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in kw.items())
        print(fields, flush=True)

    shapes = [s for s in SHAPES if s in args.shapes] + [s for s in DECODE if s in args.shapes]
    for dtype_name in args.dtypes:
        dtype = DTYPES[dtype_name]
        for (m, k, n) in shapes:
            decode = m <= 16
            gen = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(m, k, device=device, dtype=dtype, generator=gen)
            dy = torch.randn(m, n, device=device, dtype=dtype, generator=gen)
            w = (torch.randn(n, k, device=device, dtype=dtype, generator=gen) / k ** 0.5).requires_grad_(True)
            b = torch.zeros(n, device=device, dtype=dtype, requires_grad=True)
            xg = x.clone().requires_grad_(True)
            common = dict(gpu=gpu, dtype=dtype_name, m=m, k=k, n=n)

            def timed(fn):
                if decode:
                    return time_graph_ms(fn, args.graph_calls, args.reps)
                return time_ms(fn, args.warmup, args.reps)

            with torch.no_grad():
                dense_fwd = timed(lambda: F.linear(x, w, b))
            record(**common, method="dense", block=0, density=1.0, phase="forward", ms=dense_fwd, speedup=1.0)
            dense_train = None
            if not decode:
                with torch.no_grad():
                    dense_fwd_graph = time_graph_ms(lambda: F.linear(x, w, b), args.graph_calls, args.reps)
                record(**common, method="dense", block=0, density=1.0, phase="forward_graph", ms=dense_fwd_graph,
                       speedup=1.0)
                def dense_step():
                    y = F.linear(xg, w, b)
                    torch.autograd.grad(y, (xg, w, b), dy)

                dense_train = timed(dense_step)
                record(**common, method="dense", block=0, density=1.0, phase="train", ms=dense_train, speedup=1.0)
                dense_graph = time_graph_ms(dense_step, args.graph_steps, args.reps)
                record(**common, method="dense", block=0, density=1.0, phase="train_graph", ms=dense_graph,
                       speedup=1.0)

            for block in args.blocks:
                for density in args.densities:
                    layer = BlockSparseLinear(k, n, density=density, block_shape=(block, block), device=device,
                                              dtype=dtype, generator=torch.Generator().manual_seed(1))
                    with torch.no_grad():
                        err = rel_err(layer(x), F.linear(x, layer.weight.to_dense(), layer.bias))
                    dense_masked = layer.weight.to_dense().detach()
                    params = (xg, layer.weight.data, layer.bias)

                    def step():
                        y = layer(xg)
                        torch.autograd.grad(y, params, dy)

                    # STK (block 128): its eager cells and ours are timed alternately in rounds (below)
                    peer = None
                    if stk is not None and block == 128 and not decode and not args.no_peers:
                        try:
                            peer = stk_functions(stk, dense_masked, x, dy)
                        except Exception as error:  # noqa: BLE001
                            record(**common, method="stk", block=128, density=density, phase="forward",
                                   error=f"{type(error).__name__}: {str(error)[:120]}")
                    if peer is None:
                        with torch.no_grad():
                            fwd = timed(lambda: layer(x))
                        train = None if decode else timed(step)
                    else:
                        with torch.no_grad():
                            fwds = eager_rounds_ms({"ours": lambda: layer(x), "stk": peer["forward"]}, args)
                        steps = eager_rounds_ms({"ours": step, "stk": peer["step"]}, args)
                        fwd, train = fwds["ours"], steps["ours"]
                        record(**common, method="stk", block=128, density=density, phase="forward", ms=fwds["stk"],
                               speedup=dense_fwd / fwds["stk"], rel_err=peer["rel_err"], rounds=args.eager_rounds)
                        record(**common, method="stk", block=128, density=density, phase="train", ms=steps["stk"],
                               speedup=dense_train / steps["stk"], rounds=args.eager_rounds)
                    hopper = _C.uses_hopper_kernels(torch.cuda.current_device(), block)
                    record(**common, method="ours", block=block, density=density, phase="forward", ms=fwd,
                           speedup=dense_fwd / fwd, rel_err=err, dsd_path="sm90" if hopper else "sm80",
                           rounds=args.eager_rounds if peer else 1)
                    if hopper:  # the SM80 (mma.sync) forward too, for comparison
                        with torch.no_grad(), _ops.forced_knobs((_ops.set_hopper_kernels, False)):
                            fwd80 = timed(lambda: layer(x))
                        record(**common, method="ours_sm80", block=block, density=density, phase="forward",
                               ms=fwd80, speedup=dense_fwd / fwd80)
                    if not decode:
                        with torch.no_grad():
                            fwd_graph = time_graph_ms(lambda: layer(x), args.graph_calls, args.reps)
                        record(**common, method="ours", block=block, density=density, phase="forward_graph",
                               ms=fwd_graph, speedup=dense_fwd_graph / fwd_graph)
                        record(**common, method="ours", block=block, density=density, phase="train", ms=train,
                               speedup=dense_train / train, rounds=args.eager_rounds if peer else 1)
                        graph_steps = None
                        if peer is not None:  # ours and STK alternately, as the eager cells
                            try:
                                graph_steps = graph_rounds_ms({"ours": step, "stk": peer["step"]},
                                                              args.graph_steps, args)
                            except Exception as error:  # noqa: BLE001 - a peer that cannot be captured: an error cell
                                record(**common, method="stk", block=128, density=density, phase="train_graph",
                                       error=f"{type(error).__name__}: {str(error)[:120]}")
                        train_graph = (graph_steps["ours"] if graph_steps is not None
                                       else time_graph_ms(step, args.graph_steps, args.reps))
                        record(**common, method="ours", block=block, density=density, phase="train_graph",
                               ms=train_graph, speedup=dense_graph / train_graph,
                               rounds=args.eager_rounds if graph_steps is not None else 1)
                        if graph_steps is not None:
                            record(**common, method="stk", block=128, density=density, phase="train_graph",
                                   ms=graph_steps["stk"], speedup=dense_graph / graph_steps["stk"],
                                   rounds=args.eager_rounds)
                    del layer, step, params
                    if args.no_peers or decode:
                        continue
                    if density < 1.0 or block == 128:
                        try:
                            mm = bsr_forward(dense_masked, block)
                            t = timed(lambda: mm(x))
                            record(**common, method="torch_bsr", block=block, density=density, phase="forward", ms=t,
                                   speedup=dense_fwd / t, rel_err=rel_err(mm(x).t(), F.linear(x, dense_masked)))
                        except Exception as error:  # noqa: BLE001
                            record(**common, method="torch_bsr", block=block, density=density, phase="forward",
                                   error=f"{type(error).__name__}: {str(error)[:120]}")
            peer = None  # its closures hold x and dy
            del x, dy, w, b, xg
            torch.cuda.empty_cache()
    return gpu, records


def markdown(gpu, records, args):
    lines = [f"# BlockSparseLinear vs dense on {gpu}", "",
             f"torch {torch.__version__}, CUDA {torch.version.cuda}; median of {args.reps} CUDA-event timings; "
             f"decode shapes per call inside a CUDA graph of {args.graph_calls} calls; forward_graph: the forward "
             f"replayed from a CUDA graph of {args.graph_calls} calls; train_graph: the training "
             f"step replayed from a CUDA graph of {args.graph_steps} steps (GPU time, no host overhead); block 128 "
             f"forward, train and train_graph cells of ours and STK: median of {args.eager_rounds} rounds that time "
             "the two alternately (eager steps at low density are host-bound and the host's speed drifts; the GPU's "
             "clock drifts with its power cap). Cells: "
             "speedup over dense F.linear in the same dtype (time in ms).", ""]
    keys = sorted({(r["dtype"], r["m"], r["k"], r["n"]) for r in records}, key=lambda t: (t[0], -t[1] * t[2] * t[3]))
    for dtype, m, k, n in keys:
        rows = [r for r in records if (r["dtype"], r["m"], r["k"], r["n"]) == (dtype, m, k, n)]
        dense = {r["phase"]: r["ms"] for r in rows if r["method"] == "dense"}
        lines += [f"## {dtype}, M={m}, in={k}, out={n}  (dense forward {dense.get('forward', float('nan')):.4f} ms"
                  + (f", training step {dense['train']:.4f} ms, in a CUDA graph {dense['train_graph']:.4f} ms)"
                     if "train" in dense else ")"), "",
                  "| method | phase | block | " + " | ".join(f"d={d}" for d in args.densities) + " |",
                  "|---|---|---|" + "---|" * len(args.densities)]
        combos = sorted({(r["method"], r["phase"], r["block"]) for r in rows if r["method"] != "dense"},
                        key=lambda c: (not c[0].startswith("ours"), c[0], c[1], c[2]))
        for method, phase, block in combos:
            cells = []
            for d in args.densities:
                hit = [r for r in rows if (r["method"], r["phase"], r["block"], r["density"]) == (method, phase, block, d)]
                if not hit:
                    cells.append("")
                elif "error" in hit[0]:
                    cells.append("error")
                else:
                    cells.append(f"{hit[0]['speedup']:.2f}x ({hit[0]['ms']:.3f})")
            lines.append(f"| {method} | {phase} | {block} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(gpu, records, path, args):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench] matplotlib not importable: no plot")
        return False
    keys = sorted({(r["m"], r["k"], r["n"]) for r in records if r["dtype"] == args.dtypes[0]},
                  key=lambda t: -t[0] * t[1] * t[2])
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, (m, k, n) in zip(axes[0], keys):
        rows = [r for r in records if (r["m"], r["k"], r["n"], r["dtype"]) == (m, k, n, args.dtypes[0])
                and "speedup" in r and r["method"] != "dense"]
        series = sorted({(r["method"], r["block"]) for r in rows})
        colors = {key: plt.cm.tab10(i % 10) for i, key in enumerate(series)}
        for method, phase, block in sorted({(r["method"], r["phase"], r["block"]) for r in rows}):
            pts = sorted((r["density"], r["speedup"]) for r in rows
                         if (r["method"], r["phase"], r["block"]) == (method, phase, block))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o" if phase == "forward" else "s",
                    color=colors[(method, block)],
                    linestyle={"forward": "-", "train": "--"}.get(phase, ":"),
                    label=f"{method} {phase} b{block}")
        ax.axhline(1.0, color="k", linewidth=0.8)
        ax.set_title(f"M={m}, {k}->{n}, {args.dtypes[0]}")
        ax.set_xlabel("density (fraction of blocks kept)")
        ax.set_ylabel("speedup over dense F.linear")
        ax.legend(fontsize=6)
    fig.suptitle(gpu)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    parser.add_argument("--quick", action="store_true", help="one shape (8192, 4096, 4096), block 64, bf16")
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--blocks", default=",".join(map(str, BLOCKS)))
    parser.add_argument("--densities", default=",".join(map(str, DENSITIES)))
    parser.add_argument("--shapes", default=None, help="e.g. 8192x4096x4096,1x4096x4096 (M x in x out)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--graph-calls", type=int, default=20)
    parser.add_argument("--graph-steps", type=int, default=4, help="training steps per CUDA graph (train_graph)")
    parser.add_argument("--eager-rounds", type=int, default=5,
                        help="rounds in which ours and STK's eager cells (block 128) are timed alternately")
    parser.add_argument("--no-peers", action="store_true", help="skip PyTorch BSR and STK")
    args = parser.parse_args(argv)
    args.dtypes = args.dtypes.split(",")
    args.blocks = [int(b) for b in args.blocks.split(",")]
    args.densities = [float(d) for d in args.densities.split(",")]
    if args.shapes:
        args.shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    else:
        args.shapes = list(SHAPES) + list(DECODE)
    if args.quick:
        args.dtypes, args.blocks, args.shapes = ["bf16"], [64], [(8192, 4096, 4096), (1, 4096, 4096)]
        args.densities, args.reps = [0.1, 0.25, 0.5, 1.0], 15
    if not torch.cuda.is_available():
        sys.exit("bench_linear.py needs a CUDA GPU")
    started = time.time()
    gpu, records = run(args)
    name = re.sub(r"[^A-Za-z0-9]+", "_", gpu).strip("_")
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"bench_linear_{name}")
    meta = dict(gpu=gpu, torch=torch.__version__, cuda=torch.version.cuda, reps=args.reps, eager_rounds=args.eager_rounds,
                graph_calls=args.graph_calls, graph_steps=args.graph_steps,
                seconds=round(time.time() - started, 1), quick=args.quick)
    with open(base + ".json", "w") as handle:
        json.dump(dict(meta=meta, records=records), handle, indent=1)
    text = markdown(gpu, records, args)
    with open(base + ".md", "w") as handle:
        handle.write(text + "\n")
    plot(gpu, records, base + ".png", args)
    print(text)


if __name__ == "__main__":
    main()
