// dsd (y = x W^T + bias) on Hopper tensor cores: wgmma (sm_90a), written with CuTe. Experimental first step of
// the Hopper path (doc/kernels.md).
//
// Same structure as dsd_kernel in kernel_sm80.cuh (one CTA per block row x 128 rows of M x split of the row's
// blocks, gather by index with 16-byte cp.async, zero-filled past M), but the tiles live in the GMMA 128-byte
// swizzled K-major layout and two warpgroups issue 64 x B x 16 wgmma instructions from shared memory (SS).
// The loads for tile t + S - 1 are issued while the wgmma of tile t run.
//
// Constraints: sm_90a only (the sm_80 cubin of this file holds a trap); fp16 / bf16; blocks 64 and 128.
#pragma once

#include "block_sparse/kernel_sm80.cuh"

namespace pbsng {
namespace sm90 {

template <class T, int BN> struct GmmaAtom;
template <> struct GmmaAtom<cute::half_t, 64> {
  using type = cute::SM90_64x64x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
};
template <> struct GmmaAtom<cute::half_t, 128> {
  using type = cute::SM90_64x128x16_F32F16F16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
};
template <> struct GmmaAtom<cute::bfloat16_t, 64> {
  using type = cute::SM90_64x64x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
};
template <> struct GmmaAtom<cute::bfloat16_t, 128> {
  using type = cute::SM90_64x128x16_F32BF16BF16_SS<cute::GMMA::Major::K, cute::GMMA::Major::K>;
};

template <class T_, int Block, int Stages_>
struct DsdConfig {
  using T = T_;
  static constexpr int BM = 128, BN = Block, BK = 64, Stages = Stages_;
  static constexpr int kThreads = 256;  // two warpgroups, 64 rows of M each
  using SmemLayoutA = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<T>{},
                                                   cute::make_shape(cute::Int<BM>{}, cute::Int<BK>{}, cute::Int<Stages>{})));
  using SmemLayoutB = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<T>{},
                                                   cute::make_shape(cute::Int<BN>{}, cute::Int<BK>{}, cute::Int<Stages>{})));
  using TiledMma = decltype(cute::make_tiled_mma(typename GmmaAtom<T, BN>::type{},
                                                 cute::Layout<cute::Shape<cute::_2, cute::_1, cute::_1>>{}));
  static constexpr int kSmemBytes =
      int(sizeof(T)) * (int(cute::cosize(SmemLayoutA{})) + int(cute::cosize(SmemLayoutB{})));
};

// cp.async copies of one Rows x BK K-major tile; `tile(r, k)` is the swizzled shared-memory element.
template <int Rows, int BK, int NThreads, class T, class Tile>
__device__ __forceinline__ void load_tile_k_major(Tile&& tile, sm80::TileAddr<T> const& a) {
  constexpr int kChunks = Rows * BK / 8;
  static_assert(kChunks % NThreads == 0, "tile chunks must divide among the threads");
  CUTE_UNROLL
  for (int i = 0; i < kChunks / NThreads; ++i) {
    const int c = int(threadIdx.x) + i * NThreads;
    const int r = c / (BK / 8), k = (c % (BK / 8)) * 8;
    const bool ok = r < a.valid;
    sm80::cp_async_16_zfill(&tile(r, k), ok ? a.ptr + int64_t(r) * a.ld + k : a.ptr, ok);
  }
}

