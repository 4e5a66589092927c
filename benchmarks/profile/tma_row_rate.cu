// Diagnostic (standalone, not part of the extension): how fast one SM receives TMA loads from L2, by box shape.
// Each CTA (one per SM, or fewer) runs a single thread that keeps S (4 or 6) stages of 32 KB in flight: it waits for
// the oldest stage's bytes and at once loads it again, so nothing but the loads bounds the loop. Every stage is 32
// KB, split into boxes of 64-byte rows (32 bf16, the block-32 kernels' activation and W boxes) or 128-byte rows (the
// 256-token kernels' boxes and the block-32 dsd's W blocks), either strided (rows of a 2048 x 4096 matrix, as an
// activation tile) or contiguous (rows back to back, as a W block in `data`). If the rows bound a stage, the
// 64-byte-row variants take twice the 128-byte-row ones; if the bytes do, all take the same; if the TMA
// instructions do, the small boxes lag.
// Session 33 (benchmarks/results/tma_row_rate_*.txt, doc/kernels.md "Blocks of 32 on Hopper"): the boxes do. Small
// boxes take the same time at 33 CTAs as at 132, whatever their rows: a contiguous 2 KB box ~160 SM clocks, a 4 KB
// one ~170 (16 boxes of 2 KB 1.9x the time of 8 of 4 KB), a strided 2 KB box 190-320 (by machine); 6 stages in
// flight change nothing.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a benchmarks/profile/tma_row_rate.cu \
//        -o /tmp/tma_row_rate && /tmp/tma_row_rate
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                    \
  do {                                                                                 \
    cudaError_t err_ = (call);                                                         \
    if (err_ != cudaSuccess) {                                                         \
      std::printf("%s failed: %s (line %d)\n", #call, cudaGetErrorString(err_), __LINE__); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

constexpr int kStageBytes = 32 * 1024;
constexpr int kRows = 2048, kCols = 4096;  // the source: 16 MB of bf16, resident in L2 after the warm-up

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void wait_parity(uint32_t barrier, uint32_t parity) {
  asm volatile(
      "{\n\t"
      ".reg .pred p;\n\t"
      "WAIT:\n\t"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
      "@!p bra WAIT;\n\t"
      "}" ::"r"(barrier),
      "r"(parity)
      : "memory");
}

// One stage's boxes (box_cols x box_rows each, laid out one after the other), armed with one expect_tx.
__device__ __forceinline__ void load_stage(const CUtensorMap* map, uint32_t barrier, uint32_t destination, int boxes,
                                           int box_cols, int box_rows, int cta, int iteration) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(barrier), "r"(kStageBytes) : "memory");
  const int box_bytes = kStageBytes / boxes;
  // A contiguous map (the W blocks of `data`) is one column of box_cols wide: every box is one run of bytes.
  const int contiguous = box_cols < 0;
  box_cols = contiguous ? -box_cols : box_cols;
  const int col_tiles = contiguous ? 1 : kCols / box_cols;
  const int row_tiles = (contiguous ? kRows * (kCols / box_cols) : kRows) / box_rows;
  for (int b = 0; b < boxes; ++b) {
    const int col = col_tiles == 1 ? 0 : ((cta * 7 + iteration * boxes + b) % col_tiles) * box_cols;
    const int row = ((cta * 13 + iteration * 3 + b * (contiguous ? 17 : 1)) % row_tiles) * box_rows;
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            destination + b * box_bytes),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(barrier)
        : "memory");
  }
}

