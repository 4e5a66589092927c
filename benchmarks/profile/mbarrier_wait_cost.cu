// Diagnostic (standalone, not part of the extension): clocks per mbarrier try_wait on phases that have already
// completed, with the barrier's address in a per-thread register (`[R..]` in the SASS: the base loaded by each lane
// from global memory, which the compiler cannot prove uniform) or in a uniform one (`[UR..]`: the same base through
// a warp reduction). Each iteration probes one of 4 barriers, as a consumer walks its stages. Session 31 asked
// whether a per-thread address costs a probe per lane (doc/kernels.md, "After session 31").
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a benchmarks/profile/mbarrier_wait_cost.cu \
//        -o /tmp/mbarrier_wait_cost && /tmp/mbarrier_wait_cost
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

__device__ __forceinline__ uint32_t try_wait(uint32_t address, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
      "selp.u32 %0, 1, 0, p;\n\t"
      "}"
      : "=r"(done)
      : "r"(address), "r"(parity)
      : "memory");
  return done;
}

template <bool Uniform>
__global__ void wait_kernel(const uint32_t* offset, long long* out, int iterations) {
  __shared__ __align__(8) uint64_t barrier[4];
  const uint32_t shared_base = static_cast<uint32_t>(__cvta_generic_to_shared(&barrier[0]));
  if (threadIdx.x == 0) {
    for (int i = 0; i < 4; ++i) {  // count 1, then one arrival: phase 0 of every barrier is complete
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_base + 8 * i));
      asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_base + 8 * i) : "memory");
    }
  }
  __syncthreads();
  uint32_t base = shared_base + offset[threadIdx.x];  // offset[i] == 0 for every i
  if (Uniform) base = __reduce_max_sync(0xffffffffu, base);
  uint32_t count = 0;
  const long long t0 = clock64();
  for (int i = 0; i < iterations; ++i) count += try_wait(base + 8 * (i % 4), 0);
  const long long t1 = clock64();
  if (threadIdx.x % 32 == 0) out[blockIdx.x * 32 + threadIdx.x / 32] = t1 - t0;
  if (count != uint32_t(iterations)) out[0] = -1;  // every probe of a completed phase succeeds
}

template <bool Uniform>
void run(int warps, int sms) {
  constexpr int kIterations = 10000;
  uint32_t* offset;
  long long* out;
  cudaMalloc(&offset, 1024 * sizeof(uint32_t));
  cudaMemset(offset, 0, 1024 * sizeof(uint32_t));
  cudaMalloc(&out, sms * 32 * sizeof(long long));
  wait_kernel<Uniform><<<sms, warps * 32>>>(offset, out, 100);  // warm-up
  wait_kernel<Uniform><<<sms, warps * 32>>>(offset, out, kIterations);
  static long long host[1024 * 32];
  cudaMemcpy(host, out, sms * 32 * sizeof(long long), cudaMemcpyDeviceToHost);
  double sum = 0;
  bool failed = false;
  for (int b = 0; b < sms; ++b) {
    for (int w = 0; w < warps; ++w) {
      failed |= host[b * 32 + w] < 0;
      sum += double(host[b * 32 + w]);
    }
  }
  printf("%s address, %2d warps per SM: %6.1f clocks per try_wait per warp%s\n", Uniform ? "uniform  " : "per-lane ",
         warps, sum / (double(sms) * warps * kIterations), failed ? " (A PROBE FAILED)" : "");
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) printf("error: %s\n", cudaGetErrorString(err));
  cudaFree(offset);
  cudaFree(out);
}

int main() {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const int sms = prop.multiProcessorCount;
  printf("%s\n", prop.name);
  for (int warps : {1, 4, 12}) {
    run<false>(warps, sms);
    run<true>(warps, sms);
  }
  return 0;
}
