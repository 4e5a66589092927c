// The block-128 Hopper sdd for few blocks: one CTA of one warpgroup per kept block, two CTAs per SM, tiles loaded
// by cp.async from the same threads that issue the wgmma (STK's shape: no TMA, no warp specialization).
// bindings.cpp (sdd_b128_one_block_ctas) takes it for 2048 to 3072 tokens and half the SMs' count of blocks to
// twice it, where the TMA sdd of kernel_sm90_sdd.cuh runs about one two-block CTA per SM and receives less per SM
// (Nsight at 256 blocks: ~50 KB per us per SM against ~74 for this kernel and STK's) and where the layer's backward
// (the dds beside it) measured faster with it. benchmarks/results/ab_sdd_cpasync_*.txt has the measurements.
//
// The 128 x 128 tile of dW_b = dy^T x: tokens are the reduction, BK tokens per stage in S stages of dy^T and x
// tiles (MN-major, 128-byte swizzle), two m64n128k16 wgmma per 16 tokens. With the bias gradient, the CTAs of a
// row's blocks share the sum of its dy^T tile over the tokens (against a tile of ones): each sums its own range of
// the token tiles, into an fp32 workspace, and the row's last CTA to finish adds the parts up in block order (a
// deterministic result). With one CTA summing all of a row's tiles the bias cost +16 % at 256 blocks, spread ~+14 %:
// the m64n8 wgmma against the ones cost far more than their FLOPs (without them, the rest of the bias path ~+2 %;
// session 38). Rows without blocks get CTAs of their own that only sum. M unsplit; the results leave by plain
// stores.
#pragma once

#include "block_sparse/kernel_sm80.cuh"
#include "block_sparse/kernel_sm90_sdd.cuh"

namespace pbsng {
namespace sm90sddcp {

template <class T> struct GmmaAtom;  // 64 x 128 x 16, both operands MN-major
template <> struct GmmaAtom<cute::half_t> {
  using type = cute::SM90_64x128x16_F32F16F16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::MN>;
};
template <> struct GmmaAtom<cute::bfloat16_t> {
  using type = cute::SM90_64x128x16_F32BF16BF16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::MN>;
};

template <class T_>
struct Config {
  using T = T_;
  static constexpr int kBlock = 128, BK = 32, S = 4, kThreads = 128;
  using SmemLayout = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<T>{},
                                                  cute::make_shape(cute::Int<kBlock>{}, cute::Int<BK>{},
                                                                   cute::Int<S>{})));
  using TiledMma = decltype(cute::make_tiled_mma(typename GmmaAtom<T>::type{}));
  using SumMma = decltype(cute::make_tiled_mma(typename sm90sdd::GmmaSumAtom<T>::type{}));
  using SmemLayoutOnes = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_INTER_Atom<T>{},
                                                      cute::make_shape(cute::Int<8>{}, cute::Int<BK>{})));
  static constexpr int kTileElems = int(cute::cosize(SmemLayout{}));
  // dy^T and x stages, the ones, and room to align the stages to 1024 bytes (the swizzle's period).
  static constexpr int kSmemBytes = (2 * kTileElems + 8 * BK) * int(sizeof(T)) + 1024;
  // 16-byte chunks each thread copies per stage and operand: 16 per token row.
  static constexpr int kChunks = kBlock * BK / 8 / kThreads;
  static_assert(kThreads % 16 == 0 && kChunks * kThreads / 16 == BK, "chunks: 16 per token row");
};

struct Params {
  const void* dy;  // (m, n)
  const void* x;   // (m, k)
  void* out;       // [nnz, 128, 128]
  void* bias_grad;  // (n,), or nullptr: no bias sum (and no CTAs for rows without blocks)
  float* bias_parts;  // [nnz, 128] fp32: each block CTA's part of its row's sum (rows of two blocks or more)
  int* bias_counters;  // [n / 128], zero at the launch; the row's last CTA zeroes its counter again
  const int32_t* row_offsets;
  const int32_t* row_indices;
  const int32_t* col_indices;
  int64_t m, n, k;
  int nnz;
};

