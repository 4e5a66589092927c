// Programmatic dependent launch (PDL, sm_90) for the product kernels where this build's sm_90a code runs.
//
// A kernel launched with the programmatic-serialization attribute may be scheduled before the kernel ahead of it
// in the stream has finished: its CTAs take the SMs that the earlier kernel's CTAs leave, set up their shared
// memory, and wait in wait_for_previous_grid() until that kernel has completed and its writes are visible. That
// hides the gap between back-to-back kernels: on an H200, dsd / dds calls of 3-20 us in CUDA graphs took up to 14 %
// (median 6 %) less time (benchmarks/results/ab_programmatic_launch_*.txt). So every CTA of a kernel launched with
// the attribute calls wait_for_previous_grid() before its first global-memory access (read or write: the index
// arrays and tile counters may be written by the kernel before it; and a grid whose CTAs all skipped it could
// complete before the kernel it follows, which the kernel after it would then not wait for), then
// release_next_grid() to let the next one be scheduled. Without the attribute both are no-ops.
//
// cutlass::arch::wait_on_dependent_grids / launch_dependent_grids emit the same instructions, but only when
// CUTLASS_ENABLE_GDC_FOR_SM90 is defined for the whole build, and their header brings in CUTLASS's GEMM and conv
// dispatch policies (~5 s more per translation unit measured here).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace pbsng {

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The next kernel (if launched with the attribute) is scheduled once every CTA of this grid has called this or
// exited, i.e. once this grid's last CTAs are running. Our kernels call it right after wait_for_previous_grid():
// from then on the next kernel's CTAs take the room this grid's CTAs leave and wait there. (A later release, e.g.
// after a CTA's mainloop, was not tried.)
__device__ __forceinline__ void release_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// What every product kernel does before its first global access: wait for the previous grid, then release the
// next one. A no-op without the attribute and in the sm_80 code.
__device__ __forceinline__ void wait_for_previous_grid_and_release_next() {
  wait_for_previous_grid();
  release_next_grid();
}

// The launch configuration of kernel<<<grid, threads, smem_bytes, stream>>>, in clusters of `cluster` CTAs when
// > 1, and with the programmatic-serialization attribute when `programmatic`. `attrs` holds the attributes it
// points to, so it must outlive the configuration's use (also for occupancy queries, which take the same config).
inline cudaLaunchConfig_t launch_config(dim3 grid, int threads, int smem_bytes, cudaStream_t stream, bool programmatic,
                                        int cluster, cudaLaunchAttribute (&attrs)[2]) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(unsigned(threads));
  config.dynamicSmemBytes = size_t(smem_bytes);
  config.stream = stream;
  unsigned n = 0;
  if (cluster > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = unsigned(cluster);
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (programmatic) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  config.attrs = attrs;
  config.numAttrs = n;
  return config;
}

// kernel<<<grid, threads, smem_bytes, stream>>>(args...) with launch_config's clusters and attribute (when
// `programmatic`, the kernel must call wait_for_previous_grid()).
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, int threads, int smem_bytes, cudaStream_t stream,
                          bool programmatic, int cluster, Args&&... args) {
  cudaLaunchAttribute attrs[2];
  const cudaLaunchConfig_t config = launch_config(grid, threads, smem_bytes, stream, programmatic, cluster, attrs);
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace pbsng
