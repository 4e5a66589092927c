"""A/B timing of a kernel experiment switched by an environment variable, interleaved so that clock drift hits
every variant alike.

    python benchmarks/ab_experiment.py --variants new=,old=PBSNG_EXPERIMENT_X=1 [--ops dsd,dds,sdd,backward]
        [--rounds 5] [--shape 8192x4096x4096] [--blocks 64,128] [--densities 0.1,0.25,0.5,1.0]
    python benchmarks/ab_experiment.py --variants three=set_hopper_pipeline_stages=3,four=set_hopper_pipeline_stages=4
    python benchmarks/ab_experiment.py --variants new=,old=build=/tmp/old/pytorch_block_sparse_ng/_C.so+bias=1

For experiment builds: main reads no PBSNG_EXPERIMENT_* variable. An experiment adds one, read by the host
launcher at every launch (std::getenv, then a kernel parameter), so one process times all variants; the
results of past experiments are in benchmarks/results/ab_*.txt with the variants they compared. The second
example compares settings of a tuning knob of _C instead.
--variants: name=VAR=value[+VAR=value...] per variant, comma separated (an empty setting keeps the defaults;
a VAR named set_* is the _C knob of that name, called with the value; build=PATH times the _C extension of another
build, loaded beside this one, e.g. a checkout of an older commit built in place, so that two builds are compared
in one process; bias=1 passes a bias to the dsd, as the layer does, and bias=0 runs the sdd without the bias
gradient; pairs=greedy gives the kernels the greedy line pairs, layout.pair_order(..., max_matched_rows=0), instead
of the pattern's row_order / col_order). The first variant is the reference of the ratios. Each round draws a fresh
random pattern and times every variant once (median of 30 CUDA-event timings) in a rotating order; the table gives
the median over rounds of each variant's time, its ratio to the first variant of the same round, and the first
variant's spread.
The sdd runs with the bias gradient (what the layer's backward calls) unless bias=0; the op "backward" is the
layer's whole backward (dx, dW_b and the bias gradient: the dds on a second stream beside the sdd, as in training).
--graph-calls N times each variant per call in a CUDA graph of N calls instead (short kernels, whose eager timing
would include the host's launch time).
--settle S (session 45) runs each variant by itself for S seconds (its graph replayed, or its eager calls) before
its timing: under sustained load the GPU runs at its power cap, and a variant that does the same work with less
energy is faster there, which short runs at whatever clock the previous variant left do not show
(benchmarks/results/energy_per_call_*.txt).
"""

import importlib.util
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from pytorch_block_sparse_ng import _C  # noqa: E402
from pytorch_block_sparse_ng.layout import pair_order, tile_lines  # noqa: E402

from bench_linear import ab_setup, interleaved_times, ratio_report, run_for, time_graph_ms, time_ms  # noqa: E402


def parse_variants(text):
    variants = {}
    for item in text.split(","):
        name, _, settings = item.partition("=")
        env = dict(setting.split("=", 1) for setting in settings.split("+") if setting)
        variants[name] = env
    return variants


def load_build(path):
    """The _C extension module of another build (path to its .so), under a module name of its own (the init
    symbol comes from the name's last part, _C); its kernels and knobs are separate from this build's."""
    spec = importlib.util.spec_from_file_location(f"pbsng_build_{abs(hash(path))}._C", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_env(env, fn, ext=_C):
    """fn run with the variant's settings: environment variables, and knobs of _C named set_* (called with the
    integer value, the previous value restored afterwards)."""
    knobs = {key: int(value) for key, value in env.items() if key.startswith("set_")}
    variables = {key: value for key, value in env.items()
                 if key not in knobs and key not in ("build", "bias", "pairs")}

    def run():
        saved = {key: os.environ.get(key) for key in variables}
        os.environ.update(variables)
        saved_knobs = {key: getattr(ext, key)(value) for key, value in knobs.items()}
        try:
            fn()
        finally:
            for key, value in saved_knobs.items():
                getattr(ext, key)(value)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return run


def main():
    extra = [("--variants", "default="), ("--ops", "dsd,dds,sdd"), ("--graph-calls", "0"), ("--settle", "0")]
    args, x, dy = ab_setup(__doc__, rounds=5, extra=extra)
    settings = parse_variants(args.variants)
    print("variants: " + "; ".join(f"{name}: {env or 'defaults'}" for name, env in settings.items()))
    builds = {env["build"]: load_build(env["build"]) for env in settings.values() if "build" in env}
    bias = torch.randn(args.n, device="cuda", dtype=torch.bfloat16)
    calls = int(args.graph_calls)
    settle = float(args.settle)

    def timer(fn):
        if calls > 0:
            return time_graph_ms(fn, calls, 30, settle)
        run_for(fn, settle, sync_every=10)
        return time_ms(fn)
    for block in args.blocks:
        for density in args.densities:
            for op in args.ops.split(","):
                def variants(mat):
                    data, index, shape = mat.data.detach(), mat.indices(), [block, block]
                    greedy = index  # INDEX_NAMES, then row_order and col_order
                    if tile_lines((block, block)) == 2:
                        mask = mat.block_mask()
                        greedy = index[:-2] + tuple(pair_order(m, max_matched_rows=0).to(mask.device)
                                                    for m in (mask, mask.T))

                    def run_of(ext, env):
                        b = bias if env.get("bias") == "1" else None
                        idx = greedy if env.get("pairs") == "greedy" else index
                        return {"dsd": lambda: ext.dsd(x, data, b, *idx),
                                "dds": lambda: ext.dds(dy, data, *idx),
                                "sdd": lambda: ext.sdd(dy, x, *idx, shape, env.get("bias") != "0"),
                                "backward": lambda: ext.linear_backward(dy, x, data, list(idx), True, True, True)}[op]
                    exts = {name: builds[env["build"]] if "build" in env else _C for name, env in settings.items()}
                    return {name: with_env(env, run_of(exts[name], env), exts[name]) for name, env in settings.items()}

                times = interleaved_times(args, block, density, variants, timer)
                print(ratio_report(f"block {block:3d} density {density:4.2f} {op}", times), flush=True)


if __name__ == "__main__":
    main()