// The bias gradient of a row summed in parts (one per block CTA, in bias_parts): the CTA that finishes last adds
// them up in block order, then zeroes the row's counter for the next launch.
template <class Cfg>
__device__ __forceinline__ void finish_row_sum(const Params& p, int row, int first, int count) {
  if (!sm80::last_cta_to_arrive(p.bias_counters + row, count)) return;
  constexpr int B = Cfg::kBlock;
  if (threadIdx.x < B) {
    float sum = 0.f;
    for (int j = 0; j < count; ++j) sum += __ldcg(p.bias_parts + int64_t(first + j) * B + threadIdx.x);
    static_cast<typename Cfg::T*>(p.bias_grad)[int64_t(row) * B + threadIdx.x] = typename Cfg::T(sum);
  }
  if (threadIdx.x == 0) p.bias_counters[row] = 0;
}

// The CTA's tile in block row `row`: kBlocks, its block `block` (dy^T x); kSum, a part of the sum of the row's dy^T
// tile over the tokens (the bias gradient of the row's 128 features): the row's parts are slots [first, first +
// count) of bias_parts, and slot `block` sums token tiles [tiles j / count, tiles (j + 1) / count), j = block - first.
// A row without blocks is summed whole by one CTA (block = first = 0, count = 1: no slot).
template <class Cfg, bool kBlocks, bool kSum>
__device__ __forceinline__ void run_tile(const Params& p, int row, int block, int first, int count, char* smem_raw) {
  using namespace cute;
  using T = typename Cfg::T;
  constexpr int S = Cfg::S, BK = Cfg::BK, kChunks = Cfg::kChunks, B = Cfg::kBlock;
  T* smem = reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  Tensor sA = make_tensor(make_smem_ptr(smem), typename Cfg::SmemLayout{});  // (128, BK, S)
  Tensor sB = make_tensor(make_smem_ptr(smem + Cfg::kTileElems), typename Cfg::SmemLayout{});
  T* ones = smem + 2 * Cfg::kTileElems;
  const int tid = int(threadIdx.x);
  if constexpr (kSum) {
    for (int i = tid; i < 8 * BK; i += Cfg::kThreads) ones[i] = T(1.0f);
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read by wgmma after the loop's barrier
  }
  const T* dy = static_cast<const T*>(p.dy) + int64_t(row) * B;
  const T* x = static_cast<const T*>(p.x) + int64_t(kBlocks ? __ldg(p.col_indices + block) : 0) * B;
  const int tiles = int((p.m + BK - 1) / BK), whole_tiles = int(p.m / BK);
  const int part = block - first;
  const int sum_begin = int(int64_t(tiles) * part / count), sum_end = int(int64_t(tiles) * (part + 1) / count);

  // Each thread copies the same 16-byte column chunk r of token rows k0 + 8 i (i < kChunks) in every stage. The
  // destinations come from the swizzled tensor (a GMMA atom's swizzle applies to the smem pointer, not to the
  // layout as an integer function); the global pointers live in registers and move by one tile per issue (a 64-bit
  // multiply per stage stalled the warps longer than the data did, Nsight). Issues come in order t = 0, 1, ...
  const int r = (tid % 16) * 8, k0 = tid / 16;
  uint32_t dst_a[kChunks], dst_b[kChunks];
  const T* src_a[kChunks];
  const T* src_b[kChunks];
  CUTE_UNROLL
  for (int i = 0; i < kChunks; ++i) {
    dst_a[i] = cast_smem_ptr_to_uint(raw_pointer_cast(&sA(r, k0 + 8 * i, 0)));
    dst_b[i] = cast_smem_ptr_to_uint(raw_pointer_cast(&sB(r, k0 + 8 * i, 0)));
    src_a[i] = dy + int64_t(k0 + 8 * i) * p.n + r;
    src_b[i] = x + int64_t(k0 + 8 * i) * p.k + r;
  }
  const int64_t tile_a = int64_t(BK) * p.n, tile_b = int64_t(BK) * p.k;
  constexpr uint32_t kStageBytes = B * BK * sizeof(T);
  uint32_t stage_bytes = 0;
  auto issue = [&](int t) {
    if (t < whole_tiles) {
      CUTE_UNROLL
      for (int i = 0; i < kChunks; ++i) {
        sm80::cp_async_16(dst_a[i] + stage_bytes, src_a[i]);
        if constexpr (kBlocks) sm80::cp_async_16(dst_b[i] + stage_bytes, src_b[i]);
      }
    } else if (t < tiles) {  // the last tile: token rows past M zero-filled
      const int left = int(p.m - int64_t(t) * BK) - k0;  // chunk i is in range iff 8 i < left
      CUTE_UNROLL
      for (int i = 0; i < kChunks; ++i) {
        const bool in = 8 * i < left;
        sm80::cp_async_16_zfill(dst_a[i] + stage_bytes, in ? src_a[i] : dy, in);
        if constexpr (kBlocks) sm80::cp_async_16_zfill(dst_b[i] + stage_bytes, in ? src_b[i] : x, in);
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < kChunks; ++i) {
      src_a[i] += tile_a;
      src_b[i] += tile_b;
    }
    stage_bytes = stage_bytes == (S - 1) * kStageBytes ? 0u : stage_bytes + kStageBytes;
    cp_async_fence();  // one group per tile, empty past the last
  };

  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, S)
  Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));
  Tensor acc = partition_fragment_C(mma, Shape<Int<B>, Int<B>>{});
  typename Cfg::SumMma sum_mma;
  auto thr_sum = sum_mma.get_thread_slice(tid);
  Tensor tSrA = thr_sum.make_fragment_A(thr_sum.partition_A(sA));
  Tensor tSrOnes = thr_sum.make_fragment_B(thr_sum.partition_B(
      make_tensor(make_smem_ptr(ones), typename Cfg::SmemLayoutOnes{})));
  Tensor bias_acc = partition_fragment_C(sum_mma, Shape<Int<B>, _8>{});
  clear(acc);
  clear(bias_acc);

  CUTE_UNROLL
  for (int s = 0; s < S - 1; ++s) issue(s);
  // One token tile: its wgmma, with the sum's when with_sum is true.
  auto step = [&](int t, auto with_sum) {
    // Tile t has landed (this thread's copies; the barrier: every thread's). No proxy fence between the cp.async
    // writes and the wgmma reads, as in CUTLASS's and Triton's cp.async + wgmma mainloops: the fence compiled to
    // MEMBAR.ALL.CTA and cost ~7 % here (Nsight).
    cp_async_wait<S - 2>();
    __syncthreads();
    const int stage = t % S;
    warpgroup_fence_operand(acc);
    warpgroup_fence_operand(bias_acc);
    warpgroup_arrive();
    if constexpr (kBlocks) gemm(mma, tCrA(_, _, _, stage), tCrB(_, _, _, stage), acc);
    if constexpr (decltype(with_sum)::value) gemm(sum_mma, tSrA(_, _, _, stage), tSrOnes, bias_acc);
    warpgroup_commit_batch();
    warpgroup_wait<1>();  // the wgmma of tile t - 1 are done (this warp) ...
    warpgroup_fence_operand(acc);
    warpgroup_fence_operand(bias_acc);
    __syncthreads();  // ... and in every warp: their stage takes tile t + S - 1
    issue(t + S - 1);
  };
  // Three loops, not a condition around the sum's wgmma: with one, ptxas injects warpgroup.arrive (C7519).
  int t = 0;
  if constexpr (kSum) {
    CUTE_NO_UNROLL
    for (; t < sum_begin; ++t) step(t, false_type{});
    CUTE_NO_UNROLL
    for (; t < sum_end; ++t) step(t, true_type{});
  }
  CUTE_NO_UNROLL
  for (; t < tiles; ++t) step(t, false_type{});
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
  warpgroup_fence_operand(bias_acc);
  cp_async_wait<0>();

  if constexpr (kSum) {  // every column of bias_acc holds the sum: column 0 is stored
    Tensor bias_coord = thr_sum.partition_C(make_identity_tensor(Shape<Int<B>, _8>{}));
    float* slot = count > 1 ? p.bias_parts + int64_t(block) * B : nullptr;
    CUTE_UNROLL
    for (int i = 0; i < size(bias_acc); ++i) {
      if (get<1>(bias_coord(i)) != 0) continue;
      if (slot) {
        slot[get<0>(bias_coord(i))] = bias_acc(i);
      } else {
        static_cast<T*>(p.bias_grad)[int64_t(row) * B + get<0>(bias_coord(i))] = T(bias_acc(i));
      }
    }
    if (slot) finish_row_sum<Cfg>(p, row, first, count);
  }
  if constexpr (kBlocks) {
    T* out = static_cast<T*>(p.out) + int64_t(block) * B * B;
    Tensor coord = thr_mma.partition_C(make_identity_tensor(Shape<Int<B>, Int<B>>{}));
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {  // values i, i + 1: columns c, c + 1 of one row
      const int rr = get<0>(coord(i)), c = get<1>(coord(i));
      T pair[2] = {T(acc(i)), T(acc(i + 1))};
      *reinterpret_cast<uint32_t*>(out + rr * B + c) = *reinterpret_cast<const uint32_t*>(pair);
    }
  }
}