template <int S>
__global__ void stream_kernel(const __grid_constant__ CUtensorMap map, int boxes, int box_cols, int box_rows,
                              int iterations, long long* clocks) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[S];
  const uint32_t base = (smem_address(smem_raw) + 1023) & ~1023u;
  if (threadIdx.x != 0) return;
  for (int s = 0; s < S; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_address(&full[s])));
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  for (int s = 0; s < S; ++s) {
    load_stage(&map, smem_address(&full[s]), base + s * kStageBytes, boxes, box_cols, box_rows, blockIdx.x, s);
  }
  const long long t0 = clock64();
  for (int it = 0; it < iterations; ++it) {
    const int s = it % S;
    wait_parity(smem_address(&full[s]), (it / S) & 1);
    // Reload the stage at once (the last S loads are drained after the clock stops).
    load_stage(&map, smem_address(&full[s]), base + s * kStageBytes, boxes, box_cols, box_rows, blockIdx.x, it + S);
  }
  const long long t1 = clock64();
  for (int it = iterations; it < iterations + S; ++it) wait_parity(smem_address(&full[it % S]), (it / S) & 1);
  clocks[blockIdx.x] = t1 - t0;
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  void* encode_ptr = nullptr;
  cudaDriverEntryPointQueryResult query;
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &encode_ptr, 12000, cudaEnableDefault, &query));
  if (query != cudaDriverEntryPointSuccess || encode_ptr == nullptr) {
    std::printf("cuTensorMapEncodeTiled not found\n");
    return 1;
  }
  const auto encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(encode_ptr);

  void* source;
  CHECK(cudaMalloc(&source, size_t(kRows) * kCols * 2));
  CHECK(cudaMemset(source, 0x3c, size_t(kRows) * kCols * 2));
  long long* clocks;
  CHECK(cudaMalloc(&clocks, 1024 * sizeof(long long)));
  CHECK(cudaFuncSetAttribute(stream_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * kStageBytes + 1024));
  CHECK(cudaFuncSetAttribute(stream_kernel<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, 6 * kStageBytes + 1024));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));

  struct Variant {
    const char* name;
    int box_cols, box_rows;
    bool contiguous;  // rows of box_cols elements back to back, as a W block's rows in `data`
  };
  const Variant variants[] = {
      {"64-byte rows, 128-row boxes (8 KB: block-32 activations)", 32, 128},
      {"64-byte rows, 256-row boxes (16 KB)", 32, 256},
      {"64-byte rows, 32-row boxes (2 KB: block-32 W, dds)", 32, 32},
      {"128-byte rows, 64-row boxes (8 KB)", 64, 64},
      {"128-byte rows, 128-row boxes (16 KB: 256-token activations)", 64, 128},
      {"128-byte rows, 16-row boxes (2 KB: block-32 W, dsd)", 64, 16},
      {"contiguous 64-byte rows, 32-row boxes (2 KB: a W block, dds)", 32, 32, true},
      {"contiguous 64-byte rows, 64-row boxes (4 KB: two W blocks)", 32, 64, true},
      {"contiguous 128-byte rows, 16-row boxes (2 KB: a W block, dsd)", 64, 16, true},
      {"contiguous 128-byte rows, 32-row boxes (4 KB: two W blocks)", 64, 32, true},
      {"contiguous 128-byte rows, 64-row boxes (8 KB)", 64, 64, true},
  };
  for (const int S : {4, 6}) {  // stages in flight per CTA: does more in flight raise the rate (latency-bound)?
  const int smem = S * kStageBytes + 1024;
  const auto kernel = S == 4 ? stream_kernel<4> : stream_kernel<6>;
  std::printf("%s, %d SMs, stages of 32 KB, %d in flight per CTA, source %d x %d bf16 (L2-resident)\n", prop.name, sms,
              S, kRows, kCols);
  std::printf("%-62s %5s %6s %5s %9s %9s %9s %8s\n", "box", "CTAs", "boxes", "rows", "clk/stage", "B/clk/SM", "clk/row",
              "TB/s");
  for (const Variant& v : variants) {
    CUtensorMap map;
    const cuuint64_t cols = v.contiguous ? v.box_cols : kCols;
    const cuuint64_t dims[2] = {cols, cuuint64_t(kRows) * kCols / cols};
    const cuuint64_t strides[1] = {cols * 2};
    const cuuint32_t box[2] = {cuuint32_t(v.box_cols), cuuint32_t(v.box_rows)};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUtensorMapSwizzle swizzle = v.box_cols == 32 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B;
    const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, source, dims, strides, box, element_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
      std::printf("encode failed (%d) for %s\n", int(r), v.name);
      return 1;
    }
    const int boxes = kStageBytes / (v.box_cols * v.box_rows * 2);
    for (int ctas : {sms, sms / 4}) {
      const int iterations = 2000;
      std::vector<float> times;
      std::vector<double> per_stage;
      for (int rep = 0; rep < 4; ++rep) {
        CHECK(cudaEventRecord(start));
        kernel<<<ctas, 32, smem>>>(map, boxes, v.contiguous ? -v.box_cols : v.box_cols, v.box_rows, iterations,
                                   clocks);
        CHECK(cudaEventRecord(stop));
        CHECK(cudaEventSynchronize(stop));
        CHECK(cudaGetLastError());
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        std::vector<long long> host(ctas);
        CHECK(cudaMemcpy(host.data(), clocks, ctas * sizeof(long long), cudaMemcpyDeviceToHost));
        double sum = 0;
        for (long long c : host) sum += double(c);
        if (rep > 0) {  // the first run warms L2
          times.push_back(ms);
          per_stage.push_back(sum / ctas / iterations);
        }
      }
      std::sort(times.begin(), times.end());
      std::sort(per_stage.begin(), per_stage.end());
      const double clk = per_stage[per_stage.size() / 2], ms = times[times.size() / 2];
      const int rows = boxes * v.box_rows;
      std::printf("%-62s %5d %6d %5d %9.0f %9.1f %9.2f %8.2f\n", v.name, ctas, boxes, rows, clk, kStageBytes / clk,
                  clk / rows, double(kStageBytes) * iterations * ctas / (ms * 1e-3) / 1e12);
    }
  }
  }
  return 0;
}
