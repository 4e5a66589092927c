// pytorch_block_sparse_ng._C: the one PYBIND11_MODULE. Each function checks every argument (device, dtype,
// contiguity, alignment, shapes, index dtypes and sizes), fills a plain params struct and calls the launcher
// on PyTorch's current stream. No host synchronisation; the only allocations are the outputs (and the fp32
// partial sums of a split dsd, of a split sdd or of its tail pieces). Index *contents* are trusted: they come
// from layout.py.
//
// Wrapped as torch.library custom ops by pytorch_block_sparse_ng/_ops.py, the only importer of this module;
// `linear` (linear_autograd.cpp) is the layer's eager autograd function.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/utils/pybind.h>

#include "block_sparse/params.h"
#include "checks.h"
#include "counters.h"
#include "ops.h"

// cuda_build.py passes the arch list as a pp-number such as 80_90a (no quotes or ';' survive the ninja
// command line); it is turned into the string "80_90a" here.
#define PBSNG_STR2(x) #x
#define PBSNG_STR(x) PBSNG_STR2(x)
#ifdef PBSNG_ARCHS_TOKEN
#define PBSNG_BUILD_ARCHS PBSNG_STR(PBSNG_ARCHS_TOKEN)
#else
#define PBSNG_BUILD_ARCHS "unknown"
#endif

namespace pbsng {
namespace {

constexpr const char* kDsd = "pytorch_block_sparse_ng._C.dsd";
constexpr const char* kDds = "pytorch_block_sparse_ng._C.dds";
constexpr const char* kSdd = "pytorch_block_sparse_ng._C.sdd";

DType dtype_of(const at::Tensor& t) { return t.scalar_type() == at::kHalf ? DType::kFloat16 : DType::kBFloat16; }

void check_launch(cudaError_t err, const char* fn) {
  TORCH_CHECK(err == cudaSuccess, cat(fn, ": kernel launch failed: ", cudaGetErrorString(err),
              err == cudaErrorNoKernelImageForDevice
                  ? " (this build has no kernel for this GPU; it was built for archs " PBSNG_BUILD_ARCHS
                    "; rebuild with PYTORCH_BLOCK_SPARSE_NG_CUDA_ARCHS set to include it)"
                  : ""));
}

// The block size from data [nnz, B, B] (or block_shape), and the checks shared by the three products.
int check_block(int64_t br, int64_t bc, const char* fn, const char* what) {
  PBSNG_CHECK_VALUE(br == bc && block_size_supported(int(br)), fn, ": ", what, "=(", br, ", ", bc,
                    ") is not supported by the CUDA kernels: square blocks of 32, 64 or 128 only");
  return int(br);
}

struct Pattern {
  int64_t n_block_rows, n_block_cols, nnz;
};

// The six index arrays of layout.INDEX_NAMES and the two orders of layout.ORDER_NAMES, checked against each
// other and nnz (their contents are trusted: layout.py builds them).
Pattern check_pattern(const at::Tensor& row_offsets, const at::Tensor& col_indices, const at::Tensor& row_indices,
                      const at::Tensor& col_offsets_t, const at::Tensor& row_indices_t, const at::Tensor& perm_t,
                      const at::Tensor& row_order, const at::Tensor& col_order, int64_t nnz, const at::Tensor& ref,
                      const char* fn) {
  check_defined(row_offsets, fn, "row_offsets");
  check_defined(col_offsets_t, fn, "col_offsets_t");
  PBSNG_CHECK_VALUE(row_offsets.dim() == 1 && row_offsets.numel() >= 1, fn, ": row_offsets must be 1-D with R + 1 >= 1 "
                    "entries, got shape ", shape_str(row_offsets));
  PBSNG_CHECK_VALUE(col_offsets_t.dim() == 1 && col_offsets_t.numel() >= 1, fn, ": col_offsets_t must be 1-D with "
                    "C + 1 >= 1 entries, got shape ", shape_str(col_offsets_t));
  Pattern p{row_offsets.numel() - 1, col_offsets_t.numel() - 1, nnz};
  check_index(row_offsets, p.n_block_rows + 1, ref, fn, "row_offsets", "R + 1");
  check_index(col_indices, nnz, ref, fn, "col_indices", "one per kept block");
  check_index(row_indices, nnz, ref, fn, "row_indices", "one per kept block");
  check_index(col_offsets_t, p.n_block_cols + 1, ref, fn, "col_offsets_t", "C + 1");
  check_index(row_indices_t, nnz, ref, fn, "row_indices_t", "one per kept block");
  check_index(perm_t, nnz, ref, fn, "perm_t", "one per kept block");
  check_index(row_order, p.n_block_rows, ref, fn, "row_order", "one per block row");
  check_index(col_order, p.n_block_cols, ref, fn, "col_order", "one per block column");
  PBSNG_CHECK_VALUE(nnz <= p.n_block_rows * p.n_block_cols, fn, ": ", nnz, " kept blocks do not fit a ",
                    p.n_block_rows, " x ", p.n_block_cols, " block grid");
  return p;
}

void check_rows(int64_t m, int block_m_tile, const char* fn, const char* name) {
  // grid.y = ceil(M / 128) must stay under 65536
  PBSNG_CHECK_VALUE((m + block_m_tile - 1) / block_m_tile <= 65535, fn, ": ", name, " has ", m,
                    " rows; at most ", int64_t(65535) * block_m_tile, " are supported");
}

// A guard for the device of a product that also makes the device's primary context current on this thread.
// The Hopper kernels' tensor maps are encoded through the driver API (cuTensorMapEncodeTiled), which, unlike the
// runtime, binds no context by itself: on a thread that had made no CUDA runtime call yet while its device index
// already matched (the autograd engine's device thread for GPU 0: PyTorch skips cudaSetDevice then), the encode
// failed and the product reported "kernel launch failed: invalid argument" (H100: the first backward of a process
// with the backward on one stream, an sdd with blocks of 64 in a fresh thread). Forced once per thread and device.
class ProductDeviceGuard {
 public:
  explicit ProductDeviceGuard(const c10::Device& device) : guard_(device) {
    thread_local uint64_t bound = 0;  // bit d: device d's context was made current on this thread
    const int index = device.index();
    const uint64_t bit = index >= 0 && index < 64 ? uint64_t(1) << index : 0;
    if (bit != 0 && (bound & bit) != 0) return;
    const cudaError_t err = c10::cuda::SetDevice(device.index(), /*force=*/true);
    TORCH_CHECK(err == cudaSuccess, cat("making the CUDA context of ", device, " current failed: ",
                                        cudaGetErrorString(err)));
    bound |= bit;
  }

