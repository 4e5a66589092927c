// Small host helpers that need the kernel configurations but no kernel instantiation.
#include "block_sparse/kernel_sm80.cuh"

namespace pbsng {

namespace {
__global__ void probe_kernel() {}
}  // namespace

int sdd_k_tile_rows(int block) {
  using T = cute::half_t;
  switch (block) {
    case 32: return sm80::SddConfig<T, 32>::type::BK;
    case 64: return sm80::SddConfig<T, 64>::type::BK;
    case 128: return sm80::SddConfig<T, 128>::type::BK;
    default: return 0;
  }
}

// The probe kernel is compiled with the same -gencode list as the product kernels, so asking the runtime
// about it tells whether this build has an image for the current device (cudaErrorNoKernelImageForDevice if not).
cudaError_t kernel_image_status() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, probe_kernel);
}

}  // namespace pbsng
