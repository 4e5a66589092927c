// dsd (y = x W^T + bias) and dds (dx = dy W) with blocks of 32 on Hopper: TMA loads and stores, an mbarrier
// pipeline and warp-specialized wgmma (sm_90a) in a persistent kernel, like kernel_sm90_ws.cuh (whose helpers it
// uses), but with the tokens as the wgmma M.
//
// Why another orientation: kernel_sm90_ws.cuh puts a line's features on the wgmma M (64), which a block of 32
// fills only half. Here a consumer computes out[64 tokens, 8 lines x 32 features] with one 64 x 32 x 16 wgmma per
// line and k-step, so a line without the block column skips its wgmma: no tensor-core work on absent blocks.
// A tile: 128 tokens x 8 lines (256 output features). Per stage, one block column of the union of the 8 lines'
// lists: the activation tile (128 tokens x 32, A, K-major) and the W blocks of the lines that have it (B: 32 x 32,
// K-major for the dsd, MN-major for the dds' W_b^T). Bytes per useful FLOP at density d: (8 KB + 16 d KB) per
// 2 x 128 x 8 d x 32 x 32 FLOP, 1.3x a dense 128 x 256 tile's at d = 0.5 (kernel_sm90_ws.cuh's tile of two 64-lines
// has 1.33x at block 64).
// 64 x 32 x 16 wgmma read A (2 KB) and B (1 KB) from shared memory for 32 K FMA: at the tensor cores' rate that is
// ~1.5x shared memory's 128 B/clk, so this tile can reach ~2/3 of the tensor-core peak. Measured, it is bound by
// instruction latency in both warp roles (a branch and two small wgmma per line and stage; doc/kernels.md,
// "Blocks of 32 on Hopper"), not by the bytes it receives.
//
// Producer: warp 0 of warpgroup 0; lane l < 8 walks line l's sorted block list in batches loaded ahead
// (LineBatches), the warp takes the smallest key (a block column) with one reduction, one stage ahead of the
// issue, and each lane whose line has it issues its W tile's TMA load; lane 0 arms the stage and loads the
// activation tile.
// Epilogue: each consumer rounds its 64 tokens x 8 lines (+ bias), writes them by stmatrix into its own output
// tiles (64-byte swizzle) and stores each line's 64 x 32 tile by TMA, which clips rows past M.
//
// Constraints: sm_90a only (other archs compile a trap); fp16 / bf16; blocks of 32; activation row stride a
// multiple of 16 bytes and 16-byte aligned pointers (bindings.cpp checks).
#pragma once

#include "block_sparse/kernel_sm90_ws.cuh"

namespace pbsng {
namespace sm90b32 {

using sm90ws::KernelParams;

template <class T, cute::GMMA::Major MajorB> struct GmmaAtom;
template <cute::GMMA::Major MajorB> struct GmmaAtom<cute::half_t, MajorB> {
  using type = cute::SM90_64x32x16_F32F16F16_SS<cute::GMMA::Major::K, MajorB>;
};
template <cute::GMMA::Major MajorB> struct GmmaAtom<cute::bfloat16_t, MajorB> {
  using type = cute::SM90_64x32x16_F32BF16BF16_SS<cute::GMMA::Major::K, MajorB>;
};

template <class T_, bool TransposeW_, int Stages_ = 6>
struct Config {
  using T = T_;
  static constexpr int Block = 32;
  static constexpr bool TransposeW = TransposeW_;  // dds: B = W_b^T (MN-major)
  static constexpr int kLines = 8, kTokens = 128, BK = 32, kStages = Stages_, kSplit = 1;
  static constexpr int kBatch = 8;      // block-list entries a producer lane loads at a time (LineBatches)
  static constexpr int kTileSlots = 4;  // tiles the producer may post ahead of the consumers
  static constexpr int kThreads = 384;  // producer warpgroup + two consumer warpgroups
  static constexpr cute::GMMA::Major MajorB = TransposeW ? cute::GMMA::Major::MN : cute::GMMA::Major::K;
  // A consumer's 64 tokens of the activation tile (the stage holds 128: consumer h's rows start at 64 h, whole
  // swizzle atoms of 8 rows).
  using SmemLayoutA = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<T>{},
                                                   cute::make_shape(cute::Int<64>{}, cute::Int<BK>{})));
  using SmemLayoutB = decltype(cute::tile_to_shape(
      cute::conditional_t<TransposeW, cute::GMMA::Layout_MN_SW64_Atom<T>, cute::GMMA::Layout_K_SW64_Atom<T>>{},
      cute::make_shape(cute::Int<32>{}, cute::Int<BK>{})));
  // One line's output tile, (64 tokens, 32 features) row-major with the 64-byte swizzle of its TMA box.
  using SmemLayoutOut = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW64_Atom<T>{},
                                                     cute::make_shape(cute::Int<64>{}, cute::Int<32>{})));
  using TiledMma = decltype(cute::make_tiled_mma(typename GmmaAtom<T, MajorB>::type{}));
  using TiledStoreOut = decltype(cute::make_tiled_copy_C(cute::Copy_Atom<cute::SM90_U32x4_STSM_N, T>{},
                                                         TiledMma{}));

  static constexpr int kActTileBytes = kTokens * BK * int(sizeof(T));  // 8 KB
  static constexpr int kWTileBytes = 32 * BK * int(sizeof(T));         // 2 KB

  struct alignas(1024) Stage {
    T act[kTokens * BK];
    T w[kLines][32 * BK];  // slot l: line l's block (loaded only when the line has it)
  };
  struct SharedStorage {
    Stage stages[kStages];
    alignas(1024) T out[2][kLines][64 * 32];
    uint32_t bias[2][128];  // per consumer: the tile's 256 bias values as pairs
    uint64_t full[kStages];
    uint64_t empty[kStages];
    int flags[kStages];  // bits 0-7: the lines with a block in this stage; bit 8: last stage of its tile
    uint64_t lines_full[kTileSlots];  // producer -> consumers: the tile with its lines
    uint64_t lines_empty[kTileSlots];
    int tile_lines[kTileSlots][kLines + 2];  // tile, 8 lines, their count | 16 if any has a block
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block on sm_90");
};