 private:
  c10::cuda::CUDAGuard guard_;
};

int multiprocessor_count(int device) {
  static int counts[64] = {0};
  if (device < 0 || device >= 64) return 108;
  if (counts[device] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) n = 108;
    counts[device] = n;
  }
  return counts[device];
}

// The Hopper kernels (TMA + wgmma: dsd and dds, blocks 32 / 64 / 128; sdd 64 / 128) run on sm_90 devices when the build includes
// sm_90a and M >= g_hopper_min_rows (their 256-token tile wastes tensor-core work on fewer rows, where the SM80
// kernels with 128-row tiles and split-K do better), unless switched off with set_hopper_kernels(false) (tests
// and benchmarks compare both paths).
bool g_hopper_enabled = true;
int64_t g_hopper_min_rows = 256;

// Whether the device runs this build's sm_90a code (an sm_90 device, a build with sm_90a).
bool sm90a_device(int device) {
#ifdef PBSNG_WITH_SM90A
  if (device < 0 || device >= 64) return false;
  static int capability[64] = {0};
  if (capability[device] == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    capability[device] = major * 10 + minor;
  }
  return capability[device] == 90;
#else
  (void)device;
  return false;
#endif
}

bool hopper_device(int device, int block) {
  return g_hopper_enabled && (block == 32 || block == 64 || block == 128) && sm90a_device(device);
}

bool use_hopper_for(int device, int block, int64_t m, int64_t nnz) {
  return nnz > 0 && m >= g_hopper_min_rows && hopper_device(device, block);
}

// The Hopper dsd / dds tile schedule. "counter": tiles handed out from a zeroed int32 (tile_counter_for), so
// that the SMs that finish first take the next tiles; "round_robin": CTA i takes tiles i,
// i + grid, ... of the same hand-out order (tile_of); "auto" (default): the counter. Since session 11 the
// producer takes its next tile near the end of its current one and the kernel ends on its shortest tiles
// (kernel_sm90_ws.cuh, tile_of), and the counter is 0.6-13 % faster than the session 10 kernel (round-robin
// above density 0.2) in every cell (H100, blocks 64 and 128, benchmarks/results/ab_tile_claim_*.txt); before
// that round-robin was 2-5 % faster at 0.25 and 0.5.
enum class TileSchedule : int64_t { kAuto = 0, kCounter = 1, kRoundRobin = 2 };
int64_t g_tile_schedule = int64_t(TileSchedule::kAuto);
int64_t set_hopper_tile_schedule(int64_t schedule) {
  PBSNG_CHECK_VALUE(schedule >= 0 && schedule <= 2, "set_hopper_tile_schedule: schedule=", schedule,
                    " must be 0 (auto), 1 (counter) or 2 (round-robin)");
  return std::exchange(g_tile_schedule, schedule);
}

// The Hopper dsd / dds tile counter for a launch (int32[2]: tiles handed out, CTAs done; the kernel's last CTA
// zeroes both), or nullptr for round-robin. Kept per stream instead of a memset per call: H100 A/B 0.3-1.2 % less
// GPU time, 2-5 us less host time per call (benchmarks/results/ab_tile_counter_per_stream_*.txt); counters.h.
int* tile_counter_for(const at::Tensor& like, cudaStream_t stream) {
  if (g_tile_schedule == int64_t(TileSchedule::kRoundRobin)) return nullptr;
  return self_resetting_counters(like, stream, 2);
}

bool set_hopper_kernels(bool enabled) {
  return std::exchange(g_hopper_enabled, enabled);
}

// The Hopper sdd gives each CTA a chunk of 8 blocks (block 64) of one block row: rows of 1-2 blocks leave most
// of its tile empty. Measured on an H100 (bf16, M = 8192 / 16384): with 1.6 blocks per row on average the SM80
// sdd took 0.073 ms against 0.115, from 4 per row the Hopper one is as fast or faster (13 % at 16, 35 % at 32).
// Blocks of 128 (chunks of 2) took the Hopper sdd even at 0.8 per row (0.076 vs 0.096 ms).
int64_t g_hopper_sdd_min_blocks_per_row = 3;

// Sets a tuning knob to `value` (>= `least` and, if given, <= `most`, else a ValueError naming `fn` and `name`);
// returns its old value.
int64_t exchange_knob(int64_t& knob, int64_t value, int64_t least, const char* fn, const char* name,
                      std::optional<int64_t> most = std::nullopt) {
  if (most.has_value()) {
    PBSNG_CHECK_VALUE(value >= least && value <= *most, fn, ": ", name, "=", value, " must be in [", least, ", ",
                      *most, "]");
  }
  PBSNG_CHECK_VALUE(value >= least, fn, ": ", name, "=", value, " must be >= ", least);
  return std::exchange(knob, value);
}

// A knob of -1 (auto: the rule decides), 0 (off) or 1 (always), and what it makes of its rule's answer.
int64_t exchange_auto_knob(int64_t& knob, int64_t mode, const char* fn) {
  PBSNG_CHECK_VALUE(mode >= -1 && mode <= 1, fn, ": mode=", mode, " must be -1 (auto), 0 (off) or 1 (always)");
  return std::exchange(knob, mode);
}
bool auto_knob_says(int64_t knob, bool rule) { return knob >= 0 ? knob == 1 : rule; }

int64_t set_hopper_sdd_min_blocks_per_row(int64_t blocks) {
  return exchange_knob(g_hopper_sdd_min_blocks_per_row, blocks, 0, "set_hopper_sdd_min_blocks_per_row", "blocks");
}

// Splits of M for the Hopper sdd with `ctas` CTAs (estimated) of `steps` steps of 64 tokens each over `nnz`
// blocks; each piece keeps >= 16 steps. Measured on an H100 with forced splits (benchmarks/results/
// ab_sdd_splits_*.txt, ab_sdd_rule_*.txt, ab_sdd_split_model_*.txt):
// - blocks of 64: splits slowed every cell down where one wave holds the CTAs or more (~80 CTAs at density
//   0.1: unsplit 0.102 ms, 2-6 splits 0.107-0.110; ~156 CTAs at 0.25: 0.183 unsplit, 0.198 in 3), though
//   the wave count says otherwise: so only as many pieces as fit in one wave with the CTAs;
// - blocks of 128: the least modelled time, a split taken only where it saves 3 % (sdd_b128_split_cost_us).
//   The rule before (the fewest waves per unit of work, within 10 %) split 8192 x 4096 -> 4096 at density 0.2
//   (~111 CTAs) in 7: 0.170 ms against 0.107 unsplit (eager; 0.166 against 0.111 in GPU time), since the zeroed
//   workspace of splits > 2 and every wave of pieces cost more than the waves count.
// g_sdd_splits: -1 that rule; 1-64 that split (set_hopper_sdd_splits: tests, A/B measurements).
int64_t g_sdd_splits = -1;
int64_t set_hopper_sdd_splits(int64_t splits) {
  PBSNG_CHECK_VALUE(splits == -1 || (splits >= 1 && splits <= 64), "set_hopper_sdd_splits: splits=", splits,
                    " must be -1 (auto) or 1-64");
  return std::exchange(g_sdd_splits, splits);
}

// The block-128 Hopper sdd's time in us, split in s (H100, bf16, fitted to ab_sdd_split_model_*.txt): a 64-token
// step takes ~0.75 us and each wave of CTAs ~10 more (the pipeline's fill, the epilogue). Unsplit, a last partial
// wave of `rest` CTAs runs as tail pieces (kernel_sm90_sdd.cuh: min(SMs / rest, steps / 16) each, summed by the
// last, ~3 us). Split in 2, the two pieces are summed in the kernel (~1 us); in more, into a zeroed fp32 workspace
// by TMA reduce-adds, then cast: ~10 us and ~0.08 us per block (a memset, the reduce-adds, a cast kernel).
double sdd_b128_split_cost_us(int64_t s, int64_t ctas, int64_t sms, int64_t steps, int64_t nnz) {
  constexpr double kStepUs = 0.75, kWaveUs = 10.0;
  if (s == 1) {
    const int64_t full = ctas / sms, rest = ctas % sms;
    if (full == 0) return double(steps) * kStepUs + kWaveUs;
    double us = double(full) * (double(steps) * kStepUs + kWaveUs);
    if (rest > 0) {
      const int64_t pieces = std::max<int64_t>(1, std::min(sms / rest, steps / 16));
      us += double(steps) / double(pieces) * kStepUs + kWaveUs + (pieces > 1 ? 3.0 : 0.0);
    }
    return us;
  }
  const double waves = double((ctas * s + sms - 1) / sms);
  if (s == 2) return waves * (double(steps) / 2.0 * kStepUs + kWaveUs + 1.0);
  return waves * (double((steps + s - 1) / s) * kStepUs + kWaveUs) + 10.0 + 0.08 * double(nnz);
}

int64_t sdd_sm90_splits(int block, int64_t ctas, int64_t sms, int64_t steps, int64_t nnz) {
  if (g_sdd_splits > 0) return std::min<int64_t>(g_sdd_splits, std::max<int64_t>(1, steps));
  const int64_t most = std::max<int64_t>(1, std::min<int64_t>(steps / 16, 64));
  if (block != 128) return std::max<int64_t>(1, std::min<int64_t>(sms / ctas, most));
  int64_t splits = 1;
  double least = sdd_b128_split_cost_us(1, ctas, sms, steps, nnz);
  for (int64_t s = 2; s <= most; ++s) {
    const double us = sdd_b128_split_cost_us(s, ctas, sms, steps, nnz);
    if (us < 0.97 * least) {
      least = us;
      splits = s;
    }
  }
  return splits;
}

// The block-128 Hopper sdd with one CTA per block, loaded by cp.async (kernel_sm90_sdd_cpasync.cuh), against the
// TMA sdd (two-block CTAs, M split by the model above): taken for 2048 to 3072 tokens and half the SMs' count of
// blocks to twice it (one wave of at most two CTAs per SM), where the layer's backward measured faster with it.
// H100, bf16, 4096 -> 4096, with the bias gradient, GPU time in graphs, at 102 / 256 blocks
// (benchmarks/results/ab_sdd_cpasync_*.txt, session 38): the backward (the dds on a second stream beside the sdd)
// 0.93 / 0.93x at 2048 tokens, 0.97 / 0.99x at 3072; but 1.48 / 1.20x at 1024, 1.18 / 1.08x at 1536, 0.99 / 1.04x
// at 4096, 1.04x at 8192. The sdd alone is faster over a wider range (2048 tokens 0.76-0.81x from 31 to 256 blocks,
// 1024-6144 tokens 0.83-0.98x at 256 blocks; 512 tokens 1.2x, 16384 1.05x): beside the dds it is not. Below 2048
// rows (kFewRowsMaxRows) that dds takes the few-rows tiles, from 2048 the 256-token kernel: where it lost, the dds
// beside it was the few-rows one (not profiled). (Session 37's range, from 3/4 of the SMs' count at any M, rested
// on the TMA sdd forced unsplit, without the bias gradient.)
// g_sdd_one_block_ctas: -1 by that rule, 0 never, 1 always (A/B measurements, tests).
int64_t g_sdd_one_block_ctas = -1;
int64_t set_hopper_sdd_one_block_ctas(int64_t mode) {
  return exchange_auto_knob(g_sdd_one_block_ctas, mode, "set_hopper_sdd_one_block_ctas");
}

// A split of M forced by set_hopper_sdd_splits (> 1) keeps the rule off: the TMA sdd runs the split.
bool sdd_b128_one_block_ctas(int64_t m, int64_t nnz, int64_t sms) {
  return auto_knob_says(g_sdd_one_block_ctas,
                        g_sdd_splits <= 1 && m >= 2048 && m <= 3072 && 2 * nnz >= sms && nnz <= 2 * sms);
}

// The Hopper sdd's tail split (kernel_sm90_sdd.cuh, blocks of 128): on by default; off for A/B measurements.
bool g_hopper_sdd_tail_split = true;
bool set_hopper_sdd_tail_split(bool enabled) {
  return std::exchange(g_hopper_sdd_tail_split, enabled);
}

// Pipeline stages of the Hopper dsd / dds: 3 (48 KB each, the 64 KB output tile staged whole) or 4 (its two
// halves staged one after the other).
int64_t g_hopper_stages = 4;
int64_t set_hopper_pipeline_stages(int64_t stages) {
  PBSNG_CHECK_VALUE(stages == 3 || stages == 4, "set_hopper_pipeline_stages: stages=", stages, " must be 3 or 4");
  return std::exchange(g_hopper_stages, stages);
}

// Programmatic dependent launch (block_sparse/grid_dependency.cuh): each product kernel may be scheduled while the
// kernel before it in the stream finishes, and waits for it before touching global memory. Only where this build's
// sm_90a code runs (the sm_80 code has no wait), so on sm_90 devices, for every kernel there (the SM80 and decode
// kernels too). On by default; off for A/B measurements and tests.
bool g_programmatic_launch = true;
bool set_programmatic_launch(bool enabled) {
  return std::exchange(g_programmatic_launch, enabled);
}
bool programmatic_launch_for(int device) { return g_programmatic_launch && sm90a_device(device); }

int64_t set_hopper_min_rows(int64_t rows) {
  return exchange_knob(g_hopper_min_rows, rows, 1, "set_hopper_min_rows", "rows");
}

// The Hopper dsd and dds for few rows of M (kernel_sm90_ws.cuh, Config's Tokens_ / Split_): 128-token tiles whose
// reduction is split over 1, 2, 4 or 8 CTAs of a thread-block cluster, which add their fp32 sums through
// distributed shared memory (no workspace, no extra kernels). -1 (default): few_rows_split_for below decides; 0:
// never (the SM80 kernels, or the 256-token kernel from set_hopper_min_rows); 1, 2, 4 or 8: that split wherever
// the Hopper kernels run (tests, benchmarks).
int64_t g_few_rows_split = -1;
int64_t set_hopper_few_rows_split(int64_t split) {
  PBSNG_CHECK_VALUE(split == -1 || split == 0 || split == 1 || split == 2 || split == 4 || split == 8,
                    "set_hopper_few_rows_split: split=", split, " must be -1 (auto), 0 (off), 1, 2, 4 or 8");
  return std::exchange(g_few_rows_split, split);
}

// The Hopper dsd / dds for blocks of 32 (kernel_sm90_b32.cuh: 128 tokens x 8 lines per tile). It beats the SM80
// kernels only where its tiles fill the SMs and the density is not low: H100, bf16, 8192 x 4096 -> 4096, with the
// planned stages (session 27, benchmarks/results/b32_kernel_session27_*.txt) dsd 0.41 / 0.63 ms against 0.65 / 1.26 at
// density 0.5 / 1.0 and 0.31 against 0.34 at 0.25, but 0.20 against 0.18 at 0.1 (the dds alike); before them
// (session 24-25) on 4096 x 4096 at M = 512 (64 tiles) 1.5x the SM80 kernel's time at density 0.5, at M = 1024 (128
// tiles) 0.8x (benchmarks/results/b32_*.txt). -1 (default): that rule (tiles >= 3/4 of the SMs, density >= 0.18:
// the crossing between 0.1 and 0.25 on 8192 x 4096 -> 4096; on 16384 x 1024 -> 4096 at density 0.2 the Hopper dsd
// took 0.17 ms against 0.22, the dds 0.157 against 0.160; from session 28 also density >= 0.05 on many tiles, see
// b32_hopper_for); 0: never; 1: wherever the Hopper kernels run (tests, benchmarks). The same mode switches the
// block-32 Hopper sdd (b32_sdd_hopper_for).
int64_t g_hopper_b32 = -1;
int64_t set_hopper_blocks_of_32(int64_t mode) {
  PBSNG_CHECK_VALUE(mode >= -1 && mode <= 1, "set_hopper_blocks_of_32: mode=", mode, " must be -1 (auto), 0 (off) or 1");
  return std::exchange(g_hopper_b32, mode);
}

// The block-32 dsd / dds tiles: 8 lines x 128 tokens.
int64_t b32_tiles(int64_t lines, int64_t m) { return (lines + 7) / 8 * ((m + 127) / 128); }

// Below density 0.18, on >= 4 x the SMs' tiles, the kernel with two block columns per stage beat SM80 too (sessions
// 28-29, benchmarks/results/b32_kernel_session2{8,9}_*.txt): 8192 x 4096 -> 4096 dsd / dds 0.88 / 0.89x SM80's time
// at density 0.05, 0.90 / 0.90x at 0.1 (session 29); the dsd of 16384 x 1024 -> 4096 0.64-0.70x. Below density 0.05
// nothing was measured: SM80. Where the tiles take a last wave that is mostly idle (fewer than 4 x the SMs' tiles
// filling < 3/4 of their waves' SM slots) the SM80 kernel's smaller tiles win up to density 0.3 (session 29: the dsd
// of 6144 x 3072 -> 768, 144 tiles on 132 SMs, 1.3 / 1.1x SM80's time at density 0.2 / 0.3, 0.88x at 0.5), so there
// the Hopper kernel runs from density 0.4.
bool b32_hopper_for(int64_t lines, int64_t m, int64_t nnz, int64_t cells, int64_t sms) {
  if (cells > int64_t(kB32MaxOtherBlocks) * lines) return false;  // the kernel's plans hold K <= 128 Ki
  if (g_hopper_b32 >= 0) return g_hopper_b32 == 1;
  const int64_t tiles = b32_tiles(lines, m);
  if (4 * tiles < 3 * sms) return false;
  if (tiles >= 4 * sms) return 20 * nnz >= cells;
  const int64_t slots = (tiles + sms - 1) / sms * sms;  // the SM slots of the tiles' waves
  return 4 * tiles >= 3 * slots ? 50 * nnz >= 9 * cells : 5 * nnz >= 2 * cells;
}

// Block columns per stage of the block-32 Hopper dsd / dds (kernel_sm90_b32.cuh, Config::kCols). Two columns halve
// the stages' fixed cost (~0.27 us a stage on an H100, measured with neither loads nor wgmma) in 4 stages where one
// column has 6; since a two-column stage is released as soon as its wgmma are done (session 29), two columns took
// 0.78-1.01x one column's time in 111 of 112 cells (H100, bf16, six shapes of 128-2048 tiles, density 0.05-1.0, dsd
// and dds, with 3 stages; benchmarks/results/b32_kernel_session29_*.txt), 1.006x in the other; the fourth stage
// took the dsd 3-5 % further. -1 (default): two; 1 / 2: that many columns per stage.
int64_t g_hopper_b32_columns = -1;
int64_t set_hopper_b32_columns(int64_t columns) {
  PBSNG_CHECK_VALUE(columns == -1 || columns == 1 || columns == 2, "set_hopper_b32_columns: columns=", columns,
                    " must be -1 (auto), 1 or 2");
  return std::exchange(g_hopper_b32_columns, columns);
}

int b32_columns() { return g_hopper_b32_columns > 0 ? int(g_hopper_b32_columns) : 2; }

// Two-column block-32 stages may load a line's two adjacent W blocks (bit 1, sm90b32::kPairW) and two adjacent
// block columns' activation tiles (bit 2, kPairAct) in one TMA box each: a box costs the SM's TMA unit a fixed ~160
// clocks besides its bytes (benchmarks/profile/tma_row_rate.cu). Each setting is a kernel instantiation of its own.
// W pairs need line-major W slots, which cost where few lines have both blocks of a stage. Session 34 (H100, bf16,
// in-process A/B against the kernel before, four shapes; benchmarks/results/b32_kernel_session34_*.txt): activation
// pairs 0.97-1.01x its time at density 0.1-0.7, 0.95-1.0x at 0.8-1.0; both kinds 1.00-1.03x at 0.1-0.6, 0.98x at
// 0.7, 0.94-0.99x at 0.8-0.9 and 0.91-0.98x at 1.0 (W pairs alone 1.02-1.07x at 0.25-0.6). -1 (default): activation
// pairs, both kinds from density 2/3; 0: neither (the kernel before); 1: W pairs; 2: activation pairs; 3: both.
int64_t g_hopper_b32_pair_boxes = -1;
int64_t set_hopper_b32_pair_boxes(int64_t bits) {
  PBSNG_CHECK_VALUE(bits >= -1 && bits <= 3, "set_hopper_b32_pair_boxes: bits=", bits,
                    " must be -1 (auto) or 0-3 (1: a line's two W blocks in one box, 2: two columns' activation"
                    " tiles, 3: both)");
  return std::exchange(g_hopper_b32_pair_boxes, bits);
}

int b32_pair_boxes_for(int64_t nnz, int64_t cells) {
  if (g_hopper_b32_pair_boxes >= 0) return int(g_hopper_b32_pair_boxes);
  return 3 * nnz >= 2 * cells ? 3 : 2;
}

// The block-32 Hopper dds on W's blocks transposed (kernel_transpose_blocks.cuh): one pass over the blocks into a
// workspace of the weight's size, then the dsd kernel of dy with W^T, whose K-major W tiles load in 128-byte rows;
// read from W's blocks, the kernel's W_b^T tiles are MN-major in 64-byte rows. Measured against that kernel (H100,
// bf16, five shapes of 256-4096 tiles, in-process A/B; benchmarks/results/b32_kernel_session30_*.txt): from density
// 0.25 1-17 % faster in 19 of 20 cells and 0.6 % slower in the other (the MN-major kernel took 1.115 / 1.147x the time
// at 0.5 / 1.0 on 8192 x 4096 -> 4096, 1.117 / 1.129x on 4096 x 16384 -> 4096), within 2-3 % at 0.05-0.1, where the
// copy's ~5 us count. -1 (default): from density 0.2; 0: never; 1: always.
int64_t g_hopper_b32_dds_copy = -1;
int64_t set_hopper_b32_dds_copy(int64_t mode) {
  return exchange_auto_knob(g_hopper_b32_dds_copy, mode, "set_hopper_b32_dds_copy");
}

bool b32_dds_copy_for(int64_t nnz, int64_t cells) { return auto_knob_says(g_hopper_b32_dds_copy, 5 * nnz >= cells); }

// The Hopper sdd for blocks of 32 (kernel_sm90_sdd_b32.cuh: a CTA per row pair or quad and a chunk of their union,
// M unsplit). Measured against the SM80 sdd (H100, bf16, with the bias sum; benchmarks/results/ab_sdd_b32_*.txt, with
// the tile of b32_sdd_mode): 8192 x 4096 -> 4096 1.6x / 2.2x / 4.5x / 8.5x faster at density 0.1 / 0.25 / 0.5 / 1.0
// (2.5x at 0.25 with mode 3, session 35);
// faster in every cell measured from 64 rows (calls 3-4 and 9-10: M = 64-16384 on 4096 x 4096, 1024 -> 4096, 4096
// -> 1024 and 3072 -> 768, densities 0.1-1.0; 1.02-4.3x below 1024 rows, in graphs of 20 calls) but one tie (4096
// -> 1024 at M = 4096, density 0.1: 0.052 ms against 0.051); at 16 rows 0.87-1.96x. So from 64 rows, whatever
// set_hopper_min_rows says (the block-32 products have a rule of their own); -1 (default): that rule; 0: never; 1:
// wherever the Hopper kernels run (M >= set_hopper_min_rows).
bool b32_sdd_hopper_for(int device, int64_t m, int64_t nnz, int64_t n_block_rows, int64_t n_block_cols) {
  if (n_block_cols > kSddB32MaxBlockCols || n_block_rows == 0 || n_block_cols == 0 || g_hopper_b32 == 0) return false;
  if (g_hopper_b32 == 1) return use_hopper_for(device, 32, m, nnz);
  return nnz > 0 && m >= 64 && hopper_device(device, 32);
}

// The block-32 Hopper sdd's tile (kernel_sm90_sdd_b32.cuh, Mode): row pairs of row_order x single columns, row
// pairs x column pairs (64-feature x boxes), adjacent row quads x column pairs (each consumer its own row pair's
// dy^T, both sharing the x tiles), or row pairs x single columns read from a copy of x^T (mode 3). The TMA issues a
// stage's loads row by row (~1.35 ns per row per SM on an H100, whether 64 or 128 bytes), and the four take 1152 /
// 640 / 384 / 640 rows per stage for the same wgmma work, at the cost of more absent blocks in the tile (a pair's
// union of single columns, of column pairs, a quad's union of column pairs) and so more CTAs at low density, and for
// mode 3 a pass over x (4 bytes per value). The CTAs of a pattern are about equally long, so the time is the waves
// of CTAs times a stage's time: measured on full waves ~1.45 / ~0.9 / ~0.72 / 1.0-1.15 us (8192 x 4096 -> 4096). The
// rule picks the mode of least modelled time, with the CTAs estimated for random rows (a pair's union holds a
// column with probability 1 - (1 - d)^2, a column pair 1 - (1 - d)^4, a quad's 1 - (1 - d)^8). It took the fastest
// mode, or one within 1 %, in all 15 cells measured (benchmarks/results/ab_sdd_b32_*.txt, call 4: 8192 x 4096 ->
// 4096, 16384 x 1024 -> 4096, 4096 -> 1024 at M = 4096 from density 0.25, 2048 x 4096 -> 4096), e.g. 8192 x 4096 ->
// 4096 at density 0.1 / 0.25 / 0.5 / 1.0: single columns 0.200 ms, column pairs 0.354, quads 0.365 / 0.370 (the
// other modes 0.234-0.793). Mode 3 (session 35, benchmarks/results/ab_sdd_b32_xt_*.txt) wins where a pair's union
// of columns fills two waves and the quads' four (density ~0.2-0.3 on 8192 or 2048 x 4096 -> 4096: 0.318 ms at
// 0.25 against 0.350 for column pairs, the best before), and lost everywhere else measured, where the rule keeps the
// other modes. -1 (default): that rule; 0 / 1 / 2 / 3: that mode.
int64_t g_sdd_b32_mode = -1;
int64_t set_hopper_sdd_b32_mode(int64_t mode) {
  PBSNG_CHECK_VALUE(mode >= -1 && mode <= 3, "set_hopper_sdd_b32_mode: mode=", mode,
                    " must be -1 (auto), 0 (row pairs x columns), 1 (row pairs x column pairs), 2 (row quads x "
                    "column pairs) or 3 (row pairs x columns of x^T)");
  return std::exchange(g_sdd_b32_mode, mode);
}

// The x^T pass of mode 3 (kernel_transpose_blocks.cuh): 128 MB in 49 us on an H100 (8192 x 4096 bf16), ~2.6 TB/s.
constexpr double kTransposeBytesPerUs = 2.5e6;
int b32_sdd_mode(int64_t nnz, int64_t n_block_rows, int64_t n_block_cols, int64_t sms) {
  if (g_sdd_b32_mode >= 0) return int(g_sdd_b32_mode);
  const double density = double(nnz) / (double(n_block_rows) * double(n_block_cols));
  const double col_pairs = double((n_block_cols + 1) / 2);
  // Per 64-token step: a stage per wave, and for mode 3 the pass that writes x^T (4 bytes per value read and
  // written, at kTransposeBytesPerUs).
  struct Tile { double groups, entries, per_cta, stage_us, extra_us; };  // row groups, union entries per group
  const double pair_columns = double(n_block_cols) * (1.0 - std::pow(1.0 - density, 2.0));
  const double transpose_us = 4.0 * 64.0 * 32.0 * double(n_block_cols) / kTransposeBytesPerUs;
  const Tile tiles[4] = {
      {double((n_block_rows + 1) / 2), pair_columns, 16.0, 1.45, 0.0},
      {double((n_block_rows + 1) / 2), col_pairs * (1.0 - std::pow(1.0 - density, 4.0)), 8.0, 0.9, 0.0},
      {double((n_block_rows + 3) / 4), col_pairs * (1.0 - std::pow(1.0 - density, 8.0)), 4.0, 0.72, 0.0},
      {double((n_block_rows + 1) / 2), pair_columns, 16.0, 1.1, transpose_us}};
  int best = 0;
  double best_time = 0.0;
  for (int mode = 0; mode < 4; ++mode) {
    const Tile& t = tiles[mode];
    const double ctas = t.groups * std::max(1.0, std::ceil(t.entries / t.per_cta));
    const double time = std::ceil(ctas / double(sms)) * t.stage_us + t.extra_us;
    if (mode == 0 || time <= best_time) best = mode, best_time = time;
  }
  return best;
}

// The split for a dsd or dds of M rows with `tiles` 128-token tiles of `steps` k-steps of 64 per line (on average)
// and `nnz` of `cells` blocks kept, or 0 for the other kernels. The rule counts tiles and CTAs against the SMs.
// Measured on an H100 (bf16, hot weight, graphs of 20 calls; 4096 x 4096, 1024 -> 4096, 4096 -> 1024, densities
// 0.1-1.0; benchmarks/profile/dsd_mid_rows.py, benchmarks/results/{dsd,dds}_mid_rows_*.txt):
// - blocks of 128: a split of 2 where the tiles fill at most half the SMs and the lines are long (>= 24 k-steps),
//   else none, while the tiles fit on the SMs, and on up to twice the SMs at density <= 0.5 with lines of < 48
//   k-steps (above that, or on more tiles, the 256-token kernel was faster; session 42, H200: with lines of 51-64
//   k-steps on 1.2-1.9x the SMs the tiles took 0.97-1.25x its time, summed 1.08x, in 9 dsd cells, 8192 -> 2048 /
//   3072 at M = 1024-1792, and 1.03-1.21x, summed 1.11x, in 6 dds cells, 2048 -> 8192 at M = 1280-1792; 1.19x on
//   the H100 in session 20's 8192 -> 2048 at M = 1280);
// - blocks of 64: the tile's two lines load the union of their blocks, so the tiles win where their CTAs fill the
//   GPU: a split of 2 on at most half the SMs from 12 k-steps per line, none on 0.5-1x the SMs. The dsd's SM80
//   kernel splits each line's blocks over CTAs (and takes 64-row tiles below 256 rows), the dds's does not: for the
//   dsd a split of 2 also needs an eighth of the SMs busy (a quarter until session 42: on 1/8-1/4 of the SMs the
//   split took 0.67-0.97x the SM80 kernel's time in the 10 cells of the fit, H200, 4096 -> 1024 at M = 384 / 512
//   and 8192 -> 2048 at M = 256, and 0.66-1.02x in the 22 held out, 4096 -> 768 / 1024 / 2048 and 8192 -> 1536 at
//   M = 256-640, summed 0.79x; H100, session 20's 4096 -> 1024 at M = 320-512, 0.73-1.08x in 12, summed 0.88x).
//   Below 256 rows the dsd's tiles need an eighth of the SMs;
//   where the SM80 kernel splits its lines, a split of 2 on at most half the SMs with lines of >= 16 k-steps at
//   density >= 0.5 or on a quarter of the SMs (session 20 had density >= 0.75 and 32 k-steps, when these tiles were
//   slower), and where it cannot (its CTAs fill the SMs) a split of 2 from 8 k-steps on at most half the SMs and
//   none on more. Session 41 (H100, M = 65-255, eight shapes, 236 cells of which 48 held out at M = 80 / 112: where
//   the path changed, 99 cells, 0.57-1.10x the session-20 rule's time, 7 of them 2-10 % slower, the held-out ones
//   all faster; summed per run 0.79-0.93x; on the H200's 72 cells summed 0.93x; benchmarks/results/
//   dsd_mid_rows_*.txt, dsd_split_k_NVIDIA_H200.txt).
// Session 20 fitted the dds (120 cells, M = 128-768: the path before, SM80 below 256 rows and the 256-token kernel
// from there, took 1.6x the best path's time in sum, the rule 1.01x; checked on M = 16-1536, 8192 -> 2048 and
// 2048 -> 8192) and refitted the dsd after the empty-stage fix made its block-64 split-2 tiles 13-20 % faster (264
// cells, M = 96-768: session 18's rule 1.055x the best in sum, this one 1.016x; 328 other cells, M = 80-1792 and two
// more shapes: 1.077x and 1.008x). Most of the gain is at 768 rows and more on narrow outputs, which the row limit
// of 768 had excluded (4096 -> 1024 at M = 768: 1.4-2.4x the few-rows tiles' time).
// From 2048 rows (session 23: 240 cells, M = 2048 / 3072 / 4096, five shapes up to 8192 -> 2048, both products,
// dsd_mid_rows_*.txt) only where the tiles fit on the SMs: narrow outputs (<= 1024 features at M = 2048), where the
// 256-token kernel has a tile for every second SM, took 1.25-1.7x the few-rows tiles' time (8 cells per product);
// on up to twice the SMs (2048 -> 8192 at M = 2048) the few-rows tiles took up to 1.2-1.3x the 256-token kernel's.
// Over those cells the default path would take 1.003x the best path's time in sum (before: 1.012x); checked on
// 192 more (outputs of 256 features too, M up to 8192): 1.005x / 1.013x for the dds / dsd (before: 1.14x / 1.12x).
constexpr int64_t kFewRowsMaxRows = 2048;  // from here only tiles that fit on the SMs (see above)
constexpr int64_t kFewRowsMinRowsBlock64Dsd = 256;
enum class Product { kDsd, kDds };

// The few-rows split of 1 or 2 (or 0: another kernel), before few_rows_split_for's split of 4.
int few_rows_split_of_2_for(Product product, int block, int64_t m, int64_t nnz, int64_t cells, int64_t tiles,
                            int64_t steps, int64_t sms, bool sm80_dsd_unsplit) {
  if (m >= kFewRowsMaxRows && tiles > sms) return 0;
  if (block == 128) {
    if (tiles <= sms) return 2 * tiles <= sms && steps >= 24 ? 2 : 1;
    return tiles <= 2 * sms && 2 * nnz <= cells && steps < 48 ? 1 : 0;
  }
  if (tiles > sms) return 0;
  const bool dsd = product == Product::kDsd;
  if (dsd && m < kFewRowsMinRowsBlock64Dsd) {
    if (8 * tiles < sms) return 0;
    // Where the SM80 kernel has too many CTAs to split its lines (sm80_dsd_unsplit) it runs whole lines in 64- or
    // 128-row tiles: the few-rows tiles took 0.60-0.97x its time with a split of 2 on at most half the SMs from 8
    // k-steps per line, 0.61-0.90x without a split on more (session 41).
    if (sm80_dsd_unsplit) return 2 * tiles > sms ? 1 : steps >= 8 ? 2 : 0;
    return 2 * tiles <= sms && steps >= 16 && (2 * nnz >= cells || 4 * tiles >= sms) ? 2 : 0;
  }
  if (2 * tiles <= sms) return steps >= 12 && (!dsd || 8 * tiles >= sms) ? 2 : 0;
  return 1;
}

int few_rows_split_for(Product product, int device, int block, int64_t m, int64_t nnz, int64_t cells, int64_t tiles,
                       int64_t steps, int64_t sms, bool sm80_dsd_unsplit = false) {
  // Blocks of 32 have one Hopper dsd / dds kernel (kernel_sm90_b32.cuh), no few-rows tiles.
  if (block == 32 || nnz <= 0 || g_few_rows_split == 0 || !hopper_device(device, block)) return 0;
  if (g_few_rows_split > 0) return int(g_few_rows_split);
  const int split = few_rows_split_of_2_for(product, block, m, nnz, cells, tiles, steps, sms, sm80_dsd_unsplit);
  // Few tiles with long lines: a split of 4 (session 42). Its 4-CTA clusters should all be resident at once (30 on
  // an H200's 132 SMs: a cluster's CTAs share a GPC), hence tiles on at most 3/16 of the SMs. H200, fit on dsd
  // 4096 / 8192 -> 1024 and dds 1024 -> 4096 at M = 65-1024 (dsd_mid_rows_NVIDIA_H200.txt, session 42): with lines
  // of >= 24 k-steps the split of 4 took 0.57-0.99x the time of the path before in the 43 cells where it is taken
  // (summed 0.78x); with 16 k-steps it was no faster than a split of 2; on 32 tiles (a second wave of clusters)
  // 1.3-1.5x. Held out (dsd 6144 -> 1024, 2048 -> 512, 8192 -> 768, dds 768 -> 4096, 1024 -> 8192, M = 96-448):
  // 0.65-0.99x in all 104 cells where it is taken (summed 0.77x). Over the SM80 kernels of blocks of 64 below 256
  // rows (the dsd's rule above keeps them) only at density >= 0.75: there it took 0.73-1.04x their time in 24 cells
  // of session 42's data (summed 0.86x) and, held out (session 43: 3072 / 4096 / 6144 -> 1024, 8192 -> 512, M =
  // 80-240, dsd_mid_rows_NVIDIA_H200.txt run 6), 0.71-1.09x in 40 cells (summed 0.87x); at 0.5 it lost in some
  // cells of both (1.16x at 4096 -> 1024, M = 128; 1.34x at 8192 -> 512, M = 128).
  const bool sm80_kept = product == Product::kDsd && block == 64 && m < kFewRowsMinRowsBlock64Dsd && split == 0 &&
                         4 * nnz < 3 * cells;
  if (16 * tiles > 3 * sms || steps < 24 || sm80_kept) return split;
  // Where the split of 4 is taken, a split of 8 (the portable cluster limit, session 44) with tiles on at most
  // 3/32 of the SMs (fewer than 16 clusters of 8 are resident on an H200) and lines of >= 64 k-steps (blocks of
  // 64) or >= 96 (blocks of 128). H200, fit on dsd 3072 / 4096 / 6144 -> 1024 and 8192 -> 512, dds 1024 -> 4096 /
  // 6144 and 512 -> 8192 at M = 80-240 (dsd_mid_rows_NVIDIA_H200.txt run 8, dds_mid_rows_*.txt session 44): where
  // so taken the split of 8 took 0.79-1.04x the split of 4's time (46 cells, summed 0.87x); with shorter lines up
  // to 1.1x (blocks of 128 at 64 k-steps; 1.18x at 32), on 16 tiles (a second wave of clusters) 1.4-2.1x. Held out
  // (dsd 8192 -> 768 / 1024, 5120 -> 1024, 12288 -> 512, dds 768 / 1024 -> 8192, 512 -> 12288, 1024 -> 5120, M =
  // 96-384, run 9): 0.73-1.07x in the 69 cells where taken (summed 0.84x).
  const bool long_lines = steps >= (block == 64 ? 64 : 96);
  return 32 * tiles <= 3 * sms && long_lines ? 8 : 4;
}

// A dsd / dds with blocks of 64 between 256 and kFewRowsMaxRows rows that the few-rows tiles do not take runs the
// SM80 kernels where the 256-token kernel has at most one tile for every two SMs: there it took 1.1-1.7x their
// time (dsd, density 0.1-0.5, M = 256-512) and 1.3-1.7x (dds); with more tiles (M = 640) 0.65-1.0x. With the
// few-rows knob off (0) the rule before it stands (the 256-token kernel from set_hopper_min_rows).
bool mid_rows_sm80_for(int block, int64_t m, int64_t tiles_of_256, int64_t sms) {
  return g_few_rows_split < 0 && block == 64 && m >= 256 && m < kFewRowsMaxRows && 2 * tiles_of_256 <= sms;
}

// dsd with at most this many rows of M takes the decode kernel (kernel_decode.cuh: W streamed by N / 16 or
// N / 32 CTAs, no split workspace); 0 turns it off (tests and benchmarks compare both paths).
int64_t g_decode_max_rows = kDecodeMaxRows;
int64_t set_decode_max_rows(int64_t rows) {
  return exchange_knob(g_decode_max_rows, rows, 0, "set_decode_max_rows", "rows", kDecodeMaxRows);
}

}  // namespace

