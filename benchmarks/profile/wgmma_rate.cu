// Diagnostic (standalone, not part of the extension): the tensor cores' rate for the wgmma shapes of the block-32
// kernel (kernel_sm90_b32.cuh) against wider ones, with nothing else in the loop: no barriers, no loads.
//
// Each consumer warpgroup runs `stages` stages of 64 tokens x 256 features x K 32, the work of a block-32 stage
// column with all 8 lines present, as 8 lines of 64 x 32 (N = 32), 4 of 64, 2 of 128 or 1 of 256, each two k-steps
// of 16; per stage: (RS: its A by ldmatrix), fence, the batch, commit, wait<0> (as the kernel's early release).
// Branch: each line's wgmma under a runtime-true flag, as the kernel's `if (flags >> l & 1)`, or under a guard
// predicate of the wgmma itself (which ptxas turns back into a branch per wgmma, each with its own fence).
// Prints clocks per stage (clock64 of each consumer's thread 0, mean over consumers).
//
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -I$CUTLASS/include \
//        benchmarks/profile/wgmma_rate.cu -o /tmp/wgmma_rate && /tmp/wgmma_rate
#include <cstdio>
#include <cuda_runtime.h>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/mma_sm90.hpp>

using namespace cute;
using T = cute::bfloat16_t;

// One 64 x 32 x 16 RS wgmma (bf16, fp32 accumulators) under a guard predicate instead of a branch.
__device__ __forceinline__ void wgmma_64x32x16_rs_guarded(int on, const uint32_t (&a)[4], uint64_t desc_b, float* d) {
  asm volatile(
      "{\n"
      ".reg .pred g;\n"
      "setp.ne.b32 g, %21, 0;\n"
      "@g wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15},"
      "{%16, %17, %18, %19}, %20, 1, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(on));
}

// Branch: 0 none, 1 `if` per line, 2 guard predicate per line (N = 32, RS only).
template <int N, bool RS, int Branch>
__global__ void __launch_bounds__(256, 1) rate_kernel(long long* out, int stages, int consumers, int flags_in) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) char smem_raw[];
  constexpr int L = 256 / N;
  using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW64_Atom<T>{}, make_shape(Int<64>{}, Int<32>{})));
  using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW64_Atom<T>{}, make_shape(Int<N>{}, Int<32>{})));
  using Atom = cute::conditional_t<RS, decltype(GMMA::rs_op_selector<T, T, float, Shape<_64, Int<N>, _16>>()),
                                   decltype(GMMA::ss_op_selector<T, T, float, Shape<_64, Int<N>, _16>>())>;
  using TiledMma = decltype(make_tiled_mma(Atom{}));
  const int h = __reduce_max_sync(0xffffffffu, int(threadIdx.x / 128)), tid = threadIdx.x % 128;
  // Zero operands (the tensor cores' time does not depend on the values), written by all threads before any
  // warpgroup leaves, so that the barrier counts every thread.
  for (int i = threadIdx.x; i < (2 * 64 * 32 + 256 * 32); i += blockDim.x) reinterpret_cast<T*>(smem_raw)[i] = T(0);
  __syncthreads();
  if (h >= consumers) return;
  const int flags = __reduce_or_sync(0xffffffffu, flags_in);
  T* a_ptr = reinterpret_cast<T*>(smem_raw) + h * 64 * 32;
  T* b_ptr = reinterpret_cast<T*>(smem_raw) + 2 * 64 * 32;

  TiledMma mma;
  auto thr = mma.get_thread_slice(tid);
  Tensor sA = make_tensor(make_smem_ptr(a_ptr), SmemLayoutA{});
  Tensor acc = partition_fragment_C(mma, Shape<_64, Int<N * L>>{});
  using LineFragment = decltype(partition_fragment_C(mma, Shape<_64, Int<N>>{}));
  constexpr int kLineValues = decltype(size(LineFragment{}))::value;
  auto acc_line = [&](int l) { return make_tensor(acc.data() + l * kLineValues, LineFragment{}.layout()); };
  clear(acc);
  using TiledLoadA = decltype(make_tiled_copy_A(Copy_Atom<SM75_U32x4_LDSM_N, T>{}, TiledMma{}));
  TiledLoadA load_a;
  auto thr_load_a = load_a.get_thread_slice(tid);
  auto rA = thr.partition_fragment_A(sA);
  auto tCrA_ss = thr.make_fragment_A(thr.partition_A(sA));

  const long long t0 = clock64();
  for (int s = 0; s < stages; ++s) {
    if constexpr (RS) copy(load_a, thr_load_a.partition_S(sA), thr_load_a.retile_D(rA));
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int l = 0; l < L; ++l) {
      Tensor sB = make_tensor(make_smem_ptr(b_ptr + l * N * 32), SmemLayoutB{});
      Tensor tCrB = thr.make_fragment_B(thr.partition_B(sB));
      Tensor c = acc_line(l);
      if constexpr (Branch == 2) {
        static_assert(N == 32 && RS, "the guarded wgmma is 64 x 32 x 16 RS");
        const int on = (flags >> l) & 1;
        CUTE_UNROLL
        for (int k = 0; k < 2; ++k) {
          Tensor ak = recast<uint32_t>(rA(_, _, k));
          const uint32_t a[4] = {ak(0), ak(1), ak(2), ak(3)};
          wgmma_64x32x16_rs_guarded(on, a, uint64_t(tCrB(_0{}, _0{}, k)), &c(0));
        }
      } else if (!Branch || ((flags >> l) & 1)) {
        if constexpr (RS) gemm(mma, rA, tCrB, c);
        else gemm(mma, tCrA_ss, tCrB, c);
      }
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
  }
  const long long t1 = clock64();
  if (tid == 0) out[blockIdx.x * 2 + h] = t1 - t0;
  float sum = 0.f;
  for (int i = 0; i < size(acc); ++i) sum += acc(i);
  if (sum == 12345.f) out[0] = -1;  // keeps the accumulators live; never true (inputs are zero)