// A producer lane's line: its entries in batches of kBatch (keys, and slots for the dds), the next batch loaded
// while the current one is used, so that the loads' latency (~0.5-1 us under load) is paid once per batch and
// hidden, never per stage. (A queue shifted by one entry per stage made every stage wait for the last load: ~0.5 us
// per stage, H100.) The current entry is the batch's first: the batch shifts by one at each advance (static
// register indices; picking entry `pos` by selects, the compiler made it an indexed local-memory array).
template <class Cfg>
struct LineBatches {
  static constexpr int N = Cfg::kBatch;
  static constexpr bool kSlots = Cfg::TransposeW;  // the dsd's slot is the entry itself
  int key[N], next_key[N];
  int slot[kSlots ? N : 1], next_slot[kSlots ? N : 1];
  int e, end, pos;

  __device__ __forceinline__ void load(const KernelParams& p, int first, int (&k)[N], int (&s)[kSlots ? N : 1]) {
    CUTE_UNROLL
    for (int i = 0; i < N; ++i) {
      k[i] = first + i < end ? __ldg(p.keys + first + i) : INT_MAX;
      if constexpr (kSlots) s[i] = first + i < end ? __ldg(p.slots + first + i) : 0;
    }
  }
  __device__ __forceinline__ void open(const KernelParams& p, int begin, int end_) {
    e = begin, end = end_, pos = 0;
    load(p, e, key, slot);
    load(p, e + N, next_key, next_slot);
  }
  __device__ __forceinline__ int current_key() const { return key[0]; }
  __device__ __forceinline__ int current_slot() const {
    if constexpr (kSlots) {
      return slot[0];
    } else {
      return e;
    }
  }
  __device__ __forceinline__ void advance(const KernelParams& p) {
    ++e;
    if (++pos == N) {
      pos = 0;
      CUTE_UNROLL
      for (int i = 0; i < N; ++i) {
        key[i] = next_key[i];
        if constexpr (kSlots) slot[i] = next_slot[i];
      }
      load(p, e + N, next_key, next_slot);
    } else {  // the current batch arrived long ago: shifting it waits for nothing
      CUTE_UNROLL
      for (int i = 0; i + 1 < N; ++i) {
        key[i] = key[i + 1];
        if constexpr (kSlots) slot[i] = slot[i + 1];
      }
    }
  }
};

// A shared-memory int written by another warp (ld.volatile.shared: a generic volatile load is a system-scope LD).
__device__ __forceinline__ int load_shared_volatile(const int* p) {
  int v;
  asm volatile("ld.volatile.shared.b32 %0, [%1];" : "=r"(v) : "r"(cute::cast_smem_ptr_to_uint(p)));
  return v;
}