at::Tensor dsd(const at::Tensor& x, const at::Tensor& data, const std::optional<at::Tensor>& bias,
               const at::Tensor& row_offsets, const at::Tensor& col_indices, const at::Tensor& row_indices,
               const at::Tensor& col_offsets_t, const at::Tensor& row_indices_t, const at::Tensor& perm_t,
               const at::Tensor& row_order, const at::Tensor& col_order) {
  check_operand(x, 2, kDsd, "x");
  check_operand(data, 3, kDsd, "data");
  check_same_device(data, x, kDsd, "data", "x");
  check_same_dtype(data, x, kDsd, "data", "x");
  const int block = check_block(data.size(1), data.size(2), kDsd, "data block shape");
  const Pattern pat = check_pattern(row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t, perm_t,
                                    row_order, col_order, data.size(0), x, kDsd);
  const int64_t n = pat.n_block_rows * block, k = pat.n_block_cols * block;
  PBSNG_CHECK_VALUE(x.size(1) == k, kDsd, ": x.shape=", shape_str(x), " must be (M, in_features=", k,
                    ") for a weight of ", pat.n_block_cols, " block columns of ", block);
  check_rows(x.size(0), 128, kDsd, "x");
  const at::Tensor* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    b = &*bias;
    check_cuda(*b, kDsd, "bias");
    check_same_device(*b, x, kDsd, "bias", "x");
    check_same_dtype(*b, x, kDsd, "bias", "x");
    check_contiguous(*b, kDsd, "bias");
    PBSNG_CHECK_VALUE(b->dim() == 1 && b->size(0) == n, kDsd, ": bias.shape=", shape_str(*b),
                      " must be (out_features=", n, ",)");
  }
  ProductDeviceGuard guard(x.device());
  const int64_t m = x.size(0);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  if (m >= 1 && m <= g_decode_max_rows) {
    at::Tensor y = at::empty({m, n}, x.options());
    DsdParams p{x.data_ptr(), data.data_ptr(), b ? b->data_ptr() : nullptr, y.data_ptr(), nullptr,
                row_offsets.data_ptr<int32_t>(), col_indices.data_ptr<int32_t>(), nullptr, nullptr, m, pat.nnz,
                int(pat.n_block_rows), int(pat.n_block_cols), block, 1, 0, 0};
    p.programmatic = programmatic_launch_for(x.device().index());
    check_launch(dtype_of(x) == DType::kFloat16 ? launch_dsd_decode<DType::kFloat16>(p, stream)
                                                : launch_dsd_decode<DType::kBFloat16>(p, stream), kDsd);
    return y;
  }
  const int64_t sms = multiprocessor_count(x.device().index());
  const int64_t groups = block == 64 ? (pat.n_block_rows + 1) / 2 : pat.n_block_rows;  // lines per tile: 2 / 1
  const int64_t line_steps = pat.n_block_rows > 0 ? pat.nnz * (block / 64) / pat.n_block_rows : 0;
  // Few rows of M: R x ceil(M / 128) CTAs cannot fill the GPU. From 128 to 255 rows the SM80 kernel then takes
  // 64-row tiles (twice the CTAs); H100, 4096 x 4096, blocks 64 / 128, densities 0.1-1.0: 0.63-1.0x the time of
  // 128-row tiles at M = 128-224 in all 32 cells, but up to 1.15x at M = 72-96, where the second tile is mostly
  // empty (benchmarks/results/ab_dsd_rows64_*.txt). Then, if still too few, each block row's blocks are split
  // over several CTAs (fp32 partial sums, added with the bias by the tile's last CTA).
  const int64_t tile_rows = m >= 128 && m < 256 && pat.n_block_rows * ((m + 127) / 128) < sms ? 64 : 128;
  const int64_t ctas = pat.n_block_rows * ((m + tile_rows - 1) / tile_rows);
  const int few_rows_split = few_rows_split_for(Product::kDsd, x.device().index(), block, m, pat.nnz,
                                                pat.n_block_rows * pat.n_block_cols, groups * ((m + 127) / 128),
                                                line_steps, sms, ctas >= sms);
  // Blocks of 128 from 256 rows: the Hopper kernel, even on too few CTAs for one wave, beat the split SM80 kernel
  // once it had >= 32 tiles (lines x 256-token tiles): H100, 4096 x 4096 and 1024 -> 4096, M = 256-768,
  // 0.40-1.01x its time in all 40 cells; with 8-24 tiles (4096 -> 1024) 0.92-2.2x, and blocks of 64 1.1-1.17x
  // on 4096 x 4096 at M = 256, up to 2.5x on 4096 -> 1024 (benchmarks/results/ab_dsd_hopper_few_tiles_*.txt).
  // The few-rows dsd (few_rows_split_for) splits inside its clusters, never across kernels.
  const bool hopper = few_rows_split > 0 ||
                      (use_hopper_for(x.device().index(), block, m, pat.nnz) &&
                       !mid_rows_sm80_for(block, m, groups * ((m + 255) / 256), sms) &&
                       (block != 32 || b32_hopper_for(pat.n_block_rows, m, pat.nnz,
                                                      pat.n_block_rows * pat.n_block_cols, sms)));
  // Blocks of 32 have no split Hopper kernel: where it runs, it runs whole.
  const bool hopper_without_split =
      few_rows_split > 0 || (hopper && block == 32) ||
      (hopper && block == 128 && pat.n_block_rows * ((m + 255) / 256) >= 32);
  int64_t splits = 1;
  if (!hopper_without_split && pat.nnz > 0 && ctas > 0 && ctas < sms) {
    // Each split keeps >= 512 of the row's K (on average): below that the splits cost more than the parallelism
    // gains (measured on H200, M = 1, 4096 x 4096, when a split also cost a memset, a bias add and a cast kernel).
    const int64_t k_per_row = (pat.nnz + pat.n_block_rows - 1) / pat.n_block_rows * block;
    splits = std::max<int64_t>(1, std::min<int64_t>({(2 * sms + ctas - 1) / ctas, k_per_row / 512, 64}));
  }
  at::Tensor y = at::empty({m, n}, x.options());
  // A split's partial sums: a slice each, summed in the kernel by the tile's last CTA (kernel_sm80.cuh,
  // finish_split_tile); any contents at the launch.
  at::Tensor parts = splits > 1 ? at::empty({splits, m, n}, x.options().dtype(at::kFloat)) : at::Tensor();
  DsdParams p{x.data_ptr(), data.data_ptr(), b ? b->data_ptr() : nullptr, y.data_ptr(),
              splits > 1 ? parts.data_ptr<float>() : nullptr, row_offsets.data_ptr<int32_t>(),
              col_indices.data_ptr<int32_t>(), row_order.data_ptr<int32_t>(), nullptr, m, pat.nnz,
              int(pat.n_block_rows), int(pat.n_block_cols), block, int(splits), int(sms), int(g_hopper_stages),
              int(tile_rows), few_rows_split};
  p.b32_columns = b32_columns();  // read by the block-32 Hopper kernel only
  p.b32_pair_boxes = b32_pair_boxes_for(pat.nnz, pat.n_block_rows * pat.n_block_cols);
  p.programmatic = programmatic_launch_for(x.device().index());
  if (splits == 1 && hopper) {
    // The few-rows dsd deals its tiles round-robin (its clusters take the same tiles): no counter.
    p.tile_counter = few_rows_split > 0 ? nullptr : tile_counter_for(x, stream);
    check_launch(dtype_of(x) == DType::kFloat16 ? launch_dsd_sm90<DType::kFloat16>(p, stream)
                                                : launch_dsd_sm90<DType::kBFloat16>(p, stream), kDsd);
  } else {
    if (splits > 1) p.split_counters = self_resetting_counters(x, stream, ctas);  // one per output tile
    check_launch(dtype_of(x) == DType::kFloat16 ? launch_dsd_sm80<DType::kFloat16>(p, stream)
                                                : launch_dsd_sm80<DType::kBFloat16>(p, stream), kDsd);
  }
  return y;
}