// Grid: nnz CTAs, one per block, which with the bias gradient also sum their part of their row's tokens; then, with
// the bias gradient, one CTA per block row, which sums the row's bias if the row has no blocks (else it exits).
template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 2) sdd_cpasync_kernel(const __grid_constant__ Params p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ char smem_raw[];
  const int cta = int(blockIdx.x);
  wait_for_previous_grid_and_release_next();  // before any global access (grid_dependency.cuh)
  if (cta >= p.nnz) {
    const int row = cta - p.nnz;
    if (__ldg(p.row_offsets + row) == __ldg(p.row_offsets + row + 1)) {
      run_tile<Cfg, false, true>(p, row, 0, 0, 1, smem_raw);
    }
    return;
  }
  const int row = __ldg(p.row_indices + cta);
  const int first = __ldg(p.row_offsets + row), count = __ldg(p.row_offsets + row + 1) - first;
  if (p.bias_grad != nullptr) {
    run_tile<Cfg, true, true>(p, row, cta, first, count, smem_raw);
  } else {
    run_tile<Cfg, true, false>(p, row, cta, first, count, smem_raw);
  }
#else
  __trap();
#endif
}

template <class Cfg>
cudaError_t launch(const SddParams& p, cudaStream_t stream) {
  const int rows = p.bias_grad ? p.n_block_rows : 0;
  if (p.nnz + rows == 0) return cudaSuccess;
  // With the bias gradient: the rows' parts and counters (SddParams::tail_ws / tail_counters).
  if (p.bias_grad && (p.tail_ws == nullptr || p.tail_counters == nullptr)) return cudaErrorInvalidValue;
  Params q{p.dy, p.x, p.out, p.bias_grad, p.tail_ws, p.tail_counters, p.row_offsets, p.row_indices, p.col_indices, p.m,
           int64_t(p.n_block_rows) * Cfg::kBlock, int64_t(p.n_block_cols) * Cfg::kBlock, int(p.nnz)};
  // Two CTAs of ~66 KB per SM: the carveout at its largest.
  const cudaError_t err =
      sm80::prepare<sdd_cpasync_kernel<Cfg>>(Cfg::kSmemBytes, int(cudaSharedmemCarveoutMaxShared));
  if (err != cudaSuccess) return err;
  return launch_kernel(sdd_cpasync_kernel<Cfg>, dim3(unsigned(p.nnz + rows)), Cfg::kThreads, Cfg::kSmemBytes, stream,
                       p.programmatic, 1, q);
}

}  // namespace sm90sddcp
}  // namespace pbsng
