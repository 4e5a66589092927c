"""A/B timing of a kernel experiment switched by an environment variable, interleaved so that clock drift hits
every variant alike.

    python benchmarks/ab_experiment.py --variants new=,old=PBSNG_EXPERIMENT_X=1 [--ops dsd,dds,sdd]
        [--rounds 5] [--shape 8192x4096x4096] [--blocks 64,128] [--densities 0.1,0.25,0.5,1.0]
    python benchmarks/ab_experiment.py --variants three=set_hopper_pipeline_stages=3,four=set_hopper_pipeline_stages=4

For experiment builds: main reads no PBSNG_EXPERIMENT_* variable. An experiment adds one, read by the host
launcher at every launch (std::getenv, then a kernel parameter), so one process times all variants; the
results of past experiments are in benchmarks/results/ab_*.txt with the variants they compared. The second
example compares settings of a tuning knob of _C instead.
--variants: name=VAR=value[+VAR=value...] per variant, comma separated (an empty setting keeps the defaults;
a VAR named set_* is the _C knob of that name, called with the value). The first variant is the reference of
the ratios. Each round draws a fresh random pattern and times every variant
once (median of 30 CUDA-event timings) in a rotating order; the table gives the median over rounds of each
variant's time, its ratio to the first variant of the same round, and the first variant's spread.
The sdd runs with the bias gradient (what the layer's backward calls).
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytorch_block_sparse_ng import _C  # noqa: E402

from bench_linear import ab_setup, interleaved_times, ratio_report  # noqa: E402


def parse_variants(text):
    variants = {}
    for item in text.split(","):
        name, _, settings = item.partition("=")
        env = dict(setting.split("=", 1) for setting in settings.split("+") if setting)
        variants[name] = env
    return variants


def with_env(env, fn):
    """fn run with the variant's settings: environment variables, and knobs of _C named set_* (called with the
    integer value, the previous value restored afterwards)."""
    knobs = {key: int(value) for key, value in env.items() if key.startswith("set_")}
    variables = {key: value for key, value in env.items() if key not in knobs}

    def run():
        saved = {key: os.environ.get(key) for key in variables}
        os.environ.update(variables)
        saved_knobs = {key: getattr(_C, key)(value) for key, value in knobs.items()}
        try:
            fn()
        finally:
            for key, value in saved_knobs.items():
                getattr(_C, key)(value)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
    return run


def main():
    extra = [("--variants", "default="), ("--ops", "dsd,dds,sdd")]
    args, x, dy = ab_setup(__doc__, rounds=5, extra=extra)
    settings = parse_variants(args.variants)
    print("variants: " + "; ".join(f"{name}: {env or 'defaults'}" for name, env in settings.items()))
    for block in args.blocks:
        for density in args.densities:
            for op in args.ops.split(","):
                def variants(mat):
                    data, index, shape = mat.data.detach(), mat.indices(), [block, block]
                    run = {"dsd": lambda: _C.dsd(x, data, None, *index),
                           "dds": lambda: _C.dds(dy, data, *index),
                           "sdd": lambda: _C.sdd(dy, x, *index, shape, True)}[op]
                    return {name: with_env(env, run) for name, env in settings.items()}

                times = interleaved_times(args, block, density, variants)
                print(ratio_report(f"block {block:3d} density {density:4.2f} {op}", times), flush=True)


if __name__ == "__main__":
    main()