at::Tensor dds_on(const std::optional<c10::cuda::CUDAStream>& work_stream, const at::Tensor& dy,
                  const at::Tensor& data, const at::Tensor& row_offsets, const at::Tensor& col_indices,
                  const at::Tensor& row_indices, const at::Tensor& col_offsets_t, const at::Tensor& row_indices_t,
                  const at::Tensor& perm_t, const at::Tensor& row_order, const at::Tensor& col_order) {
  check_operand(dy, 2, kDds, "dy");
  check_operand(data, 3, kDds, "data");
  check_same_device(data, dy, kDds, "data", "dy");
  check_same_dtype(data, dy, kDds, "data", "dy");
  const int block = check_block(data.size(1), data.size(2), kDds, "data block shape");
  const Pattern pat = check_pattern(row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t, perm_t,
                                    row_order, col_order, data.size(0), dy, kDds);
  const int64_t n = pat.n_block_rows * block, k = pat.n_block_cols * block;
  PBSNG_CHECK_VALUE(dy.size(1) == n, kDds, ": dy.shape=", shape_str(dy), " must be (M, out_features=", n,
                    ") for a weight of ", pat.n_block_rows, " block rows of ", block);
  check_rows(dy.size(0), 128, kDds, "dy");
  ProductDeviceGuard guard(dy.device());
  at::Tensor dx = at::empty({dy.size(0), k}, dy.options());
  // dx comes from the caller's stream; the launch (and the tile counter, allocated in that stream's order) goes
  // to work_stream when given.
  std::optional<c10::cuda::CUDAStreamGuard> on_work_stream;
  if (work_stream.has_value()) on_work_stream.emplace(*work_stream);
  DdsParams p{dy.data_ptr(), data.data_ptr(), dx.data_ptr(), col_offsets_t.data_ptr<int32_t>(),
              row_indices_t.data_ptr<int32_t>(), perm_t.data_ptr<int32_t>(), col_order.data_ptr<int32_t>(), nullptr,
              dy.size(0), pat.nnz,
              int(pat.n_block_rows), int(pat.n_block_cols), block, multiprocessor_count(dy.device().index()),
              int(g_hopper_stages)};
  // Lines are the block columns here, their keys the block rows.
  const int64_t groups = block == 64 ? (pat.n_block_cols + 1) / 2 : pat.n_block_cols;
  const int64_t line_steps = pat.n_block_cols > 0 ? pat.nnz * (block / 64) / pat.n_block_cols : 0;
  p.few_rows_split = few_rows_split_for(Product::kDds, dy.device().index(), block, p.m, pat.nnz,
                                        pat.n_block_rows * pat.n_block_cols, groups * ((p.m + 127) / 128),
                                        line_steps, p.sms);
  p.b32_columns = b32_columns();  // read by the block-32 Hopper kernel only
  p.b32_pair_boxes = b32_pair_boxes_for(pat.nnz, pat.n_block_rows * pat.n_block_cols);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dy.device().index()).stream();
  p.programmatic = programmatic_launch_for(dy.device().index());
  if (p.few_rows_split > 0) {
    check_launch(dtype_of(dy) == DType::kFloat16 ? launch_dds_sm90<DType::kFloat16>(p, stream)
                                                 : launch_dds_sm90<DType::kBFloat16>(p, stream), kDds);
  } else if (use_hopper_for(dy.device().index(), block, dy.size(0), pat.nnz) &&
             !mid_rows_sm80_for(block, p.m, groups * ((p.m + 255) / 256), p.sms) &&
             (block != 32 || b32_hopper_for(pat.n_block_cols, p.m, pat.nnz, pat.n_block_rows * pat.n_block_cols,
                                            p.sms))) {
    p.tile_counter = tile_counter_for(dy, stream);
    // Blocks of 32: W's blocks transposed into a workspace of the work stream, freed (stream-ordered) on return.
    at::Tensor data_t;
    if (block == 32 && b32_dds_copy_for(pat.nnz, pat.n_block_rows * pat.n_block_cols)) {
      data_t = at::empty({pat.nnz, 32, 32}, data.options());
      p.data_t = data_t.data_ptr();
    }
    check_launch(dtype_of(dy) == DType::kFloat16 ? launch_dds_sm90<DType::kFloat16>(p, stream)
                                                 : launch_dds_sm90<DType::kBFloat16>(p, stream), kDds);
  } else {
    check_launch(dtype_of(dy) == DType::kFloat16 ? launch_dds_sm80<DType::kFloat16>(p, stream)
                                                 : launch_dds_sm80<DType::kBFloat16>(p, stream), kDds);
  }
  return dx;
}

