// CUDA GEMM: cuBLASLt for float32/float16/bfloat16, cuBLAS for float64.
// Invariants:
//   - kiln's row-major C = op(A) @ op(B) is cuBLAS's column-major
//     C^T = op(B)^T @ op(A)^T: the operands swap and keep their transpose flags,
//     so no operand is ever copied here;
//   - float16/bfloat16 accumulate in float32; float32 uses TF32 tensor cores
//     only when the caller allows it;
//   - the bias is a cuBLASLt epilogue (one kernel); where no algorithm offers
//     it (and for float64) C is first filled with the broadcast bias and the
//     product is added with beta = 1;
//   - handles are created once per device (cuBLASLt) or per thread and device
//     (cuBLAS, whose handle holds a stream) and never destroyed: destroying
//     them at exit could run after the driver has shut down;
//   - the algorithm chosen by the heuristic is cached per problem (shape,
//     layout, alignment, workspace): the heuristic costs tens of microseconds
//     and re-running it could pick another algorithm, i.e. other bits.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <climits>
#include <map>
#include <mutex>
#include <vector>

#include "kernels/copy.h"
#include "kernels/cuda/check.h"
#include "kernels/linalg.h"

namespace kiln::kernels {

namespace {

cublasLtHandle_t lt_handle(int device) {
  static std::mutex mutex;
  static auto* handles = new std::vector<cublasLtHandle_t>();  // never destroyed, see above
  std::lock_guard lock(mutex);
  if (handles->size() <= static_cast<size_t>(device)) handles->resize(device + 1, nullptr);
  cublasLtHandle_t& handle = (*handles)[device];
  if (handle == nullptr) KILN_CUBLAS_CHECK(cublasLtCreate(&handle));
  return handle;
}

cublasHandle_t blas_handle(int device) {
  thread_local std::vector<cublasHandle_t> handles;  // handles leak at thread exit, see above
  if (handles.size() <= static_cast<size_t>(device)) handles.resize(device + 1, nullptr);
  cublasHandle_t& handle = handles[device];
  if (handle == nullptr) KILN_CUBLAS_CHECK(cublasCreate(&handle));
  return handle;
}

// Largest power of two (at most 256) dividing every address the batch touches.
uint32_t alignment_bytes(const void* data, int64_t batch_stride, int64_t batch, size_t element_size) {
  uint64_t bits = reinterpret_cast<uint64_t>(data);
  if (batch > 1 && batch_stride != 0) bits |= static_cast<uint64_t>(batch_stride) * element_size;
  uint32_t alignment = 256;
  while (alignment > 1 && bits % alignment != 0) alignment /= 2;
  return alignment;
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: break;
  }
  KILN_THROW("matmul on CUDA: expected float32, float64, float16 or bfloat16, got ", dtype_name(dtype));
}

// RAII for the cuBLASLt descriptors of one call.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  LtDescriptors() = default;
  LtDescriptors(const LtDescriptors&) = delete;
  LtDescriptors& operator=(const LtDescriptors&) = delete;
  ~LtDescriptors() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// Column-major layout of a stored row-major matrix: (stored cols, stored rows).
void make_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                 int64_t batch, int64_t batch_stride) {
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, type, rows, cols, ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    KILN_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                       &batch_stride, sizeof(batch_stride)));
  }
}

using AlgoKey = std::array<int64_t, 22>;
struct AlgoCache {
  std::mutex mutex;
  std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;
};
AlgoCache& algo_cache() {
  static auto* cache = new AlgoCache();
  return *cache;
}

