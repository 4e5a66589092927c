// Block-sparse products on SM80 tensor cores (mma.sync), written with CuTe. Runs on Ampere and Hopper.
//
//   dsd:  y  (M, N) = x  (M, K) W^T + bias   CTA tile BM x B, loops over the blocks of one block row
//   dds:  dx (M, K) = dy (M, N) W            CTA tile BM x B, loops over the blocks of one block column
//   sdd:  dW_b (B, B) = dy^T x, kept blocks  CTA tile B x B, loops over M (optionally split over CTAs)
//
// One mainloop serves all three: a k-tile source tells, for k-tile t, where the A tile (BM x BK) and the
// B tile (BN x BK) lie in global memory, their leading dimension and how many of their rows (K-major) or
// k-columns (MN-major) are in range. Tiles go global -> shared with 16-byte cp.async (zero-filled outside
// the range), `Stages` deep, into swizzled layouts; shared -> registers with ldmatrix (.trans for MN-major
// operands); SM80_16x8x16 MMAs accumulate in fp32.
//
// Layouts of the operands (row-major tensors in memory):
//   dsd  A = x          K-major (rows of M, contiguous K)    B = data[j]  K-major  (B rows of N, contiguous K)
//   dds  A = dy         K-major                              B = data[p]  MN-major (element (n, k) at k*B + n)
//   sdd  A = dy^T tile  MN-major (element (i, k) at k*N + i) B = x^T tile MN-major
//
// Constraints: fp16 or bf16 inputs, fp32 accumulation, output in the input dtype; square blocks of 32, 64 or
// 128; K and N multiples of the block; every pointer 16-byte aligned; any M (>= 0): rows past M are zero-filled
// on load and never stored. Index contents are trusted (built by layout.py); sizes are checked by bindings.cpp.
#pragma once

#include <atomic>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>

#include "block_sparse/grid_dependency.cuh"
#include "block_sparse/params.h"

namespace pbsng {
namespace sm80 {

template <class T> struct MmaAtomFor;
template <> struct MmaAtomFor<cute::half_t> { using type = cute::SM80_16x8x16_F32F16F16F32_TN; };
template <> struct MmaAtomFor<cute::bfloat16_t> { using type = cute::SM80_16x8x16_F32BF16BF16F32_TN; };

template <DType D> struct ElementFor;
template <> struct ElementFor<DType::kFloat16> { using type = cute::half_t; };
template <> struct ElementFor<DType::kBFloat16> { using type = cute::bfloat16_t; };

// Shared-memory layout of one operand: Rows x BK per stage, `Stages` stages, swizzled for conflict-free
// cp.async stores and ldmatrix loads. KMajor: contiguous along k; else contiguous along the rows (MN-major).
template <class T, int Rows, int BK, int Stages, bool KMajor>
struct SmemOperand {
  static constexpr int kContig = KMajor ? BK : Rows;          // extent of the contiguous dimension
  static constexpr int kW = kContig >= 64 ? 64 : kContig;     // swizzle atom width (elements)
  static_assert(kW == 32 || kW == 64, "tile extent along the contiguous dimension must be 32 or a multiple of 64");
  static constexpr int kSwizzleBits = kW == 64 ? 3 : 2;
  using AtomLayout = std::conditional_t<KMajor,
      cute::Layout<cute::Shape<cute::_8, cute::Int<kW>>, cute::Stride<cute::Int<kW>, cute::_1>>,
      cute::Layout<cute::Shape<cute::Int<kW>, cute::_8>, cute::Stride<cute::_1, cute::Int<kW>>>>;
  using Atom = decltype(cute::composition(cute::Swizzle<kSwizzleBits, 3, 3>{}, AtomLayout{}));
  using Layout = decltype(cute::tile_to_shape(
      Atom{}, cute::make_shape(cute::Int<Rows>{}, cute::Int<BK>{}, cute::Int<Stages>{})));
  // ldmatrix: plain for K-major, transposing for MN-major.
  using S2RAtom = cute::Copy_Atom<std::conditional_t<KMajor, cute::SM75_U32x4_LDSM_N, cute::SM75_U16x8_LDSM_T>, T>;
};

// One kernel configuration.
template <class T_, int BM_, int BN_, int BK_, int WM, int WN, int Stages_, bool AKMajor_, bool BKMajor_>
struct Config {
  using T = T_;
  static constexpr int BM = BM_, BN = BN_, BK = BK_, Stages = Stages_;
  static constexpr bool AKMajor = AKMajor_, BKMajor = BKMajor_;
  static constexpr int kThreads = 32 * WM * WN;
  using SmemA = SmemOperand<T, BM, BK, Stages, AKMajor>;
  using SmemB = SmemOperand<T, BN, BK, Stages, BKMajor>;
  // WM x WN warps; each permutation tile is 16 rows x 16 columns per warp, so that one ldmatrix.x4 feeds
  // two n8 MMAs of B.
  using TiledMma = cute::TiledMMA<cute::MMA_Atom<typename MmaAtomFor<T>::type>,
                                  cute::Layout<cute::Shape<cute::Int<WM>, cute::Int<WN>, cute::_1>>,
                                  cute::Tile<cute::Int<16 * WM>, cute::Int<16 * WN>, cute::_16>>;
  static_assert(BM % (16 * WM) == 0 && BN % (16 * WN) == 0 && BK % 16 == 0, "tile does not fit the warps");
  static constexpr int kSmemBytes =
      int(sizeof(T)) * (int(cute::cosize(typename SmemA::Layout{})) + int(cute::cosize(typename SmemB::Layout{})));
};

// Where one operand tile of k-tile t lies: element (r, k) at ptr[r * ld + k] (K-major) or ptr[k * ld + r]
// (MN-major); rows r >= valid (K-major) or columns k >= valid (MN-major) are out of range (zero-filled).
template <class T>
struct TileAddr {
  const T* ptr;
  int64_t ld;
  int64_t valid;
};

// 16 bytes global -> shared (address `dst` in the shared window); zeros where !in_range (gmem not read).
__device__ __forceinline__ void cp_async_16_zfill(unsigned dst, const void* gmem, bool in_range) {
  const int src_bytes = in_range ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_16_zfill(void* smem, const void* gmem, bool in_range) {
  cp_async_16_zfill(cute::cast_smem_ptr_to_uint(smem), gmem, in_range);
}
// The same, always in range (no source-size operand).
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem));
}