at::Tensor dds(const at::Tensor& dy, const at::Tensor& data, const at::Tensor& row_offsets,
               const at::Tensor& col_indices, const at::Tensor& row_indices, const at::Tensor& col_offsets_t,
               const at::Tensor& row_indices_t, const at::Tensor& perm_t, const at::Tensor& row_order,
               const at::Tensor& col_order) {
  return dds_on(std::nullopt, dy, data, row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t, perm_t,
                row_order, col_order);
}

// Returns (dW_b, the bias gradient dy.sum(0) when with_bias, else None). The Hopper sdd sums dy in its own
// pipeline (no extra pass over dy); the SM80 path leaves the sum to ATen.
std::tuple<at::Tensor, std::optional<at::Tensor>> sdd(
    const at::Tensor& dy, const at::Tensor& x, const at::Tensor& row_offsets, const at::Tensor& col_indices,
    const at::Tensor& row_indices, const at::Tensor& col_offsets_t, const at::Tensor& row_indices_t,
    const at::Tensor& perm_t, const at::Tensor& row_order, const at::Tensor& col_order,
    std::vector<int64_t> block_shape, bool with_bias) {
  check_operand(dy, 2, kSdd, "dy");
  check_operand(x, 2, kSdd, "x");
  check_same_device(x, dy, kSdd, "x", "dy");
  check_same_dtype(x, dy, kSdd, "x", "dy");
  PBSNG_CHECK_VALUE(block_shape.size() == 2, kSdd, ": block_shape must have 2 entries, got ", block_shape.size());
  const int block = check_block(block_shape[0], block_shape[1], kSdd, "block_shape");
  check_defined(col_indices, kSdd, "col_indices");
  const Pattern pat = check_pattern(row_offsets, col_indices, row_indices, col_offsets_t, row_indices_t, perm_t,
                                    row_order, col_order, col_indices.numel(), dy, kSdd);
  const int64_t n = pat.n_block_rows * block, k = pat.n_block_cols * block;
  PBSNG_CHECK_VALUE(dy.size(1) == n, kSdd, ": dy.shape=", shape_str(dy), " must be (M, out_features=", n, ")");
  PBSNG_CHECK_VALUE(x.size(1) == k, kSdd, ": x.shape=", shape_str(x), " must be (M, in_features=", k, ")");
  PBSNG_CHECK_VALUE(x.size(0) == dy.size(0), kSdd, ": x.shape=", shape_str(x), " and dy.shape=", shape_str(dy),
                    " must have the same number of rows M");
  ProductDeviceGuard guard(dy.device());
  const int64_t m = dy.size(0), nnz = pat.nnz;
  const int64_t sms = multiprocessor_count(dy.device().index());
  const bool hopper = block == 32 ? b32_sdd_hopper_for(dy.device().index(), m, nnz, pat.n_block_rows, pat.n_block_cols)
                                  : use_hopper_for(dy.device().index(), block, m, nnz) &&
                                        (block != 64 || nnz >= g_hopper_sdd_min_blocks_per_row * pat.n_block_rows);
  const bool one_block_ctas = hopper && block == 128 && sdd_b128_one_block_ctas(m, nnz, sms);  // M unsplit
  int64_t splits = 1;
  if (hopper) {
    // One CTA per (block row, chunk of its blocks), estimated as nnz / chunk plus, per row, half a chunk's free
    // entries (partial chunks; the host does not read the pattern). See sdd_sm90_splits for the split of M.
    // Blocks of 32: one CTA per row pair and chunk of its union, M unsplit.
    if (block != 32 && !one_block_ctas) {
      const int64_t chunk = sdd_sm90_chunk(block);
      const int64_t ctas =
          std::max<int64_t>(1, (2 * nnz + pat.n_block_rows * (chunk - 1) + 2 * chunk - 1) / (2 * chunk));
      splits = sdd_sm90_splits(block, ctas, sms, (m + 63) / 64, nnz);
    }
  } else if (nnz > 0) {
    // Split the reduction over M across CTAs when there are too few kept blocks to fill the GPU.
    const int64_t k_tiles = (m + sdd_k_tile_rows(block) - 1) / sdd_k_tile_rows(block);
    const int64_t target_ctas = 2 * sms;
    if (nnz < target_ctas) {
      splits = std::min<int64_t>((target_ctas + nnz - 1) / nnz, std::max<int64_t>(1, k_tiles / 8));
    }
  }
  splits = std::min<int64_t>(splits, 65535);
  const bool fused_bias = with_bias && hopper;
  const int64_t size = nnz * block * block;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dy.device().index()).stream();
  // Blocks of 128 split in 2 sum the pieces in the kernel (kernel_sm90_sdd.cuh): no memset, no cast kernels,
  // and a deterministic result (a + b = b + a whichever piece finishes last). H100, 8192 x 4096 -> 4096 at
  // density 0.1: 7.7 % faster eagerly, 2.3 % in a graph; with 5 and 6 pieces (16384 x 1024 -> 4096) 2-12 %
  // slower, the last piece adding up the others' alone (benchmarks/results/ab_sdd_split_pieces_*.txt).
  const int64_t split_items = sdd_sm90_split_items(nnz, pat.n_block_rows);
  const bool split_pieces = hopper && block == 128 && splits == 2 &&
                            sdd_sm90_piece_floats(split_items * splits) * int64_t(sizeof(float)) <= (int64_t(64) << 20);
  at::Tensor out, bias_grad, sums_f32, pieces;
  if (splits > 1 && !split_pieces) {  // one fp32 buffer, zeroed by a memset node (less host time than at::zeros):
                                      // the blocks, then the bias gradient
    sums_f32 = at::empty({size + (fused_bias ? n : 0)}, dy.options().dtype(at::kFloat));
    const cudaError_t err = cudaMemsetAsync(sums_f32.data_ptr(), 0, sums_f32.numel() * sizeof(float), stream);
    TORCH_CHECK(err == cudaSuccess, cat(kSdd, ": zeroing the fp32 partial sums failed: ", cudaGetErrorString(err)));
  } else {
    out = at::empty({nnz, block, block}, dy.options());
    if (fused_bias) bias_grad = at::empty({n}, dy.options());
  }
  const bool sums_f32_path = splits > 1 && !split_pieces;
  float* f32 = sums_f32_path ? sums_f32.data_ptr<float>() : nullptr;
  SddParams p{dy.data_ptr(), x.data_ptr(), sums_f32_path ? nullptr : out.data_ptr(), f32,
              fused_bias && !sums_f32_path ? bias_grad.data_ptr() : nullptr,
              fused_bias && sums_f32_path ? f32 + size : nullptr, row_offsets.data_ptr<int32_t>(),
              row_indices.data_ptr<int32_t>(), col_indices.data_ptr<int32_t>(), m, nnz, int(pat.n_block_rows),
              int(pat.n_block_cols), block, int(splits)};
  p.row_order = row_order.data_ptr<int32_t>();
  p.one_block_ctas = one_block_ctas;
  at::Tensor x_t;
  if (hopper && block == 32) {
    p.b32_mode = b32_sdd_mode(nnz, pat.n_block_rows, pat.n_block_cols, sms);
    if (p.b32_mode == 3) {  // a workspace for x^T (K, M), rows padded to 8 tokens (16-byte TMA strides)
      const int64_t row = (m + 7) / 8 * 8;
      x_t = at::empty({k, row}, x.options());
      p.x_t = x_t.data_ptr();
      p.x_t_row = row;
    }
  }
  if (split_pieces) {
    pieces = at::empty({sdd_sm90_piece_floats(split_items * splits)}, dy.options().dtype(at::kFloat));
    // The piece that finishes an item last zeroes its counter again (kernel_sm90_sdd.cuh).
    p.tail_ws = pieces.data_ptr<float>();
    p.tail_counters = self_resetting_counters(dy, stream, 2 * split_items);
  }
  // The one-block sdd's bias gradient: each block CTA's part of its row's sum, and a counter per row
  // (kernel_sm90_sdd_cpasync.cuh).
  at::Tensor bias_parts;
  if (one_block_ctas && fused_bias) {
    bias_parts = at::empty({nnz * block}, dy.options().dtype(at::kFloat));
    p.tail_ws = bias_parts.data_ptr<float>();
    p.tail_counters = self_resetting_counters(dy, stream, pat.n_block_rows);
  }
  // The tail split (kernel_sm90_sdd.cuh, blocks of 128): when the working CTAs may exceed a wave (at most
  // nnz / chunk + 2 R of them) and M has room for two pieces of kTailMinSteps (16) steps, a workspace and zeroed
  // counters; the kernel decides whether there is a tail to split.
  at::Tensor tail;
  if (hopper && block == 128 && splits == 1 && !one_block_ctas && g_hopper_sdd_tail_split && (m + 63) / 64 >= 32 &&
      (nnz + sdd_sm90_chunk(block) - 1) / sdd_sm90_chunk(block) + 2 * pat.n_block_rows > sms) {
    const int64_t floats = sdd_sm90_tail_floats(sms), counters = sdd_sm90_tail_counters(sms);
    tail = at::empty({floats}, dy.options().dtype(at::kFloat));
    // The piece that finishes an item last zeroes its counter again (kernel_sm90_sdd.cuh).
    p.sms = int(sms);
    p.tail_ws = tail.data_ptr<float>();
    p.tail_counters = self_resetting_counters(dy, stream, counters);
  }
  p.programmatic = programmatic_launch_for(dy.device().index());
  if (hopper) {
    check_launch(dtype_of(dy) == DType::kFloat16 ? launch_sdd_sm90<DType::kFloat16>(p, stream)
                                                 : launch_sdd_sm90<DType::kBFloat16>(p, stream), kSdd);
  } else {
    check_launch(dtype_of(dy) == DType::kFloat16 ? launch_sdd_sm80<DType::kFloat16>(p, stream)
                                                 : launch_sdd_sm80<DType::kBFloat16>(p, stream), kSdd);
  }
  if (sums_f32_path) {
    out = sums_f32.narrow(0, 0, size).view({nnz, block, block}).to(dy.scalar_type());
    if (fused_bias) bias_grad = sums_f32.narrow(0, size, n).to(dy.scalar_type());
  }
  std::optional<at::Tensor> bias_result;
  if (with_bias) bias_result = fused_bias ? bias_grad : dy.sum(0);
  return {out, bias_result};
}

