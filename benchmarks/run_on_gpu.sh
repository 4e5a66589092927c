#!/usr/bin/env bash
# Build the extension, run the GPU tests and the benchmarks on a CUDA machine; results go to $1 (default
# /tmp/pbsng_gpu_run; copy what is worth keeping into benchmarks/results/). Made for one device-tool call:
# builds in place with no registry (torch, pybind11, ninja present; CUTLASS headers from a carried
# nvidia-cutlass wheel on PYTHONPATH, see ../shared/DEVICE.md).
#   bash benchmarks/run_on_gpu.sh OUT_DIR [--memcheck] [--no-tests] [--no-bench]
set -u
out=${1:-/tmp/pbsng_gpu_run}
shift || true
mkdir -p "$out"
rm -f "$out/tests.log"
MAX_JOBS=${MAX_JOBS:-16} python3 -m pip install --no-build-isolation --no-deps -e . > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
# The device tool brings back at most 8 files: the GPU's description heads the test log.
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > "$out/tests.log"
case " $* " in
  *" --no-bench "*) ;;
  *) python3 benchmarks/bench_ops.py --blocks 64,128 --densities 0.1,0.25,0.5,1.0 > "$out/bench_ops.txt" 2>&1
     python3 benchmarks/bench_decode.py --out "$out" > /dev/null 2>> "$out/bench_ops.txt"
     python3 benchmarks/bench_linear.py --out "$out" > "$out/bench_linear.log" 2>&1 ;;
esac
for arg in "$@"; do
  case $arg in
    --memcheck)
      # memcheck and test logs share one file: the device tool brings back at most 8 files.
      compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -x tests/test_kernels_cuda.py \
        -k "(hopper_path_at_every_m and (m257 or m7-)) or (blocks_of_32 and m129-) or (decode_dsd and m33-) or (64_row_tiles and m129-) or (few_rows_dsd_and_dds and m65-) or (one_block_ctas and (m7- or m33- or m300-))" >> "$out/tests.log" 2>&1
      echo "memcheck exit $?" >> "$out/tests.log" ;;
  esac
done
case " $* " in
  *" --no-tests "*) ;;
  *) python3 -m pytest -q tests -m cuda >> "$out/tests.log" 2>&1; echo "tests exit $?" >> "$out/tests.log" ;;
esac
[ -f "$out/tests.log" ] && grep -E "passed|failed|error|ERROR SUMMARY|exit" "$out/tests.log" | tail -8
[ -f "$out/bench_ops.txt" ] && grep -E "^block|^dense" "$out/bench_ops.txt"
exit 0