// Issue the cp.async copies of one Rows x BK operand tile into stage `stage` (all threads of the CTA).
template <int Rows, int BK, int NThreads, bool KMajor, class T, class SLayout>
__device__ __forceinline__ void load_tile_async(T* smem, SLayout const& layout, int stage, TileAddr<T> const& a) {
  constexpr int kChunks = Rows * BK / 8;  // 16-byte chunks
  static_assert(kChunks % NThreads == 0, "tile chunks must divide among the threads");
  CUTE_UNROLL
  for (int i = 0; i < kChunks / NThreads; ++i) {
    const int c = int(threadIdx.x) + i * NThreads;
    int r, k;
    bool ok;
    const T* src;
    if constexpr (KMajor) {
      r = c / (BK / 8);
      k = (c % (BK / 8)) * 8;
      ok = r < a.valid;
      src = a.ptr + int64_t(r) * a.ld + k;
    } else {
      r = (c % (Rows / 8)) * 8;
      k = c / (Rows / 8);
      ok = k < a.valid;
      src = a.ptr + int64_t(k) * a.ld + r;
    }
    cp_async_16_zfill(smem + layout(r, k, stage), ok ? src : a.ptr, ok);
  }
}

// The pipelined mainloop: accumulates sum over k-tiles t < num_tiles of A_t B_t^T into tCrC.
// Src provides: `Desc fetch(int t) const` (global index loads for tile t, done one iteration ahead) and
// `void tiles(int t, Desc, TileAddr<T>& a, TileAddr<T>& b) const`.
template <class Cfg, class Src, class Accum>
__device__ __forceinline__ void mainloop(Accum& tCrC, char* smem_raw, int num_tiles, Src const& src) {
  using namespace cute;
  using T = typename Cfg::T;
  using LayoutA = typename Cfg::SmemA::Layout;
  using LayoutB = typename Cfg::SmemB::Layout;
  constexpr int S = Cfg::Stages;

  T* smem_a = reinterpret_cast<T*>(smem_raw);
  T* smem_b = smem_a + cosize(LayoutA{});
  Tensor sA = make_tensor(make_smem_ptr(smem_a), LayoutA{});  // (BM, BK, S)
  Tensor sB = make_tensor(make_smem_ptr(smem_b), LayoutB{});  // (BN, BK, S)

  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_slice(threadIdx.x);
  Tensor tCrA = thr_mma.partition_fragment_A(sA(_, _, 0));  // (MMA, MMA_M, MMA_K)
  Tensor tCrB = thr_mma.partition_fragment_B(sB(_, _, 0));  // (MMA, MMA_N, MMA_K)

  auto s2r_a = make_tiled_copy_A(typename Cfg::SmemA::S2RAtom{}, mma);
  auto s2r_thr_a = s2r_a.get_slice(threadIdx.x);
  Tensor tXsA = s2r_thr_a.partition_S(sA);  // (CPY, MMA_M, MMA_K, S)
  Tensor tXrA = s2r_thr_a.retile_D(tCrA);
  auto s2r_b = make_tiled_copy_B(typename Cfg::SmemB::S2RAtom{}, mma);
  auto s2r_thr_b = s2r_b.get_slice(threadIdx.x);
  Tensor tXsB = s2r_thr_b.partition_S(sB);  // (CPY, MMA_N, MMA_K, S)
  Tensor tXrB = s2r_thr_b.retile_D(tCrB);
  constexpr int KB = decltype(size<2>(tCrA))::value;

  auto next = src.fetch(0);
  auto issue = [&](int t) {  // loads of k-tile t into stage t % S, then the index loads of tile t + 1
    if (t < num_tiles) {
      TileAddr<T> a, b;
      src.tiles(t, next, a, b);
      load_tile_async<Cfg::BM, Cfg::BK, Cfg::kThreads, Cfg::AKMajor>(smem_a, LayoutA{}, t % S, a);
      load_tile_async<Cfg::BN, Cfg::BK, Cfg::kThreads, Cfg::BKMajor>(smem_b, LayoutB{}, t % S, b);
      next = src.fetch(t + 1);
    }
    cp_async_fence();
  };

  CUTE_UNROLL
  for (int s = 0; s < S - 1; ++s) issue(s);

  CUTE_NO_UNROLL
  for (int t = 0; t < num_tiles; ++t) {
    cp_async_wait<S - 2>();  // tile t has landed (for this thread) ...
    __syncthreads();         // ... for all threads, and stage (t - 1) % S is no longer read
    issue(t + S - 1);
    const int stage = t % S;
    copy(s2r_a, tXsA(_, _, 0, stage), tXrA(_, _, 0));
    copy(s2r_b, tXsB(_, _, 0, stage), tXrB(_, _, 0));
    CUTE_UNROLL
    for (int kb = 0; kb < KB; ++kb) {
      if (kb + 1 < KB) {
        copy(s2r_a, tXsA(_, _, kb + 1, stage), tXrA(_, _, kb + 1));
        copy(s2r_b, tXsB(_, _, kb + 1, stage), tXrB(_, _, kb + 1));
      }
      gemm(mma, tCrA(_, _, kb), tCrB(_, _, kb), tCrC);
    }
  }
  cp_async_wait<0>();  // no copy may still target shared memory when the CTA exits
}

