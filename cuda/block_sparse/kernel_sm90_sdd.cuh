// sdd (dW_b = dy_r^T x_c on the kept blocks, reduced over the M tokens) on Hopper: TMA loads, an mbarrier
// pipeline and warp-specialized wgmma (sm_90a). Shares the TMA / tensor-map helpers of kernel_sm90_ws.cuh.
//
// One CTA: one block row r and a chunk of its kept blocks (full chunks first, then the partial ones from the
// largest, see the slot rule below), over a range of 64-token steps (the whole M, or a split of it whose fp32
// partial sums are added atomically). Each consumer warpgroup computes a 64 x 256 tile
// with 64 x 256 x 16 wgmma, tokens being the reduction:
//   block 64:  chunk of 8 blocks; consumer h owns blocks 4h .. 4h+3 (N = 4 x 64), both share the dy tile A;
//   block 128: chunk of 2 blocks; consumer h owns features 64h .. 64h+63 of the row, both share the x tiles
//              of the two blocks (N = 2 x 128).
// Both operands are read MN-major (dy^T and x are transposed views of row-major activations), which wgmma
// allows for 16-bit types. Missing blocks of a partial chunk leave their columns unloaded: their results are
// not stored.
// Epilogue: without a split of M, the rounded results go by stmatrix into the (now idle) stage buffers and
// leave as 64 x 64 TMA stores, one per 8 KB of `data` (2-byte stores from the registers took ~14 us of a CTA's
// ~120; H100, block 64: the sdd 8 % faster at density 0.5, 14 % at 1.0). Split CTAs stage their fp32 sums the
// same way and add them into the zeroed workspace with TMA reductions (cp.reduce.async.bulk .add).
//
// Bias gradient (optional, fused): the CTA holding a row's first chunk also sums that row's dy tiles over its
// tokens with a 64 x 8 x 16 wgmma against a tile of ones (A is the dy^T tile already in shared memory, so the
// sum costs no memory traffic and 1/32 of the tensor-core work); rows without blocks get a CTA of their own in
// one extra slot that loads only dy. Block 64: consumer 0 sums (both consumers share A); block 128: each
// consumer sums its half of the row's features.
//
// Tail split (blocks of 128, no split of M): the items of the last partial wave of CTAs are split over M
// into pieces run by extra CTAs of the tail slots; fp32 partials in a workspace, the last piece to finish adds
// them and stores (see KernelParams and consume()).
// A split of M in 2 with blocks of 128 sums its pieces the same way (every working item in grid.z = 2 pieces):
// no zeroed workspace, no cast kernel, and a deterministic result (a + b = b + a). Other splits keep the TMA
// reductions into a zeroed fp32 workspace: with 5-6 pieces the last one's summing made the sdd slower, and in
// blocks of 64 the tail code spills.
//
// Constraints: sm_90a only; fp16 / bf16; blocks 64 and 128; 16-byte aligned activations.
#pragma once

#include "block_sparse/kernel_sm90_ws.cuh"