// Runs the cuBLASLt product; `with_bias` asks for the bias epilogue, `beta`
// is 0 or 1 (C already holds the bias). Returns false when the heuristic has
// no algorithm for this configuration.
bool lt_matmul(const GemmProblem& p, bool allow_tf32, bool with_bias, float beta, void* workspace,
               size_t workspace_bytes, int device, cuda::Stream stream) {
  const cudaDataType_t type = cuda_type(p.dtype);
  const size_t element = dtype_size(p.dtype);
  const cublasComputeType_t compute =
      p.dtype == DType::f32 && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  LtDescriptors d;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F));
  // cuBLAS "A" is our B, cuBLAS "B" is our A (see the file comment).
  const cublasOperation_t trans_a = p.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t trans_b = p.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (with_bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    KILN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    KILN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
  }
  make_layout(&d.a, type, p.b.transposed ? p.k : p.n, p.b.transposed ? p.n : p.k, p.b.ld, p.batch,
              p.b.batch_stride);
  make_layout(&d.b, type, p.a.transposed ? p.m : p.k, p.a.transposed ? p.k : p.m, p.a.ld, p.batch,
              p.a.batch_stride);
  make_layout(&d.c, type, p.n, p.m, p.c.ld, p.batch, p.c.batch_stride);

  const uint32_t align_a = alignment_bytes(p.b.data, p.b.batch_stride, p.batch, element);
  const uint32_t align_b = alignment_bytes(p.a.data, p.a.batch_stride, p.batch, element);
  const uint32_t align_c = alignment_bytes(p.c.data, p.c.batch_stride, p.batch, element);
  const uint32_t align_bias = with_bias ? alignment_bytes(p.bias, 0, 1, element) : 0;
  const AlgoKey key = {device, static_cast<int64_t>(p.dtype), allow_tf32, with_bias, beta != 0, p.batch, p.m, p.n,
                       p.k, p.a.ld, p.b.ld, p.c.ld, p.a.batch_stride, p.b.batch_stride, p.c.batch_stride,
                       p.a.transposed, p.b.transposed, align_a, align_b, align_c, align_bias,
                       static_cast<int64_t>(workspace_bytes)};
  cublasLtMatmulAlgo_t algo;
  bool found = false;
  {
    AlgoCache& cache = algo_cache();
    std::lock_guard lock(cache.mutex);
    auto it = cache.algos.find(key);
    if (it != cache.algos.end()) {
      algo = it->second;
      found = true;
    }
  }
  if (!found) {
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.preference));
    const uint64_t max_workspace = workspace_bytes;
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &max_workspace, sizeof(max_workspace)));
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                           &align_a, sizeof(align_a)));
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                           &align_b, sizeof(align_b)));
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                           &align_c, sizeof(align_c)));
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                           &align_c, sizeof(align_c)));
    if (element == 2) {
      // 16-bit outputs: split-K partial sums are reduced in float, never in the
      // output type (the in-place and output-type schemes round every partial
      // sum to 16 bits). With the bias epilogue no split-K at all: its
      // reduction adds the bias in the output type (PyTorch found the same,
      // pytorch/pytorch#180875). On the H200 a bf16 linear of 37 x 53 x 29 was
      // still up to 7 ulps off the once-rounded result with the float
      // reduction allowed (e30be42); without split-K the epilogue adds the
      // bias to the float accumulator and rounds once.
      const uint32_t schemes = with_bias ? CUBLASLT_REDUCTION_SCHEME_NONE : CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                             &schemes, sizeof(schemes)));
    }
    cublasLtMatmulHeuristicResult_t result = {};
    int returned = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt_handle(device), d.op, d.a, d.b, d.c, d.c,
                                                                 d.preference, 1, &result, &returned);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || (status == CUBLAS_STATUS_SUCCESS && returned == 0)) return false;
    KILN_CUBLAS_CHECK(status);
    algo = result.algo;
    AlgoCache& cache = algo_cache();
    std::lock_guard lock(cache.mutex);
    cache.algos.emplace(key, algo);
  }
  const float alpha = 1.0f;
  KILN_CUBLAS_CHECK(cublasLtMatmul(lt_handle(device), d.op, &alpha, p.b.data, d.a, p.a.data, d.b, &beta, p.c.data,
                                   d.c, p.c.data, d.c, &algo, workspace, workspace_bytes,
                                   static_cast<cudaStream_t>(stream)));
  return true;
}

