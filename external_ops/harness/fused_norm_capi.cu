// Paddle-free C ABI around fused_norm_kernels.cuh, loaded with ctypes by
// benchmarks/rms_norm_cuda.py. Build:
//   nvcc -O3 -shared -Xcompiler -fPIC -arch=sm_90 \
//        -o libfused_norm.so external_ops/harness/fused_norm_capi.cu
// All pointers are device pointers; rows x cols is row-major; invvar is float32
// [rows]; workspace is float32 with fused_norm_bwd_workspace_elems() elements.
// Every function returns a cudaError_t value (0 = success); the launches are
// asynchronous on `stream` (0 = default stream).
#include "../fused_norm_kernels.cuh"

extern "C" {

int fused_norm_bwd_workspace_elems(int64_t rows, int64_t cols,
                                   int64_t* elems) {
  return static_cast<int>(
      fused_norm::backward_workspace_elems(rows, cols, true, elems));
}

int rms_norm_fwd_f32(const float* x, const float* scale, float* y,
                     float* invvar, int64_t rows, int64_t cols, float eps,
                     cudaStream_t stream) {
  return static_cast<int>(fused_norm::norm_forward<float>(
      x, scale, nullptr, y, nullptr, invvar, rows, cols, eps, true, stream));
}

int rms_norm_fwd_bf16(const __nv_bfloat16* x, const __nv_bfloat16* scale,
                      __nv_bfloat16* y, float* invvar, int64_t rows,
                      int64_t cols, float eps, cudaStream_t stream) {
  return static_cast<int>(fused_norm::norm_forward<__nv_bfloat16>(
      x, scale, nullptr, y, nullptr, invvar, rows, cols, eps, true, stream));
}

int rms_norm_bwd_f32(const float* x, const float* scale, const float* invvar,
                     const float* dy, float* dx, float* dscale,
                     float* workspace, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
  return static_cast<int>(fused_norm::norm_backward<float>(
      x, scale, nullptr, invvar, dy, dx, dscale, nullptr, workspace, rows,
      cols, true, stream));
}

int rms_norm_bwd_bf16(const __nv_bfloat16* x, const __nv_bfloat16* scale,
                      const float* invvar, const __nv_bfloat16* dy,
                      __nv_bfloat16* dx, __nv_bfloat16* dscale,
                      float* workspace, int64_t rows, int64_t cols,
                      cudaStream_t stream) {
  return static_cast<int>(fused_norm::norm_backward<__nv_bfloat16>(
      x, scale, nullptr, invvar, dy, dx, dscale, nullptr, workspace, rows,
      cols, true, stream));
}

}  // extern "C"