namespace pbsng {
namespace sm90sdd {

template <class T> struct GmmaAtom;
template <> struct GmmaAtom<cute::half_t> {
  using type = cute::SM90_64x256x16_F32F16F16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::MN>;
};
template <> struct GmmaAtom<cute::bfloat16_t> {
  using type = cute::SM90_64x256x16_F32BF16BF16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::MN>;
};
// dy^T tile (64 features x BK tokens, MN-major) times a BK x 8 tile of ones: every column is the row sum.
template <class T> struct GmmaSumAtom;
template <> struct GmmaSumAtom<cute::half_t> {
  using type = cute::SM90_64x8x16_F32F16F16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::K>;
};
template <> struct GmmaSumAtom<cute::bfloat16_t> {
  using type = cute::SM90_64x8x16_F32BF16BF16_SS<cute::GMMA::Major::MN, cute::GMMA::Major::K>;
};

template <class T_, int Block_, int BK_ = 64>
struct Config {
  using T = T_;
  static constexpr int Block = Block_;
  static_assert(Block == 64 || Block == 128, "blocks of 64 or 128");
  static constexpr int BK = BK_;                           // tokens per stage
  static constexpr int kChunk = Block == 64 ? 8 : 2;       // blocks per CTA
  static constexpr int kATiles = Block == 64 ? 1 : 2;      // dy^T tiles (64 features each) per stage
  static constexpr int kBTiles = Block == 64 ? 2 : 1;      // x tiles (256 columns each) per stage
  static constexpr int kStageBytes = (kATiles * 64 + kBTiles * 256) * BK * int(sizeof(T));
  static constexpr int kStages = 216 * 1024 / kStageBytes < 8 ? 216 * 1024 / kStageBytes : 8;
  static constexpr int kThreads = 384;
  using SmemLayoutA = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<T>{},
                                                   cute::make_shape(cute::Int<64>{}, cute::Int<BK>{})));
  // Column-block-major (Step<_2, _1>): each 64-column group holds all BK rows contiguously, one TMA box.
  using SmemLayoutB = decltype(cute::tile_to_shape(cute::GMMA::Layout_MN_SW128_Atom<T>{},
                                                   cute::make_shape(cute::Int<256>{}, cute::Int<BK>{}),
                                                   cute::Step<cute::_2, cute::_1>{}));
  using TiledMma = decltype(cute::make_tiled_mma(typename GmmaAtom<T>::type{}));
  using SumMma = decltype(cute::make_tiled_mma(typename GmmaSumAtom<T>::type{}));
  using SmemLayoutOnes = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_INTER_Atom<T>{},
                                                      cute::make_shape(cute::Int<8>{}, cute::Int<BK>{})));
  static constexpr int kBoxBytes = 64 * BK * int(sizeof(T));
  // Epilogue (no split of M): a consumer's 64 x 256 results, rounded, as four 64 x 64 row-major tiles in
  // shared memory (128-byte swizzle: conflict-free stmatrix, what the TMA store expects), in the stage
  // buffers that the finished mainloop no longer reads.
  using SmemLayoutOut = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<T>{},
                                                     cute::make_shape(cute::Int<64>{}, cute::Int<256>{})));
  using TiledStoreOut = decltype(cute::make_tiled_copy_C(cute::Copy_Atom<cute::SM90_U32x4_STSM_N, T>{},
                                                         TiledMma{}));
  // Split M: the fp32 sums as eight 64 x 32 tiles (128-byte rows, swizzled), added into the fp32 workspace
  // by TMA reductions.
  using SmemLayoutSums = decltype(cute::tile_to_shape(cute::GMMA::Layout_K_SW128_Atom<float>{},
                                                      cute::make_shape(cute::Int<64>{}, cute::Int<256>{})));

  struct alignas(1024) Stage {
    T a[kATiles][64 * BK];
    T b[kBTiles][256 * BK];
  };
  struct SharedStorage {
    Stage stages[kStages];
    alignas(128) T ones[8 * BK];  // B of the bias-gradient sum
    uint64_t full[kStages];
    uint64_t empty[kStages];
    int tail_last[2];  // per consumer: whether this tail piece finishes its item
    int item[2];       // the CTA's item (row, slot) as warp 0 decided it
    int tail[3];       // item number in the tail (-1: the CTA's own item; -2: none), piece, pieces
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;
  static_assert(2 * 64 * 256 * 4 <= kStages * int(sizeof(Stage)), "both consumers' fp32 sums fit in the stages");
};

struct KernelParams {
  CUtensorMap dy_map;  // (M, N), box 64 tokens x 64 features
  CUtensorMap x_map;   // (M, K), box 64 tokens x 64 features
  // The result: out [nnz, B, B] in T as (nnz * B rows, B), box 64 x 64; or, with sums_f32, the zeroed fp32
  // workspace of the same shape, box 64 x 32, added into by TMA reductions.
  CUtensorMap out_map;
  const int32_t* row_offsets;
  const int32_t* col_indices;
  void* bias_grad;     // (N,) in T, or nullptr
  float* bias_grad_f32;  // (N,) fp32, zeroed (sums_f32), or nullptr
  int64_t m;
  int splits;          // grid.z: pieces of M per item
  bool sums_f32;       // splits > 1 summed by TMA reductions into out_map / bias_grad_f32 (blocks of 64)
  bool split_pieces;   // splits > 1 summed in the kernel like the tail pieces (blocks of 128; the host uses it
                       // for 2): tail_ws holds W x splits pieces, tail_counters W items (W: working CTAs per split)
  int full_slots;      // n_block_cols / kChunk: grid.y = item_slots + tail_slots
  int item_slots;      // full_slots + kChunk - 1 (+ 1 with the bias gradient)
  bool with_bias;
  // The tail split (splits == 1 only; tail_slots == 0: off). The working CTAs, in dispatch order, make
  // W = q x sms + e; the last e would run as a wave of their own, so their token steps are split into
  // `pieces` ranges run by the CTAs of the tail slots, each adding its fp32 partial results into tail_ws; the
  // piece that finishes its item last (tail_counters, zero at the launch; that piece zeroes its counter again)
  // sums them and stores the item.
  int sms;
  int tail_slots;
  float* tail_ws;      // sms x 2 consumers x kTailFloats
  int* tail_counters;  // sms x 2, zero at the launch and left zeroed
};