template <class T> struct Pair;
template <> struct Pair<cute::half_t> {
  using type = __half2;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2half2_rn(a, b); }
};
template <> struct Pair<cute::bfloat16_t> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type make(float a, float b) { return __floats2bfloat162_rn(a, b); }
};

// Store the CTA's BM x BN accumulator tile at out (row stride ld), rows >= rows_valid skipped, plus an
// optional bias over the tile's columns. Accumulator elements (i, i + 1), i even, are adjacent columns.
template <class Cfg, class Accum>
__device__ __forceinline__ void store_tile(Accum const& tCrC, typename Cfg::T* out, int64_t ld, int64_t rows_valid,
                                           const typename Cfg::T* bias) {
  using namespace cute;
  using T = typename Cfg::T;
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_slice(threadIdx.x);
  Tensor cC = make_identity_tensor(make_shape(Int<Cfg::BM>{}, Int<Cfg::BN>{}));
  Tensor tCcC = thr_mma.partition_C(cC);
  static_assert(decltype(size<0>(tCcC))::value % 2 == 0, "accumulator pairs");
  CUTE_UNROLL
  for (int i = 0; i < size(tCrC); i += 2) {
    const int r = get<0>(tCcC(i));
    const int c = get<1>(tCcC(i));
    if (r < rows_valid) {
      float v0 = tCrC(i), v1 = tCrC(i + 1);
      if (bias != nullptr) {
        v0 += float(bias[c]);
        v1 += float(bias[c + 1]);
      }
      *reinterpret_cast<typename Pair<T>::type*>(out + int64_t(r) * ld + c) = Pair<T>::make(v0, v1);
    }
  }
}