#endif
}

template <int N, bool RS, int Branch>
void run(int consumers, int sms) {
  constexpr int kStages = 2000;
  const int smem = (2 * 64 * 32 + 256 * 32) * 2 + 1024;
  auto kernel = rate_kernel<N, RS, Branch>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  long long* out;
  cudaMalloc(&out, sizeof(long long) * sms * 2);
  kernel<<<sms, 256, smem>>>(out, 100, consumers, 0xff);  // warm-up
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0);
  kernel<<<sms, 256, smem>>>(out, kStages, consumers, 0xff);
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  long long host[2 * 1024];
  cudaMemcpy(host, out, sizeof(long long) * sms * 2, cudaMemcpyDeviceToHost);
  double clocks = 0;
  for (int b = 0; b < sms; ++b)
    for (int h = 0; h < consumers; ++h) clocks += double(host[b * 2 + h]);
  clocks /= double(sms) * consumers * kStages;
  // MAC per SM and stage: consumers x 64 x 256 x 32; dense bf16 peak is 2048 MAC per clock per SM (H100).
  const double macs = double(consumers) * 64 * 256 * 32;
  const char* branch = Branch == 2 ? " guard " : Branch == 1 ? " branch" : "       ";
  printf("N=%3d %s%s consumers=%d: %7.1f clocks per stage (%5.1f per 64x%dx16 wgmma, %.0f%% of 2048 MAC/clk), "
         "%.3f ms, %.2f GHz\n", N, RS ? "RS" : "SS", branch, consumers, clocks, clocks / (consumers * 2.0 * (256 / N)),
         N, 100.0 * macs / clocks / 2048.0, ms, clocks * kStages / (ms * 1e-3) / 1e9);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) printf("error: %s\n", cudaGetErrorString(err));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(out);
}

int main() {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const int sms = prop.multiProcessorCount;
  printf("%s, %d SMs\n", prop.name, sms);
  for (int consumers = 1; consumers <= 2; ++consumers) {
    run<32, true, 0>(consumers, sms);
    run<32, true, 1>(consumers, sms);
    run<32, true, 2>(consumers, sms);
    run<32, false, 0>(consumers, sms);
    run<64, true, 0>(consumers, sms);
    run<64, true, 1>(consumers, sms);
    run<128, true, 0>(consumers, sms);
    run<256, true, 0>(consumers, sms);
    run<256, false, 0>(consumers, sms);
  }
  return 0;
}
