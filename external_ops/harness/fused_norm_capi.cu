// Paddle-free C ABI around fused_norm_kernels.cuh, loaded with ctypes by
// benchmarks/rms_norm_cuda.py. Build:
//   nvcc -O3 -shared -Xcompiler -fPIC -arch=sm_90 \
//        -o libfused_norm.so external_ops/harness/fused_norm_capi.cu
// All pointers are device pointers; rows x cols is row-major; mean and invvar
// are float32 [rows]; workspace is float32 with <norm>_bwd_workspace_<dtype>()
// elements. Every function returns a cudaError_t value (0 = success); the
// launches are asynchronous on `stream` (0 = default stream).
//
// For each dtype suffix (f32: float, bf16: __nv_bfloat16):
//   rms_norm_fwd_<s>(x, scale, y, invvar, rows, cols, eps, stream)
//   rms_norm_bwd_workspace_<s>(rows, cols, &elems)
//   rms_norm_bwd_<s>(x, scale, invvar, dy, dx, dscale, workspace, rows, cols,
//                    stream)
//   layer_norm_fwd_<s>(x, scale, bias, y, mean, invvar, rows, cols, eps,
//                      stream)
//   layer_norm_bwd_workspace_<s>(rows, cols, &elems)
//   layer_norm_bwd_<s>(x, scale, mean, invvar, dy, dx, dscale, dbias,
//                      workspace, rows, cols, stream)
#include "../fused_norm_kernels.cuh"

#define FUSED_NORM_CAPI(S, T)                                                  \
  int rms_norm_fwd_##S(const T* x, const T* scale, T* y, float* invvar,        \
                       int64_t rows, int64_t cols, float eps,                  \
                       cudaStream_t stream) {                                  \
    return static_cast<int>(fused_norm::norm_forward<T>(                       \
        x, scale, nullptr, y, nullptr, invvar, rows, cols, eps, true,          \
        stream));                                                              \
  }                                                                            \
  int rms_norm_bwd_workspace_##S(int64_t rows, int64_t cols, int64_t* elems) { \
    return static_cast<int>(                                                   \
        fused_norm::backward_workspace_elems<T>(rows, cols, true, elems));     \
  }                                                                            \
  int rms_norm_bwd_##S(const T* x, const T* scale, const float* invvar,        \
                       const T* dy, T* dx, T* dscale, float* workspace,        \
                       int64_t rows, int64_t cols, cudaStream_t stream) {      \
    return static_cast<int>(fused_norm::norm_backward<T>(                      \
        x, scale, nullptr, invvar, dy, dx, dscale, nullptr, workspace, rows,   \
        cols, true, stream));                                                  \
  }                                                                            \
  int layer_norm_fwd_##S(const T* x, const T* scale, const T* bias, T* y,      \
                         float* mean, float* invvar, int64_t rows,             \
                         int64_t cols, float eps, cudaStream_t stream) {       \
    return static_cast<int>(fused_norm::norm_forward<T>(                       \
        x, scale, bias, y, mean, invvar, rows, cols, eps, false, stream));     \
  }                                                                            \
  int layer_norm_bwd_workspace_##S(int64_t rows, int64_t cols,                 \
                                   int64_t* elems) {                           \
    return static_cast<int>(                                                   \
        fused_norm::backward_workspace_elems<T>(rows, cols, false, elems));    \
  }                                                                            \
  int layer_norm_bwd_##S(const T* x, const T* scale, const float* mean,        \
                         const float* invvar, const T* dy, T* dx, T* dscale,   \
                         T* dbias, float* workspace, int64_t rows,             \
                         int64_t cols, cudaStream_t stream) {                  \
    return static_cast<int>(fused_norm::norm_backward<T>(                      \
        x, scale, mean, invvar, dy, dx, dscale, dbias, workspace, rows, cols,  \
        false, stream));                                                       \
  }

extern "C" {
FUSED_NORM_CAPI(f32, float)
FUSED_NORM_CAPI(bf16, __nv_bfloat16)
}  // extern "C"
