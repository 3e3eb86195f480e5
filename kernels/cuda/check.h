// Status checks for the CUDA libraries: one macro family, one message shape.
// Each throws kiln::Error naming the call, the library's status string and the
// caller's file:line, e.g.
//   "CUDA error: cudaMalloc(&p, n) failed: out of memory (cudaErrorMemoryAllocation)"
// Include only from kernels/cuda/* (it pulls in the library headers it checks;
// the cuBLAS/cuDNN/NCCL macros need their header included before use).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/error.h"

// CUDA runtime calls (cudaError_t).
#define KILN_CUDA_CHECK(call)                                                         \
  do {                                                                                \
    const cudaError_t kiln_cuda_status_ = (call);                                     \
    if (kiln_cuda_status_ != cudaSuccess) [[unlikely]] {                              \
      /* cleared, or the next launch check would blame another kernel for it */       \
      (void)cudaGetLastError();                                                       \
      throw ::kiln::Error(::kiln::detail::concat("CUDA error: ", #call, " failed: ",  \
                                                 cudaGetErrorString(kiln_cuda_status_), \
                                                 " (", cudaGetErrorName(kiln_cuda_status_), ")"), \
                          __FILE__, __LINE__);                                        \
    }                                                                                 \
  } while (0)

// cuBLAS / cuBLASLt calls (cublasStatus_t); needs <cublas_v2.h> or <cublasLt.h>.
#define KILN_CUBLAS_CHECK(call)                                                       \
  do {                                                                                \
    const cublasStatus_t kiln_cublas_status_ = (call);                                \
    if (kiln_cublas_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]] {                  \
      throw ::kiln::Error(::kiln::detail::concat("cuBLAS error: ", #call, " failed: ", \
                                                 cublasGetStatusString(kiln_cublas_status_), \
                                                 " (status ", static_cast<int>(kiln_cublas_status_), ")"), \
                          __FILE__, __LINE__);                                        \
    }                                                                                 \
  } while (0)

// cuDNN calls (cudnnStatus_t); needs <cudnn.h>.
#define KILN_CUDNN_CHECK(call)                                                        \
  do {                                                                                \
    const cudnnStatus_t kiln_cudnn_status_ = (call);                                  \
    if (kiln_cudnn_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]] {                    \
      throw ::kiln::Error(::kiln::detail::concat("cuDNN error: ", #call, " failed: ", \
                                                 cudnnGetErrorString(kiln_cudnn_status_), \
                                                 " (status ", static_cast<int>(kiln_cudnn_status_), ")"), \
                          __FILE__, __LINE__);                                        \
    }                                                                                 \
  } while (0)

// NCCL calls (ncclResult_t); needs <nccl.h>. ncclGetLastError adds the
// communicator's detail (which peer, which transport) where NCCL has one.
#define KILN_NCCL_CHECK(call)                                                         \
  do {                                                                                \
    const ncclResult_t kiln_nccl_status_ = (call);                                    \
    if (kiln_nccl_status_ != ncclSuccess && kiln_nccl_status_ != ncclInProgress) [[unlikely]] { \
      const char* kiln_nccl_detail_ = ncclGetLastError(nullptr);                      \
      throw ::kiln::Error(::kiln::detail::concat("NCCL error: ", #call, " failed: ",  \
                                                 ncclGetErrorString(kiln_nccl_status_), \
                                                 " (status ", static_cast<int>(kiln_nccl_status_), ")", \
                                                 (kiln_nccl_detail_ && *kiln_nccl_detail_) ? ": " : "", \
                                                 kiln_nccl_detail_ ? kiln_nccl_detail_ : ""), \
                          __FILE__, __LINE__);                                        \
    }                                                                                 \
  } while (0)