template <class Cfg>
__device__ __forceinline__ void produce(const KernelParams& p, typename Cfg::SharedStorage& sh) {
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int S = Cfg::kStages, B = Cfg::Block;
  const int lane = threadIdx.x % 32;
  int it = 0, unit = blockIdx.x;
  LineBatches<Cfg> list;
  for (int n = 0;; ++n) {
    const int tile = unit < p.n_tiles ? sm90ws::tile_of(p, unit) : p.n_tiles;
    const int group = tile % p.n_groups, token0 = tile / p.n_groups * Cfg::kTokens;
    // Lane l < 8: line l of the tile and its block list.
    const int idx = group * Cfg::kLines + lane;
    const bool mine = tile < p.n_tiles && lane < Cfg::kLines && idx < p.n_lines;
    const int line = mine ? __ldg(p.order + idx) : 0;
    list.open(p, mine ? __ldg(p.offsets + line) : 0, mine ? __ldg(p.offsets + line + 1) : 0);
    const int lines = tile < p.n_tiles ? min(Cfg::kLines, p.n_lines - group * Cfg::kLines) : 0;
    const bool any_block = __any_sync(0xffffffffu, list.e < list.end);
    // Post the tile (a number >= n_tiles tells the consumers to stop).
    const int q = n % Cfg::kTileSlots;
    Barrier::wait(&sh.lines_empty[q], ((n / Cfg::kTileSlots) & 1) ^ 1);
    if (lane < Cfg::kLines) sh.tile_lines[q][1 + lane] = line;
    if (lane == 0) {
      sh.tile_lines[q][0] = tile;
      sh.tile_lines[q][Cfg::kLines + 1] = lines | (int(any_block) << 4);
    }
    __syncwarp();
    if (lane == 0) Barrier::arrive(&sh.lines_full[q]);
    if (tile >= p.n_tiles) break;
    // The next unit is taken when at most 2 entries of any line are left (see kernel_sm90_ws.cuh's claim).
    int following = -1;
    auto claim = [&](int left) {
      if (lane == 0 && following < 0 && left <= 2) following = sm90ws::next_unit<Cfg>(p, unit);
    };
    claim(__reduce_max_sync(0xffffffffu, list.end - list.e));
    // The merge runs one stage ahead of the issue: stage i + 1's column, lines and slots are found before stage
    // i waits for its free slot and issues its loads, so that the two dependent chains overlap (without that the
    // producer's chain took ~0.3 us per stage, whatever the loads: H100 diagnostic, doc/kernels.md).
    auto merge = [&](int& column, unsigned& mask, int& w_slot, int& left) {
      const int key = list.current_key();
      column = __reduce_min_sync(0xffffffffu, key);
      const bool has = key == column && column != INT_MAX;
      mask = __ballot_sync(0xffffffffu, has);
      w_slot = list.current_slot();
      if (has) list.advance(p);
      left = __reduce_max_sync(0xffffffffu, list.end - list.e);
    };
    int column, w_slot, left;
    unsigned mask;
    merge(column, mask, w_slot, left);
    while (column != INT_MAX) {
      int next_column, next_slot, next_left;
      unsigned next_mask;
      merge(next_column, next_mask, next_slot, next_left);
      const int s = it % S;
      Barrier::wait(&sh.empty[s], ((it / S) & 1) ^ 1);
      if (lane == 0) {
        sh.flags[s] = int(mask) | (int(left == 0) << 8);
        TxBarrier::arrive_and_expect_tx(&sh.full[s], Cfg::kActTileBytes + __popc(mask) * Cfg::kWTileBytes);
        sm90ws::tma_load_2d(sh.stages[s].act, &p.act_map, &sh.full[s], column * B, token0);
      }
      __syncwarp();  // the stage is armed before its W loads
      if ((mask >> lane) & 1) sm90ws::tma_load_2d(sh.stages[s].w[lane], &p.data_map, &sh.full[s], 0, w_slot * B);
      ++it;
      claim(left);
      column = next_column, mask = next_mask, w_slot = next_slot, left = next_left;
    }
    claim(0);  // a tile without blocks made no stage
    unit = __shfl_sync(0xffffffffu, following, 0);
  }
  if (lane == 0) sm90ws::count_out(p);
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) b32_kernel(const __grid_constant__ KernelParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using T = typename Cfg::T;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int S = Cfg::kStages, L = Cfg::kLines;
  extern __shared__ char smem_raw[];
  auto& sh = sm90ws::aligned_shared_storage<typename Cfg::SharedStorage>(smem_raw);
  const int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int q = 0; q < Cfg::kTileSlots; ++q) {
      Barrier::init(&sh.lines_full[q], 1);
      Barrier::init(&sh.lines_empty[q], 256);  // both consumers
    }
  }
  sm90ws::init_pipeline<S>(sh.full, sh.empty, 256);  // its fence covers the inits above (same thread)
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<96>();  // the producer lanes hold two batches of their line's entries
    if (threadIdx.x < 32) produce<Cfg>(p, sh);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<200>();
  // h from a warp reduction: a uniform register, which keeps the A descriptors on the uniform datapath.
  const int h = __reduce_max_sync(0xffffffffu, warpgroup - 1), tid = threadIdx.x % 128;
  const T* bias = static_cast<const T*>(p.bias);

  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  // The 8 lines' accumulators: line l's 64 x 32 fragment is registers 16 l .. 16 l + 15 (the N = 256 fragment
  // of the 64 x 32 atom tiles N by 8).
  Tensor acc = partition_fragment_C(mma, Shape<_64, Int<32 * L>>{});
  using LineFragment = decltype(partition_fragment_C(mma, Shape<_64, _32>{}));
  constexpr int kLineValues = decltype(size(LineFragment{}))::value;
  static_assert(kLineValues * L == decltype(size(acc))::value, "8 line fragments");
  const auto line_layout = LineFragment{}.layout();
  auto acc_line = [&](int l) { return make_tensor(acc.data() + l * kLineValues, line_layout); };
  Tensor coord = thr_mma.partition_C(make_identity_tensor(Shape<_64, _32>{}));  // a line's (token, feature)
  typename Cfg::TiledStoreOut store_out;
  auto thr_store = store_out.get_thread_slice(tid);

  int it = 0;
  for (int n = 0;; ++n) {
    const int q = n % Cfg::kTileSlots;
    Barrier::wait(&sh.lines_full[q], (n / Cfg::kTileSlots) & 1);
    const volatile int* posted = sh.tile_lines[q];
    const int tile = posted[0];
    if (tile >= p.n_tiles) {
      Barrier::arrive(&sh.lines_empty[q]);
      break;
    }
    const int lines = posted[L + 1] & 15;
    const bool any_block = posted[L + 1] & 16;  // else the producer made no stage
    const int token0 = tile / p.n_groups * Cfg::kTokens + 64 * h;
    // Thread t's pair of bias values: features 2 (t % 16), + 1 of the tile's line t / 16, loaded now and used in
    // the epilogue (as kernel_sm90_ws.cuh, a pinned load that the mainloop hides).
    uint32_t bias_pair = 0;
    if (bias != nullptr && tid / 16 < lines) {  // two 16-bit loads: a bias view need not be 4-byte aligned
      const T* b = bias + posted[1 + tid / 16] * 32 + 2 * (tid % 16);
      bias_pair = uint32_t(sm90ws::load_u16_pinned(b)) | (uint32_t(sm90ws::load_u16_pinned(b + 1)) << 16);
    }
    clear(acc);
    if (any_block) {
      int pending = -1;  // stage whose wgmma may still be reading shared memory
      for (;; ++it) {
        // The stage and its flags from warp reductions, i.e. in uniform registers: with h (above) that puts every
        // wgmma descriptor on the uniform datapath, without an R2UR per wgmma (2-12 % faster, H100, session 25).
        const int s = __reduce_max_sync(0xffffffffu, it % S);
        Barrier::wait(&sh.full[s], (it / S) & 1);
        const int flags = __reduce_or_sync(0xffffffffu, load_shared_volatile(&sh.flags[s]));
        Tensor sA = make_tensor(make_smem_ptr(sh.stages[s].act + 64 * Cfg::BK * h), typename Cfg::SmemLayoutA{});
        Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));
        // Line l's B descriptors: line 0's advanced by l blocks (the descriptors count 16-byte units), one add per
        // line instead of a descriptor built from its address.
        Tensor sB0 = make_tensor(make_smem_ptr(sh.stages[s].w[0]), typename Cfg::SmemLayoutB{});
        Tensor tCrB0 = thr_mma.make_fragment_B(thr_mma.partition_B(sB0));
        warpgroup_fence_operand(acc);
        warpgroup_arrive();
        CUTE_UNROLL
        for (int l = 0; l < L; ++l) {
          if ((flags >> l) & 1) {
            Tensor tCrB = make_tensor(tCrB0.data() + l * (Cfg::kWTileBytes / 16), tCrB0.layout());
            Tensor c = acc_line(l);
            gemm(mma, tCrA, tCrB, c);
          }
        }
        warpgroup_commit_batch();
        warpgroup_wait<1>();  // the previous stage's wgmma are done
        warpgroup_fence_operand(acc);
        if (pending >= 0) Barrier::arrive(&sh.empty[pending]);
        pending = s;
        if (flags & 256) break;
      }
      ++it;
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
      Barrier::arrive(&sh.empty[pending]);
    }

    // Epilogue of consumer h: its 64 tokens of the tile's lines.
    if (token0 < p.m) {
      if (tid == 0) sm90ws::tma_store_wait_read();  // the previous tile's stores have left sh.out[h]
      sh.bias[h][tid] = bias_pair;
      cutlass::arch::NamedBarrier::sync(128, 1 + h);
      const T* bias_values = reinterpret_cast<const T*>(sh.bias[h]);
      CUTE_UNROLL
      for (int l = 0; l < L; ++l) {
        if (l >= lines) break;  // uniform
        Tensor c = acc_line(l);
        Tensor values = make_tensor_like<T>(c);
        CUTE_UNROLL
        for (int i = 0; i < size(c); ++i) values(i) = T(c(i) + float(bias_values[l * 32 + get<1>(coord(i))]));
        Tensor dst = thr_store.partition_D(make_tensor(make_smem_ptr(sh.out[h][l]), typename Cfg::SmemLayoutOut{}));
        copy(store_out, thr_store.retile_S(values), dst);
      }
      cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by the TMA stores
      cutlass::arch::NamedBarrier::sync(128, 1 + h);
      if (tid == 0) {
        for (int l = 0; l < lines; ++l) sm90ws::tma_store_2d(&p.out_map, sh.out[h][l], posted[1 + l] * 32, token0);
      }
    }
    Barrier::arrive(&sh.lines_empty[q]);  // after the last read of the posted lines
  }
  if (tid == 0) sm90ws::tma_store_wait_read();  // shared memory must outlive the last stores' reads