// Floats per consumer in tail_ws: its accumulator fragment (128 values per thread) and its bias-sum fragment
// (4), as 33 float4 per thread, thread-minor (coalesced).
constexpr int kTailVec4 = 33;
constexpr int kTailFloats = kTailVec4 * 4 * 128;
// The fewest 64-token steps a tail piece gets.
constexpr int kTailMinSteps = 16;

// Row r's working slots (see sdd_kernel): full chunks in slots 0 .. full - 1, the partial chunk of `rest`
// blocks in slot full_slots + kChunk - 1 - rest, a row without blocks in slot full_slots + kChunk - 1 (bias).
template <int kChunk>
struct RowSlots {
  int full, partial_slot, bias_slot;  // INT_MAX: none
  __device__ RowSlots(const KernelParams& p, int blocks) {
    full = blocks / kChunk;
    const int rest = blocks % kChunk;
    partial_slot = rest > 0 ? p.full_slots + kChunk - 1 - rest : INT_MAX;
    bias_slot = p.with_bias && blocks == 0 ? p.full_slots + kChunk - 1 : INT_MAX;
  }
  __device__ int count() const { return full + (partial_slot != INT_MAX) + (bias_slot != INT_MAX); }
  __device__ int count_before(int slot) const { return min(full, slot) + (partial_slot < slot) + (bias_slot < slot); }
  __device__ bool works(int slot) const { return slot < full || slot == partial_slot || slot == bias_slot; }
};

__device__ __forceinline__ int warp_sum(int v) {
  CUTE_UNROLL
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// By one warp: the working CTAs W and the rank of CTA (row0, slot0) among them in dispatch order (slot-major,
// then row: the order of blockIdx).
template <int kChunk>
__device__ void count_working(const KernelParams& p, int row0, int slot0, int& total, int& rank) {
  const int lane = threadIdx.x % 32, rows = int(gridDim.x);
  int t = 0, b = 0;
  for (int r = lane; r < rows; r += 32) {
    const RowSlots<kChunk> rs(p, __ldg(p.row_offsets + r + 1) - __ldg(p.row_offsets + r));
    t += rs.count();
    b += rs.count_before(slot0) + (r < row0 && rs.works(slot0));
  }
  total = warp_sum(t);
  rank = warp_sum(b);
}

// By one warp: the (row, slot) of the working CTA of rank `rank`.
template <int kChunk>
__device__ void find_working(const KernelParams& p, int rank, int& row, int& slot) {
  const int lane = threadIdx.x % 32, rows = int(gridDim.x);
  for (int y = 0; y < p.item_slots; ++y) {
    for (int r0 = 0; r0 < rows; r0 += 32) {
      const int r = r0 + lane;
      const bool works =
          r < rows && RowSlots<kChunk>(p, __ldg(p.row_offsets + r + 1) - __ldg(p.row_offsets + r)).works(y);
      unsigned mask = __ballot_sync(0xffffffffu, works);
      const int c = __popc(mask);
      if (rank < c) {
        for (int k = 0; k < rank; ++k) mask &= mask - 1;  // drop the lowest `rank` set bits
        row = r0 + __ffs(mask) - 1;
        slot = y;
        return;
      }
      rank -= c;
    }
  }
  row = slot = -1;  // not reached: rank < W
}

// One consumer warpgroup's mainloop over n_steps token steps (also kernel_sm90_sdd_b32.cuh's): each stage's A
// tile a_tile and B tile b_tile (of the Cfg's Stage) into acc, and with kSum the A tile's sums over the tokens
// (against a tile of ones) into bias_acc; a stage is released once the next one's wgmma are issued and its own
// have completed. Returns with every wgmma complete.
template <class Cfg, bool kBlocks, bool kSum, class Acc, class BiasAcc>
__device__ __forceinline__ void mainloop(typename Cfg::SharedStorage& sh, int n_steps, int a_tile, int b_tile,
                                         Acc& acc, BiasAcc& bias_acc) {
  using namespace cute;
  using Barrier = cutlass::arch::ClusterBarrier;
  constexpr int S = Cfg::kStages;
  const int tid = threadIdx.x % 128;
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  typename Cfg::SumMma sum_mma;
  auto thr_sum = sum_mma.get_thread_slice(tid);
  Tensor tSrOnes = thr_sum.make_fragment_B(thr_sum.partition_B(
      make_tensor(make_smem_ptr(sh.ones), typename Cfg::SmemLayoutOnes{})));
  clear(acc);
  clear(bias_acc);
  int pending = -1;
  for (int it = 0; it < n_steps; ++it) {
    const int s = it % S;
    Barrier::wait(&sh.full[s], (it / S) & 1);
    Tensor sA = make_tensor(make_smem_ptr(sh.stages[s].a[a_tile]), typename Cfg::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(sh.stages[s].b[b_tile]), typename Cfg::SmemLayoutB{});
    warpgroup_fence_operand(acc);
    warpgroup_fence_operand(bias_acc);
    warpgroup_arrive();
    if constexpr (kBlocks) {
      gemm(mma, thr_mma.make_fragment_A(thr_mma.partition_A(sA)), thr_mma.make_fragment_B(thr_mma.partition_B(sB)),
           acc);
    }
    if constexpr (kSum) gemm(sum_mma, thr_sum.make_fragment_A(thr_sum.partition_A(sA)), tSrOnes, bias_acc);
    warpgroup_commit_batch();
    warpgroup_wait<1>();
    warpgroup_fence_operand(acc);
    warpgroup_fence_operand(bias_acc);
    if (pending >= 0) Barrier::arrive(&sh.empty[pending]);
    pending = s;
  }
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);
  warpgroup_fence_operand(bias_acc);
}