__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads) dsd_kernel(DsdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using T = typename Cfg::T;
  constexpr int S = Cfg::Stages;
  extern __shared__ __align__(1024) char smem[];
  const int r = blockIdx.x;
  const int64_t m0 = int64_t(blockIdx.y) * Cfg::BM;
  const int64_t K = int64_t(p.n_block_cols) * Cfg::BN, N = int64_t(p.n_block_rows) * Cfg::BN;
  const int row_begin = __ldg(p.row_offsets + r);
  const int count = __ldg(p.row_offsets + r + 1) - row_begin;
  const int per_split = (count + p.splits - 1) / p.splits;
  const int begin = row_begin + min(count, int(blockIdx.z) * per_split);
  const int end = row_begin + min(count, int(blockIdx.z + 1) * per_split);

  T* smem_a = reinterpret_cast<T*>(smem);
  T* smem_b = smem_a + cosize(typename Cfg::SmemLayoutA{});
  Tensor sA = make_tensor(make_smem_ptr(smem_a), typename Cfg::SmemLayoutA{});  // (BM, BK, S)
  Tensor sB = make_tensor(make_smem_ptr(smem_b), typename Cfg::SmemLayoutB{});  // (BN, BK, S)

  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(threadIdx.x);
  Tensor tCsA = thr_mma.partition_A(sA);
  Tensor tCsB = thr_mma.partition_B(sB);
  Tensor tCrA = thr_mma.make_fragment_A(tCsA);  // shared-memory descriptors (MMA, MMA_M, MMA_K, S)
  Tensor tCrB = thr_mma.make_fragment_B(tCsB);
  Tensor acc = partition_fragment_C(mma, Shape<Int<Cfg::BM>, Int<Cfg::BN>>{});
  clear(acc);

  using Source = sm80::DsdSource<Cfg>;
  Source src{static_cast<const T*>(p.x) + m0 * K, static_cast<const T*>(p.data), p.col_indices, begin, end, K,
             p.m - m0};
  const int num_tiles = (end - begin) * Source::kTilesPerBlock;
  if (num_tiles > 0) {
    int next = src.fetch(0);
    auto issue = [&](int t) {
      if (t < num_tiles) {
        sm80::TileAddr<T> a, b;
        src.tiles(t, next, a, b);
        const int stage = t % S;
        load_tile_k_major<Cfg::BM, Cfg::BK, Cfg::kThreads>([&](int rr, int kk) -> T& { return sA(rr, kk, stage); }, a);
        load_tile_k_major<Cfg::BN, Cfg::BK, Cfg::kThreads>([&](int rr, int kk) -> T& { return sB(rr, kk, stage); }, b);
        next = src.fetch(t + 1);
      }
      cp_async_fence();
    };
    CUTE_UNROLL
    for (int s = 0; s < S - 1; ++s) issue(s);

    CUTE_NO_UNROLL
    for (int t = 0; t < num_tiles; ++t) {
      cp_async_wait<S - 2>();
      fence_proxy_async_shared();  // cp.async wrote through the generic proxy; wgmma reads through the async one
      __syncthreads();             // every thread's part of tile t is there; all wgmma of tile t - 1 are done
      const int stage = t % S;
      warpgroup_fence_operand(acc);
      warpgroup_arrive();
      gemm(mma, tCrA(_, _, _, stage), tCrB(_, _, _, stage), acc);
      warpgroup_commit_batch();
      issue(t + S - 1);  // into stage (t - 1) % S, free since the barrier above
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
    }
    cp_async_wait<0>();
  }
  if (p.splits == 1) {
    const T* bias = static_cast<const T*>(p.bias);
    sm80::store_tile<Cfg>(acc, static_cast<T*>(p.y) + m0 * N + int64_t(r) * Cfg::BN, N, p.m - m0,
                          bias == nullptr ? nullptr : bias + int64_t(r) * Cfg::BN);
  } else if (num_tiles > 0) {
    sm80::add_tile_atomic<Cfg>(acc, p.y_f32 + m0 * N + int64_t(r) * Cfg::BN, N, p.m - m0);
  }
#else
  __trap();  // never launched: the host picks this kernel only on sm_90 devices of a build with sm_90a
#endif
}

template <class Cfg>
cudaError_t launch_dsd(const DsdParams& p, cudaStream_t stream) {
  if (p.m == 0 || p.n_block_rows == 0) return cudaSuccess;
  cudaError_t err = sm80::prepare<dsd_kernel<Cfg>>(Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 grid(p.n_block_rows, unsigned((p.m + Cfg::BM - 1) / Cfg::BM), unsigned(p.splits));
  dsd_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace pbsng

// Specialization of launch_dsd_sm90 for one dtype: blocks 64 and 128 (others: cudaErrorInvalidValue).
#define PBSNG_DEFINE_DSD_SM90_LAUNCHER(DTYPE)                                                          \
  namespace pbsng {                                                                                  \
  template <>                                                                                        \
  cudaError_t launch_dsd_sm90<DTYPE>(const DsdParams& p, cudaStream_t stream) {                      \
    using T = sm80::ElementFor<DTYPE>::type;                                                          \
    switch (p.block) {                                                                               \
      case 64: return sm90::launch_dsd<sm90::DsdConfig<T, 64, 4>>(p, stream);                         \
      case 128: return sm90::launch_dsd<sm90::DsdConfig<T, 128, 4>>(p, stream);                       \
      default: return cudaErrorInvalidValue;                                                         \
    }                                                                                                \
  }                                                                                                  \
  }