// C[b] = a broadcast row (`row` of n elements, or one element when
// `row_stride` is 0) for every batch entry: a strided copy with 0 strides.
void broadcast_into_c(const GemmProblem& p, const void* row, int64_t row_stride, cuda::Stream stream) {
  IterShape shape;
  shape.ndim = 3;
  shape.sizes[0] = p.batch;
  shape.sizes[1] = p.m;
  shape.sizes[2] = p.n;
  Operand dst, src;
  dst.data = p.c.data;
  dst.dtype = src.dtype = p.dtype;
  dst.strides[0] = p.c.batch_stride;
  dst.strides[1] = p.c.ld;
  dst.strides[2] = 1;
  src.data = const_cast<void*>(row);
  src.strides[2] = row_stride;
  copy_cuda(shape, dst, src, stream);
}

void dgemm(const GemmProblem& p, double beta, void* workspace, size_t workspace_bytes, int device,
           cuda::Stream stream) {
  cublasHandle_t handle = blas_handle(device);
  KILN_CUBLAS_CHECK(cublasSetStream(handle, static_cast<cudaStream_t>(stream)));
  KILN_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace, workspace_bytes));
  const double alpha = 1.0;
  KILN_CUBLAS_CHECK(cublasDgemmStridedBatched_64(
      handle, p.b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, p.a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, p.n, p.m, p.k,
      &alpha, static_cast<const double*>(p.b.data), p.b.ld, p.b.batch_stride, static_cast<const double*>(p.a.data),
      p.a.ld, p.a.batch_stride, &beta, static_cast<double*>(p.c.data), p.c.ld, p.c.batch_stride, p.batch));
}

}  // namespace

size_t gemm_cuda_workspace_bytes(int device) {
  int major = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  // NVIDIA's recommendation for cuBLAS: 32 MiB on Hopper and later, 4 MiB before.
  return major >= 9 ? (size_t{32} << 20) : (size_t{4} << 20);
}

void gemm_cuda(const GemmProblem& p, bool allow_tf32, void* workspace, size_t workspace_bytes, int device,
               cuda::Stream stream) {
  KILN_ASSERT(p.m >= 0 && p.n >= 0 && p.k >= 0 && p.batch >= 0, "gemm_cuda: negative size");
  KILN_ASSERT(!p.c.transposed, "gemm_cuda: C must not be transposed");
  if (p.batch == 0 || p.m == 0 || p.n == 0) return;
  KILN_CHECK(p.batch <= INT32_MAX, "matmul on CUDA: batch ", p.batch, " exceeds cuBLASLt's limit of ", INT32_MAX);
  cuda::DeviceGuard guard(device, "cuBLAS");
  if (p.k == 0) {  // cuBLASLt rejects k = 0: C is the bias, or 0 (read from a zeroed workspace element)
    if (p.bias != nullptr) {
      broadcast_into_c(p, p.bias, 1, stream);
    } else {
      KILN_ASSERT(workspace_bytes >= dtype_size(p.dtype), "gemm_cuda: no workspace for k = 0");
      fill_cuda(workspace, p.dtype, 1, 0.0, stream);
      broadcast_into_c(p, workspace, 0, stream);
    }
    return;
  }
  if (p.dtype == DType::f64) {
    if (p.bias != nullptr) broadcast_into_c(p, p.bias, 1, stream);
    dgemm(p, p.bias != nullptr ? 1.0 : 0.0, workspace, workspace_bytes, device, stream);
    return;
  }
  if (p.bias != nullptr && lt_matmul(p, allow_tf32, true, 0.0f, workspace, workspace_bytes, device, stream)) return;
  if (p.bias != nullptr) broadcast_into_c(p, p.bias, 1, stream);
  KILN_CHECK(lt_matmul(p, allow_tf32, false, p.bias != nullptr ? 1.0f : 0.0f, workspace, workspace_bytes, device,
                       stream),
             "matmul on CUDA: cuBLASLt has no algorithm for ", dtype_name(p.dtype), " (batch ", p.batch, ", m ", p.m,
             ", n ", p.n, ", k ", p.k, ", lda ", p.a.ld, ", ldb ", p.b.ld, ", ldc ", p.c.ld, ")");
}

}  // namespace kiln::kernels