namespace {

// True when this build holds kernels that run on the given device (checked through the CUDA runtime).
bool device_supported(int64_t device) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || device < 0 || device >= count) {
    cudaGetLastError();
    return false;
  }
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const cudaError_t err = kernel_image_status();
  cudaGetLastError();  // clear a sticky-free error such as cudaErrorNoKernelImageForDevice
  return err == cudaSuccess;
}

}  // namespace
}  // namespace pbsng

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "pytorch_block_sparse_ng CUDA kernels (use them through pytorch_block_sparse_ng._ops)";
  m.def("dsd", &pbsng::dsd, "y (M, N) = x (M, K) W^T + bias", pybind11::arg("x"), pybind11::arg("data"),
        pybind11::arg("bias"), pybind11::arg("row_offsets"), pybind11::arg("col_indices"),
        pybind11::arg("row_indices"), pybind11::arg("col_offsets_t"), pybind11::arg("row_indices_t"),
        pybind11::arg("perm_t"), pybind11::arg("row_order"), pybind11::arg("col_order"));
  m.def("dds", &pbsng::dds, "dx (M, K) = dy (M, N) W", pybind11::arg("dy"), pybind11::arg("data"),
        pybind11::arg("row_offsets"), pybind11::arg("col_indices"), pybind11::arg("row_indices"),
        pybind11::arg("col_offsets_t"), pybind11::arg("row_indices_t"), pybind11::arg("perm_t"),
        pybind11::arg("row_order"), pybind11::arg("col_order"));
  m.def("sdd", &pbsng::sdd, "(dW_b [nnz, B, B] = dy^T x on the kept blocks, dy.sum(0) if with_bias else None)",
        pybind11::arg("dy"), pybind11::arg("x"), pybind11::arg("row_offsets"), pybind11::arg("col_indices"),
        pybind11::arg("row_indices"), pybind11::arg("col_offsets_t"), pybind11::arg("row_indices_t"),
        pybind11::arg("perm_t"), pybind11::arg("row_order"), pybind11::arg("col_order"),
        pybind11::arg("block_shape"), pybind11::arg("with_bias") = false);
  m.def("linear", &pbsng::linear,
        "y = x W^T + bias with its backward (dds, sdd, bias sum) attached as a C++ autograd node (eager mode)",
        pybind11::arg("x"), pybind11::arg("data"), pybind11::arg("bias"), pybind11::arg("index"));
  m.def("linear_backward", &pbsng::linear_backward,
        "(dx, dW_b, db) of linear from dy, each None unless wanted; dds and sdd on two streams when both are wanted",
        pybind11::arg("dy"), pybind11::arg("x"), pybind11::arg("data"), pybind11::arg("index"),
        pybind11::arg("want_x"), pybind11::arg("want_data"), pybind11::arg("want_bias"));
  m.def("device_supported", &pbsng::device_supported, "whether this build has kernels for the device",
        pybind11::arg("device"));
  m.def("set_hopper_kernels", &pbsng::set_hopper_kernels,
        "use (True, default) or not the sm_90a wgmma kernels on Hopper GPUs; returns the previous setting",
        pybind11::arg("enabled"));
  m.def("set_hopper_tile_schedule", &pbsng::set_hopper_tile_schedule,
        "Hopper dsd / dds tile schedule: 0 auto (default), 1 counter, 2 round-robin; returns the previous one",
        pybind11::arg("schedule"));
  m.def("uses_hopper_kernels", &pbsng::hopper_device,
        "whether dsd / dds on this device and block size use the Hopper kernels (for M >= the minimum rows)",
        pybind11::arg("device"), pybind11::arg("block"));
  m.def("set_hopper_sdd_min_blocks_per_row", &pbsng::set_hopper_sdd_min_blocks_per_row,
        "the Hopper sdd with blocks of 64 needs nnz >= this x block rows (default 3); returns the previous value",
        pybind11::arg("blocks"));
  m.def("set_hopper_pipeline_stages", &pbsng::set_hopper_pipeline_stages,
        "pipeline stages of the Hopper dsd / dds, 3 or 4 (default); returns the previous value",
        pybind11::arg("stages"));
  m.def("set_hopper_sdd_one_block_ctas", &pbsng::set_hopper_sdd_one_block_ctas,
        "A/B and test knob: the block-128 Hopper sdd with one CTA per block (cp.async) by its rule (-1), never (0) "
        "or always (1); returns the previous setting", pybind11::arg("mode"));
  m.def("set_hopper_sdd_tail_split", &pbsng::set_hopper_sdd_tail_split,
        "split the Hopper sdd's last partial wave of CTAs over M (blocks of 128; True, default); returns the previous "
        "setting",
        pybind11::arg("enabled"));
  m.def("set_hopper_sdd_splits", &pbsng::set_hopper_sdd_splits,
        "splits of M for the Hopper sdd with blocks of 64 / 128: -1 auto (default) or 1-64 (at most one per 64-token "
        "step); returns the previous value",
        pybind11::arg("splits"));
  m.def("set_hopper_sdd_b32_mode", &pbsng::set_hopper_sdd_b32_mode,
        "the block-32 Hopper sdd's tile: -1 auto (default), 0 row pairs x columns, 1 row pairs x column pairs, 2 row "
        "quads x column pairs; returns the previous mode",
        pybind11::arg("mode"));
  m.def("set_hopper_b32_pair_boxes", &pbsng::set_hopper_b32_pair_boxes,
        "TMA boxes of two blocks in the block-32 Hopper dsd / dds: -1 auto (default: activation pairs, both kinds "
        "from density 2/3), 0 neither, 1 a line's two W blocks, 2 two columns' activation tiles, 3 both; returns the "
        "previous value",
        pybind11::arg("bits"));
  m.def("set_hopper_b32_columns", &pbsng::set_hopper_b32_columns,
        "block columns per pipeline stage of the block-32 Hopper dsd / dds: -1 auto (default), 1 or 2; returns the "
        "previous value",
        pybind11::arg("columns"));
  m.def("set_hopper_b32_dds_copy", &pbsng::set_hopper_b32_dds_copy,
        "the block-32 Hopper dds on a transposed copy of the weight's blocks: -1 auto (default: from density 0.2), "
        "0 off, 1 always; returns the previous mode",
        pybind11::arg("mode"));
  m.def("set_hopper_blocks_of_32", &pbsng::set_hopper_blocks_of_32,
        "the Hopper dsd / dds / sdd for blocks of 32: -1 auto (default), 0 off, 1 wherever the Hopper kernels run; returns "
        "the previous mode",
        pybind11::arg("mode"));
  m.def("set_hopper_few_rows_split", &pbsng::set_hopper_few_rows_split,
        "dsd and dds with few rows of M on Hopper: -1 (default) picks 128-token tiles split over 1, 2, 4 or 8 CTAs of "
        "a cluster by the rules in bindings.cpp, 0 never, 1 / 2 / 4 / 8 that split wherever the Hopper kernels run; "
        "returns the previous value",
        pybind11::arg("split"));
  m.def("set_programmatic_launch", &pbsng::set_programmatic_launch,
        "launch the kernels with programmatic dependent launch on sm_90 GPUs (True, default: each may start while "
        "the kernel before it finishes); returns the previous setting",
        pybind11::arg("enabled"));
  m.def("set_hopper_min_rows", &pbsng::set_hopper_min_rows,
        "the fewest rows M for which dsd / dds take the Hopper kernels; returns the previous value",
        pybind11::arg("rows"));
  m.def("set_decode_max_rows", &pbsng::set_decode_max_rows,
        "dsd with at most this many rows of M (0-64, default 64) takes the decode kernel; returns the previous value",
        pybind11::arg("rows"));
  m.def("set_backward_overlap", &pbsng::set_backward_overlap,
        "whether linear's backward runs the dds on a second stream beside the sdd; returns the previous setting",
        pybind11::arg("enabled"));
  m.def("supported_block_sizes", []() { return std::vector<int64_t>{32, 64, 128}; });
  m.attr("BUILD_ARCHS") = PBSNG_BUILD_ARCHS;
}