// Add the CTA's accumulator tile into an fp32 tile at out (row stride ld), rows >= rows_valid skipped.
template <class Cfg, class Accum>
__device__ __forceinline__ void add_tile_atomic(Accum const& tCrC, float* out, int64_t ld, int64_t rows_valid) {
  using namespace cute;
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_slice(threadIdx.x);
  Tensor tCcC = thr_mma.partition_C(make_identity_tensor(make_shape(Int<Cfg::BM>{}, Int<Cfg::BN>{})));
  CUTE_UNROLL
  for (int i = 0; i < size(tCrC); ++i) {
    const int r = get<0>(tCcC(i));
    if (r < rows_valid) atomicAdd(out + int64_t(r) * ld + get<1>(tCcC(i)), tCrC(i));
  }
}

// Threadfence reduction (CUDA programming guide): each CTA has written its partial results; it counts itself on
// `counter` and learns whether it is the last of `arrivals` CTAs, which then reads the others' results (from L2:
// __ldcg) and must zero the counter for the next launch. Every thread of the CTA calls it.
__device__ __forceinline__ bool last_cta_to_arrive(int* counter, int arrivals) {
  __shared__ int last;
  __threadfence();  // this CTA's results are visible GPU-wide before the CTA is counted
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(counter, 1) == arrivals - 1;
  __syncthreads();
  if (!last) return false;
  __threadfence();
  return true;
}