#else
  __trap();  // never launched: the host picks this kernel only on sm_90 devices of a build with sm_90a
#endif
}

// act (M, n_other * 32), data [nnz, 32, 32] (nnz >= 1), out (M, n_lines * 32); one CTA per SM (`sms`).
template <class T, bool TransposeW>
cudaError_t launch(const void* act, int64_t m, int n_other, const void* data, int64_t nnz, const int32_t* offsets,
                   const int32_t* keys, const int32_t* slots, const int32_t* order, int* tile_counter, int n_lines,
                   const void* bias, void* out, int sms, cudaStream_t stream) {
  using Cfg = Config<T, TransposeW>;
  if (m == 0 || n_lines == 0) return cudaSuccess;
  constexpr int B = Cfg::Block;
  const CUtensorMapDataType dtype = std::is_same<T, cute::half_t>::value ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                                         : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  constexpr CUtensorMapSwizzle kSwizzle = CU_TENSOR_MAP_SWIZZLE_64B;  // 64-byte rows (32 16-bit values)
  KernelParams p;
  cudaError_t err = sm90ws::encode_2d_map(&p.act_map, dtype, act, uint64_t(n_other) * B, uint64_t(m), Cfg::BK,
                                          Cfg::kTokens, 2, kSwizzle);
  if (err != cudaSuccess) return err;
  err = sm90ws::encode_2d_map(&p.data_map, dtype, data, B, uint64_t(nnz) * B, B, B, 2, kSwizzle);
  if (err != cudaSuccess) return err;
  err = sm90ws::encode_2d_map(&p.out_map, dtype, out, uint64_t(n_lines) * B, uint64_t(m), B, 64, 2, kSwizzle);
  if (err != cudaSuccess) return err;
  const int64_t groups = (int64_t(n_lines) + Cfg::kLines - 1) / Cfg::kLines;
  const int64_t token_tiles = (m + Cfg::kTokens - 1) / Cfg::kTokens;
  const int64_t tiles = groups * token_tiles;
  if (tiles > INT_MAX) return cudaErrorInvalidValue;
  // The band (kernel_sm90_ws.cuh, tile_of): as many token tiles as ~16 MB of activations.
  const int64_t token_tile_bytes = int64_t(Cfg::kTokens) * n_other * B * int64_t(sizeof(T));
  const int64_t band = std::min<int64_t>(token_tiles, std::max<int64_t>(1, (int64_t(16) << 20) / token_tile_bytes));
  p.offsets = offsets;
  p.keys = keys;
  p.slots = slots;
  p.order = order;
  p.tile_counter = tile_counter;
  p.bias = bias;
  p.n_lines = n_lines;
  p.n_groups = int(groups);
  p.n_tiles = int(tiles);
  p.n_token_tiles = int(token_tiles);
  p.band = int(band);
  p.n_keys = n_other;
  p.m = m;
  err = sm80::prepare<b32_kernel<Cfg>>(Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int ctas = int(std::min<int64_t>(tiles, sms));
  b32_kernel<Cfg><<<ctas, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sm90b32
}  // namespace pbsng