// A consumer's 64 x 256 fp32 tile, rounded to T, into shared memory at `staged` (Cfg::SmemLayoutOut) by stmatrix,
// fenced for the TMA stores that read it next (also kernel_sm90_sdd_b32.cuh's).
template <class Cfg, class Acc>
__device__ __forceinline__ void stage_rounded(const Acc& acc, typename Cfg::T* staged) {
  using namespace cute;
  using T = typename Cfg::T;
  Tensor values = make_tensor_like<T>(acc);
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) values(i) = T(acc(i));
  typename Cfg::TiledStoreOut store_out;
  auto thr_store = store_out.get_thread_slice(threadIdx.x % 128);
  copy(store_out, thr_store.retile_S(values),
       thr_store.partition_D(make_tensor(make_smem_ptr(staged), typename Cfg::SmemLayoutOut{})));
  cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by the TMA store
}

// One consumer warpgroup h: the mainloop over the CTA's token steps and the stores. kBlocks: the chunk's
// blocks (count > 0); kSum: this warpgroup also sums its dy^T tile (the bias gradient).
template <class Cfg, bool kBlocks, bool kSum>
__device__ __forceinline__ void consume(const KernelParams& p, typename Cfg::SharedStorage& sh, int h,
                                        int consumers, int row, int begin, int count, int n_steps, int tail_item,
                                        int piece, int pieces) {
  using namespace cute;
  using T = typename Cfg::T;
  constexpr int B = Cfg::Block;
  const int tid = threadIdx.x % 128;
  typename Cfg::TiledMma mma;
  auto thr_mma = mma.get_thread_slice(tid);
  Tensor acc = partition_fragment_C(mma, Shape<_64, _256>{});
  typename Cfg::SumMma sum_mma;
  auto thr_sum = sum_mma.get_thread_slice(tid);
  Tensor bias_acc = partition_fragment_C(sum_mma, Shape<_64, _8>{});
  const int a_tile = B == 64 ? 0 : h, b_tile = B == 64 ? h : 0;
  mainloop<Cfg, kBlocks, kSum>(sh, n_steps, a_tile, b_tile, acc, bias_acc);

  bool stages_idle = false;  // barrier 1 passed: every wgmma of the CTA has read its stages
  // Blocks of 128 only: compiled into the block 64 kernel, this code (registers, spills in the epilogue) made
  // its sdd 4-10 % slower on an H100 at densities 0.25 and 1.0, and its tail split gained nothing at 0.5.
  if constexpr (Cfg::Block == 128) {
    if (tail_item >= 0) {
      // A tail piece: its fp32 partial results go to tail_ws; the piece that finishes the item last adds the
      // others' (threadfence-reduction pattern) and stores the item as a whole CTA would.
      static_assert(decltype(size(acc))::value == 4 * (kTailVec4 - 1) && decltype(size(bias_acc))::value == 4,
                    "tail_ws holds 128 accumulator and 4 bias values per thread");
      auto slot_of = [&](int pc) {
        return reinterpret_cast<float4*>(p.tail_ws) + (size_t(tail_item * pieces + pc) * 2 + h) * (kTailVec4 * 128);
      };
      float4* mine = slot_of(piece);
      CUTE_UNROLL
      for (int v = 0; v < kTailVec4 - 1; ++v) {
        mine[v * 128 + tid] = make_float4(acc(4 * v), acc(4 * v + 1), acc(4 * v + 2), acc(4 * v + 3));
      }
      mine[(kTailVec4 - 1) * 128 + tid] = make_float4(bias_acc(0), bias_acc(1), bias_acc(2), bias_acc(3));
      __threadfence();
      cutlass::arch::NamedBarrier::sync(128, 2 + h);
      if (tid == 0) {
        int* counter = p.tail_counters + 2 * tail_item + h;
        const bool last = atomicAdd(counter, 1) == pieces - 1;
        if (last) *counter = 0;  // every piece has counted: zeroed for the next launch (kept per stream)
        sh.tail_last[h] = last;
      }
      cutlass::arch::NamedBarrier::sync(128 * consumers, 1);
      stages_idle = true;
      if (!sh.tail_last[h]) return;
      __threadfence();
      for (int other = 0; other < pieces; ++other) {
        if (other == piece) continue;
        const float4* theirs = slot_of(other);
        CUTE_UNROLL
        for (int v = 0; v < kTailVec4 - 1; ++v) {
          const float4 f = __ldcg(theirs + v * 128 + tid);
          acc(4 * v) += f.x;
          acc(4 * v + 1) += f.y;
          acc(4 * v + 2) += f.z;
          acc(4 * v + 3) += f.w;
        }
        const float4 f = __ldcg(theirs + (kTailVec4 - 1) * 128 + tid);
        bias_acc(0) += f.x;
        bias_acc(1) += f.y;
        bias_acc(2) += f.z;
        bias_acc(3) += f.w;
      }
    }
  }

  if constexpr (kSum) {  // every column of bias_acc holds the sum: column 0 is stored
    Tensor bias_coord = thr_sum.partition_C(make_identity_tensor(Shape<_64, _8>{}));
    CUTE_UNROLL
    for (int i = 0; i < size(bias_acc); ++i) {
      if (get<1>(bias_coord(i)) == 0) {
        const int feature = row * B + a_tile * 64 + get<0>(bias_coord(i));
        if (!p.sums_f32) {
          static_cast<T*>(p.bias_grad)[feature] = T(bias_acc(i));
        } else {
          atomicAdd(p.bias_grad_f32 + feature, bias_acc(i));
        }
      }
    }
  }
  if constexpr (!kBlocks) return;

  // Store: accumulator (f, n) -> block j = n / B' of the chunk, element (f', k) of it.
  if (!p.sums_f32) {
    // Stage buffers -> out by TMA: 64-column group g of the tile is one 64 x 64 box of `data`.
    if (!stages_idle) cutlass::arch::NamedBarrier::sync(128 * consumers, 1);  // every wgmma has read its stages
    T* staged = reinterpret_cast<T*>(&sh.stages[0]) + h * 64 * 256;
    stage_rounded<Cfg>(acc, staged);
    cutlass::arch::NamedBarrier::sync(128, 2 + h);
    if (tid == 0) {
      CUTE_UNROLL
      for (int g = 0; g < 4; ++g) {
        // block 64: block 4h + g, all of it; block 128: block g / 2, rows 64h.., columns 64 (g % 2)..
        const int j = B == 64 ? 4 * h + g : g / 2;
        if (j < count) {
          const int col = B == 64 ? 0 : 64 * (g % 2), row_in_block = B == 64 ? 0 : 64 * h;
          sm90ws::tma_store_2d(&p.out_map, staged + g * 64 * 64, col, (begin + j) * B + row_in_block);
        }
      }
      sm90ws::tma_store_wait_read();  // shared memory must outlive the stores' reads
    }
    return;
  }
  // Split M: stage buffers -> out_f32 by TMA reduce-add, 64 x 32 fp32 boxes (atomics from the registers took
  // ~15 us of a ~55 us CTA: H100, block 64, density 0.25).
  cutlass::arch::NamedBarrier::sync(128 * consumers, 1);  // every wgmma of the CTA has read its stages
  float* staged = reinterpret_cast<float*>(&sh.stages[0]) + h * 64 * 256;
  Tensor sums = make_tensor(make_smem_ptr(staged), typename Cfg::SmemLayoutSums{});
  Tensor coord = thr_mma.partition_C(make_identity_tensor(Shape<_64, _256>{}));
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += 2) {  // values i, i + 1: columns n, n + 1 of one row (8 bytes)
    const float* dst = raw_pointer_cast(&sums(get<0>(coord(i)), get<1>(coord(i))));
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(cute::cast_smem_ptr_to_uint(dst)), "f"(acc(i)),
                 "f"(acc(i + 1)) : "memory");
  }
  cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by the TMA reduction
  cutlass::arch::NamedBarrier::sync(128, 2 + h);
  if (tid == 0) {
    CUTE_UNROLL
    for (int g = 0; g < 8; ++g) {
      // columns 32g.. of the tile: block 64, block 4h + g / 2, columns 32 (g % 2)..; block 128, block g / 4,
      // rows 64h.., columns 32 (g % 4)..
      const int j = B == 64 ? 4 * h + g / 2 : g / 4;
      if (j < count) {
        const int col = B == 64 ? 32 * (g % 2) : 32 * (g % 4), row_in_block = B == 64 ? 0 : 64 * h;
        sm90ws::tma_reduce_add_2d(&p.out_map, staged + g * 64 * 32, col, (begin + j) * B + row_in_block);
      }
    }
    sm90ws::tma_store_wait_read();  // shared memory must outlive the reductions' reads
  }
}

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) sdd_kernel(const __grid_constant__ KernelParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace cute;
  using T = typename Cfg::T;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TxBarrier = cutlass::arch::ClusterTransactionBarrier;
  constexpr int S = Cfg::kStages, B = Cfg::Block, BK = Cfg::BK;
  extern __shared__ char smem_raw[];
  auto& sh = sm90ws::aligned_shared_storage<typename Cfg::SharedStorage>(smem_raw);

  // Slot y < full_slots: full chunk y of the row; slot full_slots + i: the row's partial chunk if it has
  // kChunk - 1 - i blocks. The hardware hands out CTAs in order of y, so all full chunks go first and the
  // partial ones by decreasing size: the longest-job-first order that keeps the last wave short (Nsight,
  // block 64 density 0.5: SMs were active 76 % of the time with chunks in row order).
  // With the bias gradient, slot full_slots + kChunk - 1 serves rows without blocks (count 0: dy only), and the
  // CTA of a row's first chunk sums its dy. Slots from item_slots on are the tail pieces (KernelParams).
  constexpr int C = Cfg::kChunk;
  const int steps = int((p.m + BK - 1) / BK);
  int row = int(blockIdx.x), slot = int(blockIdx.y);
  wait_for_previous_grid_and_release_next();  // before any global access (grid_dependency.cuh)
  int tail_item = -1, piece = 0, pieces = 1;
  const bool tail_cta = slot >= p.item_slots;
  if (!tail_cta && !RowSlots<C>(p, __ldg(p.row_offsets + row + 1) - __ldg(p.row_offsets + row)).works(slot)) {
    return;  // most CTAs of the grid: uniform for the whole CTA
  }
  if (Cfg::Block == 128 && p.split_pieces) {
    // Piece blockIdx.z of item `rank` (the CTA's place among the working CTAs of one split, < W).
    if (threadIdx.x < 32) {
      int total, rank;
      count_working<C>(p, row, slot, total, rank);
      if (threadIdx.x == 0) sh.tail[0] = rank;
    }
    __syncthreads();
    tail_item = sh.tail[0];
    piece = int(blockIdx.z);
    pieces = p.splits;
  } else if (Cfg::Block == 128 && p.tail_slots > 0) {
    // Warp 0 counts the working CTAs W = q x sms + e: the last e (in dispatch order) give up their item to
    // e x pieces tail pieces (pieces <= sms / e, each >= kTailMinSteps token steps), which run as one wave.
    if (threadIdx.x < 32) {
      int total, rank;
      count_working<C>(p, row, tail_cta ? 0 : slot, total, rank);
      const int q = total / p.sms, e = total - q * p.sms;
      const int s = e > 0 ? min(p.sms / e, steps / kTailMinSteps) : 0;
      const bool split = q >= 1 && s >= 2;
      int item = -2;  // -2: exit; -1: the CTA's own item, whole; >= 0: tail item
      int item_row = row, item_slot = slot;
      if (!tail_cta) {
        item = split && rank >= q * p.sms ? -2 : -1;
      } else {
        const int index = (slot - p.item_slots) * int(gridDim.x) + row;
        if (split && index < e * s) {
          item = index / s;
          find_working<C>(p, q * p.sms + item, item_row, item_slot);
          if (threadIdx.x == 0) {
            sh.tail[1] = index % s;
            sh.tail[2] = s;
          }
        }
      }
      if (threadIdx.x == 0) {
        sh.tail[0] = item;
        sh.item[0] = item_row;
        sh.item[1] = item_slot;
      }
    }
    __syncthreads();
    tail_item = sh.tail[0];
    if (tail_item == -2) return;  // uniform
    row = sh.item[0];
    slot = sh.item[1];
    if (tail_item >= 0) {
      piece = sh.tail[1];
      pieces = sh.tail[2];
    }
  }
  const int row_begin = __ldg(p.row_offsets + row), row_blocks = __ldg(p.row_offsets + row + 1) - row_begin;
  const int full_chunks = row_blocks / C, rest = row_blocks % C;
  int begin = row_begin, count = 0;
  bool sums_bias;
  if (slot == p.full_slots + C - 1) {  // a row without blocks: its bias sum
    sums_bias = true;
  } else if (slot < p.full_slots) {
    begin = row_begin + slot * C;
    count = C;
    sums_bias = p.with_bias && slot == 0;
  } else {
    begin = row_begin + full_chunks * C;
    count = rest;
    sums_bias = p.with_bias && full_chunks == 0;
  }
  // This CTA's token steps: a split of M (grid.z), or a tail piece's share (pieces of a split alike).
  int step_begin, step_end;
  if (tail_item >= 0) {
    step_begin = int(int64_t(steps) * piece / pieces);
    step_end = int(int64_t(steps) * (piece + 1) / pieces);
  } else {
    const int per_split = (steps + p.splits - 1) / p.splits;
    step_begin = min(steps, int(blockIdx.z) * per_split);
    step_end = min(steps, step_begin + per_split);
  }
  const int n_steps = step_end - step_begin;
  // block 64: consumer h has blocks 4h .. 4h+3 of the chunk (maybe none); block 128: both consumers work.
  const int active_consumers = B == 64 ? (count > 4 ? 2 : 1) : 2;

  const int warpgroup = threadIdx.x / 128;
  sm90ws::init_pipeline<S>(sh.full, sh.empty, 128 * active_consumers);
  if (sums_bias) {
    for (int i = threadIdx.x; i < 8 * BK; i += Cfg::kThreads) sh.ones[i] = T(1.0f);
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes, read next by wgmma
  }
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<40>();
    if (threadIdx.x == 0) {
      int cols[Cfg::kChunk];
      CUTE_UNROLL
      for (int j = 0; j < Cfg::kChunk; ++j) cols[j] = j < count ? __ldg(p.col_indices + begin + j) : 0;
      const int bytes = (Cfg::kATiles + (B == 64 ? count : 2 * count)) * Cfg::kBoxBytes;
      for (int it = 0; it < n_steps; ++it) {
        const int s = it % S, token = (step_begin + it) * BK;
        Barrier::wait(&sh.empty[s], ((it / S) & 1) ^ 1);
        TxBarrier::arrive_and_expect_tx(&sh.full[s], bytes);
        auto& st = sh.stages[s];
        CUTE_UNROLL
        for (int a = 0; a < Cfg::kATiles; ++a) {
          sm90ws::tma_load_2d(st.a[a], &p.dy_map, &sh.full[s], row * B + a * 64, token);
        }
        CUTE_UNROLL
        for (int j = 0; j < Cfg::kChunk; ++j) {
          if (j < count) {
            if constexpr (B == 64) {
              sm90ws::tma_load_2d(st.b[j / 4] + (j % 4) * 64 * BK, &p.x_map, &sh.full[s], cols[j] * B, token);
            } else {
              for (int half = 0; half < 2; ++half) {
                sm90ws::tma_load_2d(st.b[0] + (2 * j + half) * 64 * BK, &p.x_map, &sh.full[s],
                                    cols[j] * B + half * 64, token);
              }
            }
          }
        }
      }
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<232>();
  const int h = warpgroup - 1;
  if (h >= active_consumers) return;

  // Each combination its own straight-line mainloop: a wgmma under a runtime condition inside the loop makes
  // ptxas serialize the wgmmas (C7520).
  const bool my_bias = sums_bias && (B == 128 || h == 0);
  if (count == 0) {
    consume<Cfg, false, true>(p, sh, h, active_consumers, row, begin, count, n_steps, tail_item, piece, pieces);
  } else if (my_bias) {
    consume<Cfg, true, true>(p, sh, h, active_consumers, row, begin, count, n_steps, tail_item, piece, pieces);
  } else {
    consume<Cfg, true, false>(p, sh, h, active_consumers, row, begin, count, n_steps, tail_item, piece, pieces);
  }
#else
  __trap();
#endif
}

template <class Cfg>
cudaError_t launch(const void* dy, const void* x, int64_t m, int n_block_rows, int n_block_cols,
                   int64_t nnz, const int32_t* row_offsets, const int32_t* col_indices, void* out,
                   float* out_f32, void* bias_grad, float* bias_grad_f32, int splits, int sms, float* tail_ws,
                   int* tail_counters, bool programmatic, cudaStream_t stream) {
  if (n_block_rows == 0) return cudaSuccess;
  constexpr int B = Cfg::Block;
  const CUtensorMapDataType dtype = std::is_same<typename Cfg::T, cute::half_t>::value
                                        ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                        : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  KernelParams p;
  // A split of M sums into a zeroed fp32 workspace (out_f32) or, with blocks of 128, in the kernel's pieces
  // (tail_ws and tail_counters sized for them by the caller).
  p.sums_f32 = splits > 1 && out_f32 != nullptr;
  p.split_pieces = splits > 1 && out_f32 == nullptr;
  if (p.split_pieces && (B != 128 || tail_ws == nullptr || tail_counters == nullptr)) return cudaErrorInvalidValue;
  cudaError_t err = sm90ws::encode_2d_map(&p.dy_map, dtype, dy, uint64_t(n_block_rows) * B, uint64_t(m), 64,
                                          Cfg::BK);
  if (err != cudaSuccess) return err;
  err = sm90ws::encode_2d_map(&p.x_map, dtype, x, uint64_t(n_block_cols) * B, uint64_t(m), 64, Cfg::BK);
  if (err != cudaSuccess) return err;
  if (nnz > 0) {
    err = !p.sums_f32 ? sm90ws::encode_2d_map(&p.out_map, dtype, out, B, uint64_t(nnz) * B, 64, 64)
                      : sm90ws::encode_2d_map(&p.out_map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, out_f32, B,
                                              uint64_t(nnz) * B, 32, 64, 4);
    if (err != cudaSuccess) return err;
  }
  p.row_offsets = row_offsets;
  p.col_indices = col_indices;
  p.m = m;
  p.bias_grad = bias_grad;
  p.bias_grad_f32 = bias_grad_f32;
  p.with_bias = bias_grad != nullptr || bias_grad_f32 != nullptr;
  p.splits = splits;
  p.full_slots = n_block_cols / Cfg::kChunk;
  p.item_slots = p.full_slots + Cfg::kChunk - 1 + (p.with_bias ? 1 : 0);
  p.sms = sms;
  p.tail_ws = tail_ws;
  p.tail_counters = tail_counters;
  // Enough tail slots for up to `sms` pieces (a row per CTA in each).
  p.tail_slots = B == 128 && splits == 1 && tail_ws != nullptr && tail_counters != nullptr && sms > 0
                     ? (sms + n_block_rows - 1) / n_block_rows : 0;
  err = sm80::prepare<sdd_kernel<Cfg>>(Cfg::kSmemBytes);
  if (err != cudaSuccess) return err;
  dim3 grid(unsigned(n_block_rows), unsigned(p.item_slots + p.tail_slots), unsigned(splits));
  return launch_kernel(sdd_kernel<Cfg>, grid, Cfg::kThreads, Cfg::kSmemBytes, stream, programmatic, 1, p);
}

template <class Cfg>
cudaError_t launch_config(const SddParams& p, cudaStream_t stream) {
  return launch<Cfg>(p.dy, p.x, p.m, p.n_block_rows, p.n_block_cols, p.nnz, p.row_offsets, p.col_indices, p.out,
                     p.out_f32, p.bias_grad, p.bias_grad_f32, p.splits, p.sms, p.tail_ws, p.tail_counters,
                     p.programmatic, stream);
}

}  // namespace sm90sdd
}  // namespace pbsng