// One of `splits` CTAs of an output tile: stores its fp32 partial sums into its slice (blockIdx.z) of the parts
// (slice 0's tile at `parts`, slices `slice` floats apart, rows ld apart); the last of the tile's CTAs to finish
// (its `counter`, zero at the launch) adds the slices in split order (the same bits whichever CTA finishes last)
// and the bias, stores the tile rounded (rows >= rows_valid skipped) and zeroes the counter for the next launch. No
// zeroed workspace, no extra kernels.
template <class Cfg, class Accum>
__device__ __forceinline__ void finish_split_tile(Accum const& tCrC, float* parts, int64_t slice, int64_t ld,
                                                  int64_t rows_valid, int splits, int* counter,
                                                  typename Cfg::T* out, const typename Cfg::T* bias) {
  using namespace cute;
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_slice(threadIdx.x);
  Tensor tCcC = thr_mma.partition_C(make_identity_tensor(make_shape(Int<Cfg::BM>{}, Int<Cfg::BN>{})));
  // Accumulator elements (i, i + 1), i even, are adjacent columns (store_tile): one 8-byte access per pair.
  float* own = parts + blockIdx.z * slice;
  CUTE_UNROLL
  for (int i = 0; i < size(tCrC); i += 2) {
    const int r = get<0>(tCcC(i));
    if (r < rows_valid) *reinterpret_cast<float2*>(own + r * ld + get<1>(tCcC(i))) = make_float2(tCrC(i), tCrC(i + 1));
  }
  if (!last_cta_to_arrive(counter, splits)) return;
  // Each thread sums a fixed column pair of every (kThreads / kPairsPerRow)-th row (row-contiguous accesses), a
  // batch of rows at a time whose loads of one slice are all in flight together: slice after slice one pair at a
  // time, the loads were latency-bound (slower than the old zeroing, bias and cast kernels at 4 splits). Batches,
  // not all rows: each pending row holds registers (the accumulators' are free by now).
  using T = typename Cfg::T;
  constexpr int kPairsPerRow = Cfg::BN / 2, kRowStep = Cfg::kThreads / kPairsPerRow, kRows = Cfg::BM / kRowStep;
  constexpr int kMaxBatch = Cfg::BN == 32 ? 4 : 8;  // blocks of 32: 8 took 64 registers, one CTA per SM fewer
  constexpr int kBatch = kRows < kMaxBatch ? kRows : kMaxBatch;
  static_assert(Cfg::kThreads % kPairsPerRow == 0 && Cfg::BM % kRowStep == 0 && kRows % kBatch == 0, "whole pairs");
  const int c = int(threadIdx.x) % kPairsPerRow * 2, r0 = int(threadIdx.x) / kPairsPerRow;
  for (int batch = 0; batch < kRows; batch += kBatch) {
    float2 sum[kBatch];
    CUTE_UNROLL
    for (int i = 0; i < kBatch; ++i) sum[i] = make_float2(0.f, 0.f);
    for (int z = 0; z < splits; ++z) {
      const float* part = parts + z * slice + c;
      CUTE_UNROLL
      for (int i = 0; i < kBatch; ++i) {
        const int r = r0 + (batch + i) * kRowStep;
        if (r < rows_valid) {  // L2 loads (__ldcg): the other CTAs' slices never passed through this SM's L1
          const float2 v = __ldcg(reinterpret_cast<const float2*>(part + r * ld));
          sum[i].x += v.x;
          sum[i].y += v.y;
        }
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < kBatch; ++i) {
      const int r = r0 + (batch + i) * kRowStep;
      if (r < rows_valid) {
        float v0 = sum[i].x, v1 = sum[i].y;
        if (bias != nullptr) {
          v0 += float(bias[c]);
          v1 += float(bias[c + 1]);
        }
        *reinterpret_cast<typename Pair<T>::type*>(out + r * ld + c) = Pair<T>::make(v0, v1);
      }
    }
  }
  if (threadIdx.x == 0) *counter = 0;
}

// ---------------------------------------------------------------------------------------------- dsd
template <class Cfg>
struct DsdSource {
  using T = typename Cfg::T;
  static constexpr int kTilesPerBlock = Cfg::BN / Cfg::BK;  // block is BN x BN; k runs along its columns
  const T* x_tile;   // x + m0 * K
  const T* data;
  const int32_t* col_indices;
  int begin, end;    // blocks of the block row
  int64_t ldx;       // K
  int64_t rows_valid;
  __device__ int fetch(int t) const {
    const int j = begin + t / kTilesPerBlock;
    return j < end ? __ldg(col_indices + j) : 0;
  }
  __device__ void tiles(int t, int col, TileAddr<T>& a, TileAddr<T>& b) const {
    const int j = begin + t / kTilesPerBlock;
    const int k0 = (t % kTilesPerBlock) * Cfg::BK;
    a = {x_tile + int64_t(col) * Cfg::BN + k0, ldx, rows_valid};
    b = {data + int64_t(j) * Cfg::BN * Cfg::BN + k0, Cfg::BN, Cfg::BN};
  }
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dsd_kernel(DsdParams p) {
  using T = typename Cfg::T;
  extern __shared__ __align__(128) char smem[];
  const int r = blockIdx.x;  // block row: neighbouring CTAs share the x tile, the weights stay in L2
  const int64_t m0 = int64_t(blockIdx.y) * Cfg::BM;
  wait_for_previous_grid_and_release_next();  // before any global access (grid_dependency.cuh)
  const int64_t K = int64_t(p.n_block_cols) * Cfg::BN, N = int64_t(p.n_block_rows) * Cfg::BN;
  const int row_begin = __ldg(p.row_offsets + r);
  const int count = __ldg(p.row_offsets + r + 1) - row_begin;
  const int per_split = (count + p.splits - 1) / p.splits;  // this CTA's share of the row's blocks
  const int begin = row_begin + min(count, int(blockIdx.z) * per_split);
  const int end = row_begin + min(count, int(blockIdx.z + 1) * per_split);

  typename Cfg::TiledMma mma;
  auto tCrC = partition_fragment_C(mma, cute::Shape<cute::Int<Cfg::BM>, cute::Int<Cfg::BN>>{});
  cute::clear(tCrC);
  const T* x = static_cast<const T*>(p.x);
  DsdSource<Cfg> src{x + m0 * K, static_cast<const T*>(p.data), p.col_indices, begin, end, K, p.m - m0};
  const int num_tiles = (end - begin) * DsdSource<Cfg>::kTilesPerBlock;
  if (num_tiles > 0) mainloop<Cfg>(tCrC, smem, num_tiles, src);
  const T* bias = static_cast<const T*>(p.bias);
  T* y_tile = static_cast<T*>(p.y) + m0 * N + int64_t(r) * Cfg::BN;
  const T* tile_bias = bias == nullptr ? nullptr : bias + int64_t(r) * Cfg::BN;
  if (p.splits == 1) {
    store_tile<Cfg>(tCrC, y_tile, N, p.m - m0, tile_bias);
  } else {
    finish_split_tile<Cfg>(tCrC, p.parts + m0 * N + int64_t(r) * Cfg::BN, p.m * N, N, p.m - m0, p.splits,
                           p.split_counters + int64_t(blockIdx.y) * gridDim.x + blockIdx.x, y_tile, tile_bias);
  }
}

// ---------------------------------------------------------------------------------------------- dds
template <class Cfg>
struct DdsSource {
  using T = typename Cfg::T;
  static constexpr int kTilesPerBlock = Cfg::BN / Cfg::BK;  // k runs along the block's rows
  struct Desc { int row, perm; };
  const T* dy_tile;  // dy + m0 * N
  const T* data;
  const int32_t* row_indices_t;
  const int32_t* perm_t;
  int begin, end;
  int64_t ldy;       // N
  int64_t rows_valid;
  __device__ Desc fetch(int t) const {
    const int j = begin + t / kTilesPerBlock;
    if (j >= end) return {0, 0};
    return {__ldg(row_indices_t + j), __ldg(perm_t + j)};
  }
  __device__ void tiles(int t, Desc d, TileAddr<T>& a, TileAddr<T>& b) const {
    const int k0 = (t % kTilesPerBlock) * Cfg::BK;
    a = {dy_tile + int64_t(d.row) * Cfg::BN + k0, ldy, rows_valid};
    b = {data + int64_t(d.perm) * Cfg::BN * Cfg::BN + int64_t(k0) * Cfg::BN, Cfg::BN, Cfg::BK};
  }
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dds_kernel(DdsParams p) {
  using T = typename Cfg::T;
  extern __shared__ __align__(128) char smem[];
  const int c = blockIdx.x;  // block column of W = block of columns of dx
  const int64_t m0 = int64_t(blockIdx.y) * Cfg::BM;
  wait_for_previous_grid_and_release_next();  // before any global access (grid_dependency.cuh)
  const int64_t K = int64_t(p.n_block_cols) * Cfg::BN, N = int64_t(p.n_block_rows) * Cfg::BN;
  const int begin = __ldg(p.col_offsets_t + c);
  const int end = __ldg(p.col_offsets_t + c + 1);

  typename Cfg::TiledMma mma;
  auto tCrC = partition_fragment_C(mma, cute::Shape<cute::Int<Cfg::BM>, cute::Int<Cfg::BN>>{});
  cute::clear(tCrC);
  DdsSource<Cfg> src{static_cast<const T*>(p.dy) + m0 * N, static_cast<const T*>(p.data), p.row_indices_t,
                     p.perm_t, begin, end, N, p.m - m0};
  const int num_tiles = (end - begin) * DdsSource<Cfg>::kTilesPerBlock;
  if (num_tiles > 0) mainloop<Cfg>(tCrC, smem, num_tiles, src);
  store_tile<Cfg>(tCrC, static_cast<T*>(p.dx) + m0 * K + int64_t(c) * Cfg::BN, K, p.m - m0, nullptr);
}

// ---------------------------------------------------------------------------------------------- sdd
template <class Cfg>
struct SddSource {
  using T = typename Cfg::T;
  struct Desc {};
  const T* dy_col;   // dy + r * B: column block of dy
  const T* x_col;    // x + c * B
  int64_t N, K, m;
  int64_t t0;        // first k-tile of this split
  __device__ Desc fetch(int) const { return {}; }
  __device__ void tiles(int t, Desc, TileAddr<T>& a, TileAddr<T>& b) const {
    const int64_t k0 = (t0 + t) * Cfg::BK;
    a = {dy_col + k0 * N, N, m - k0};
    b = {x_col + k0 * K, K, m - k0};
  }
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) sdd_kernel(SddParams p) {
  using T = typename Cfg::T;
  using namespace cute;
  extern __shared__ __align__(128) char smem[];
  const int64_t j = blockIdx.x;
  const int split = blockIdx.y;
  wait_for_previous_grid_and_release_next();  // before any global access (grid_dependency.cuh)
  const int64_t K = int64_t(p.n_block_cols) * Cfg::BN, N = int64_t(p.n_block_rows) * Cfg::BM;
  const int r = __ldg(p.row_indices + j), c = __ldg(p.col_indices + j);
  const int64_t total = (p.m + Cfg::BK - 1) / Cfg::BK;
  const int64_t per_split = (total + p.splits - 1) / p.splits;
  const int64_t t0 = min(total, int64_t(split) * per_split);
  const int64_t t1 = min(total, t0 + per_split);

  typename Cfg::TiledMma mma;
  auto tCrC = partition_fragment_C(mma, Shape<Int<Cfg::BM>, Int<Cfg::BN>>{});
  clear(tCrC);
  SddSource<Cfg> src{static_cast<const T*>(p.dy) + int64_t(r) * Cfg::BM, static_cast<const T*>(p.x) + int64_t(c) * Cfg::BN,
                     N, K, p.m, t0};
  if (t1 > t0) mainloop<Cfg>(tCrC, smem, int(t1 - t0), src);

  if (p.splits == 1) {
    store_tile<Cfg>(tCrC, static_cast<T*>(p.out) + j * Cfg::BM * Cfg::BN, Cfg::BN, Cfg::BM, nullptr);
  } else if (t1 > t0) {
    add_tile_atomic<Cfg>(tCrC, p.out_f32 + j * Cfg::BM * Cfg::BN, Cfg::BN, Cfg::BM);
  }
}

// ---------------------------------------------------------------------------------------------- launch
// Raise the kernel's dynamic shared-memory limit, and with carveout >= 0 set its preferred shared-memory carveout,
// once per device (host calls that cost microseconds).
template <auto Kernel>
inline cudaError_t prepare(int smem_bytes, int carveout = -1) {
  if (smem_bytes <= 48 * 1024) return cudaSuccess;
  static std::atomic<unsigned long long> done{0};  // one bit per device, per kernel instantiation
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const unsigned long long bit = device < 64 ? (1ull << device) : 0ull;
  if (bit != 0 && (done.load(std::memory_order_relaxed) & bit)) return cudaSuccess;
  err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err == cudaSuccess && carveout >= 0) {
    err = cudaFuncSetAttribute(Kernel, cudaFuncAttributePreferredSharedMemoryCarveout, carveout);
  }
  if (err == cudaSuccess) done.fetch_or(bit, std::memory_order_relaxed);
  return err;
}

template <class Cfg>
cudaError_t launch_dsd(const DsdParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n_block_rows == 0) return cudaSuccess;
  auto kernel = dsd_kernel<Cfg>;
  cudaError_t err = prepare<dsd_kernel<Cfg>>(Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 grid(p.n_block_rows, unsigned((p.m + Cfg::BM - 1) / Cfg::BM), unsigned(p.splits));
  return launch_kernel(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, p.programmatic, 1, p);
}

template <class Cfg>
cudaError_t launch_dds(const DdsParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n_block_cols == 0) return cudaSuccess;
  auto kernel = dds_kernel<Cfg>;
  cudaError_t err = prepare<dds_kernel<Cfg>>(Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 grid(p.n_block_cols, unsigned((p.m + Cfg::BM - 1) / Cfg::BM));
  return launch_kernel(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, p.programmatic, 1, p);
}

template <class Cfg>
cudaError_t launch_sdd(const SddParams& p, cudaStream_t stream) {
  if (p.nnz == 0) return cudaSuccess;
  auto kernel = sdd_kernel<Cfg>;
  cudaError_t err = prepare<sdd_kernel<Cfg>>(Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 grid(unsigned(p.nnz), unsigned(p.splits));
  return launch_kernel(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, p.programmatic, 1, p);
}

// Tile configurations per block size. Config<T, BM, BN, BK, warps M, warps N, stages, A K-major, B K-major>.
template <class T, int Block> struct DsdConfig;
template <class T> struct DsdConfig<T, 32> { using type = Config<T, 128, 32, 32, 4, 1, 4, true, true>; };
template <class T> struct DsdConfig<T, 64> { using type = Config<T, 128, 64, 64, 2, 2, 3, true, true>; };
template <class T> struct DsdConfig<T, 128> { using type = Config<T, 128, 128, 64, 2, 4, 3, true, true>; };

// 64 rows of M per CTA: twice the CTAs of 128-row tiles where those are too few (bindings.cpp: 128 <= M < 256).
template <class T, int Block> struct DsdConfigRows64;
template <class T> struct DsdConfigRows64<T, 32> { using type = Config<T, 64, 32, 32, 4, 1, 4, true, true>; };
template <class T> struct DsdConfigRows64<T, 64> { using type = Config<T, 64, 64, 64, 2, 2, 4, true, true>; };
template <class T> struct DsdConfigRows64<T, 128> { using type = Config<T, 64, 128, 64, 2, 4, 3, true, true>; };

// The dsd with DsdParams::tile_rows (64 or 128) rows of M per CTA.
template <class T, int Block>
cudaError_t launch_dsd_rows(const DsdParams& p, cudaStream_t stream) {
  return p.tile_rows == 64 ? launch_dsd<typename DsdConfigRows64<T, Block>::type>(p, stream)
                           : launch_dsd<typename DsdConfig<T, Block>::type>(p, stream);
}

template <class T, int Block> struct DdsConfig;
template <class T> struct DdsConfig<T, 32> { using type = Config<T, 128, 32, 32, 4, 1, 4, true, false>; };
template <class T> struct DdsConfig<T, 64> { using type = Config<T, 128, 64, 64, 2, 2, 3, true, false>; };
template <class T> struct DdsConfig<T, 128> { using type = Config<T, 128, 128, 64, 2, 4, 3, true, false>; };

template <class T, int Block> struct SddConfig;
template <class T> struct SddConfig<T, 32> { using type = Config<T, 32, 32, 64, 2, 2, 4, false, false>; };
template <class T> struct SddConfig<T, 64> { using type = Config<T, 64, 64, 64, 2, 2, 3, false, false>; };
template <class T> struct SddConfig<T, 128> { using type = Config<T, 128, 128, 32, 2, 4, 4, false, false>; };

}  // namespace sm80
}  // namespace pbsng

// The dsd launcher for one dtype: 128 or 64 rows of M per CTA (DsdParams::tile_rows).
#define PBSNG_DEFINE_DSD_LAUNCHER(DTYPE)                                                             \
  namespace pbsng {                                                                                  \
  template <>                                                                                        \
  cudaError_t launch_dsd_sm80<DTYPE>(const DsdParams& p, cudaStream_t stream) {                      \
    using T = sm80::ElementFor<DTYPE>::type;                                                          \
    switch (p.block) {                                                                               \
      case 32: return sm80::launch_dsd_rows<T, 32>(p, stream);                                       \
      case 64: return sm80::launch_dsd_rows<T, 64>(p, stream);                                       \
      case 128: return sm80::launch_dsd_rows<T, 128>(p, stream);                                     \
      default: return cudaErrorInvalidValue;                                                         \
    }                                                                                                \
  }                                                                                                  \
  }

// Explicit specializations of the launchers in params.h for one dtype (one .cu file per product and dtype).
#define PBSNG_DEFINE_LAUNCHER(OP, OPCFG, PARAMS, DTYPE)                                              \
  namespace pbsng {                                                                                  \
  template <>                                                                                        \
  cudaError_t launch_##OP##_sm80<DTYPE>(const PARAMS& p, cudaStream_t stream) {                      \
    using T = sm80::ElementFor<DTYPE>::type;                                                          \
    switch (p.block) {                                                                               \
      case 32: return sm80::launch_##OP<sm80::OPCFG<T, 32>::type>(p, stream);                        \
      case 64: return sm80::launch_##OP<sm80::OPCFG<T, 64>::type>(p, stream);                        \
      case 128: return sm80::launch_##OP<sm80::OPCFG<T, 128>::type>(p, stream);                      \
      default: return cudaErrorInvalidValue;                                                         \
    }                                                                                                \
  }                                                                                                  \
  }
