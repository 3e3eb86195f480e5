// NCCL calls on raw pointers (see kernels/nccl.h). Communicators are
// non-blocking (config.blocking = 0): NCCL may answer ncclInProgress, and the
// caller then polls ncclCommGetAsyncError until the call is issued; a
// deadline turns a peer that never arrives into a kiln::Error after an abort.
#include "kernels/nccl.h"

#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "kernels/cuda/check.h"

namespace kiln::kernels::nccl {

namespace {

ncclComm_t as_comm(Comm comm) { return static_cast<ncclComm_t>(comm); }

ncclDataType_t nccl_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    case DType::b8: return ncclUint8;
  }
  KILN_THROW("nccl: unsupported dtype ", dtype_name(dtype));
}

// bool: sum is a logical or (as Gloo's and torch's), so as bytes it is a max:
// a sum of bytes would give 2 for two trues, and 0 for 256.
ncclRedOp_t nccl_op(RedOp op, DType dtype) {
  switch (op) {
    case RedOp::sum: return dtype == DType::b8 ? ncclMax : ncclSum;
    case RedOp::avg: return ncclAvg;
    case RedOp::max: return ncclMax;
    case RedOp::min: return ncclMin;
  }
  KILN_THROW("nccl: unknown reduction");
}

int comm_device(ncclComm_t comm) {
  int device = 0;
  KILN_NCCL_CHECK(ncclCommCuDevice(comm, &device));
  return device;
}

// Polls until the communicator has no call in progress; throws on an error or
// after timeout_ms. The communicator is then unusable: its owner aborts it.
void wait_issued(ncclComm_t comm, const char* what, int64_t timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    KILN_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      const char* detail = ncclGetLastError(comm);
      KILN_THROW("NCCL ", what, " failed: ", ncclGetErrorString(state), (detail && *detail) ? ": " : "",
                 detail ? detail : "");
    }
    KILN_CHECK(std::chrono::steady_clock::now() <= deadline, "NCCL ", what, " timed out after ", timeout_ms,
               " ms (a peer did not arrive)");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void finish_call(ncclResult_t result, ncclComm_t comm, const char* what, int64_t timeout_ms) {
  if (result == ncclInProgress) {
    wait_issued(comm, what, timeout_ms);
    return;
  }
  KILN_NCCL_CHECK(result);
}

}  // namespace

UniqueId get_unique_id() {
  static_assert(sizeof(UniqueId) == sizeof(ncclUniqueId), "UniqueId must match ncclUniqueId");
  ncclUniqueId id;
  KILN_NCCL_CHECK(ncclGetUniqueId(&id));
  UniqueId out;
  std::memcpy(out.bytes, id.internal, sizeof(out.bytes));
  return out;
}

Comm comm_init_rank(const UniqueId& id, int nranks, int rank, int device, int64_t timeout_ms) {
  cuda::DeviceGuard guard(device, "nccl");
  ncclUniqueId nccl_id;
  std::memcpy(nccl_id.internal, id.bytes, sizeof(id.bytes));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t result = ncclCommInitRankConfig(&comm, nranks, nccl_id, rank, &config);
  // The caller gets no communicator from a failed initialization: it is aborted (freed) here.
  if (result != ncclSuccess && result != ncclInProgress && comm) ncclCommAbort(comm);
  KILN_NCCL_CHECK(result);
  try {
    wait_issued(comm, "communicator initialization", timeout_ms);
  } catch (...) {
    ncclCommAbort(comm);
    throw;
  }
  return comm;
}

void comm_destroy(Comm comm) {
  if (!comm) return;
  ncclComm_t c = as_comm(comm);
  // Finalize flushes issued work; in non-blocking mode it may be in progress.
  if (ncclCommFinalize(c) == ncclInProgress) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress && std::chrono::steady_clock::now() < deadline) {
      if (ncclCommGetAsyncError(c, &state) != ncclSuccess) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (state != ncclSuccess) {
      ncclCommAbort(c);
      return;
    }
  }
  ncclCommDestroy(c);
}

void comm_abort(Comm comm) {
  if (comm) ncclCommAbort(as_comm(comm));
}

std::string comm_async_error(Comm comm) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(as_comm(comm), &state);
  if (result != ncclSuccess) return ncclGetErrorString(result);
  if (state == ncclSuccess || state == ncclInProgress) return "";
  const char* detail = ncclGetLastError(as_comm(comm));
  return std::string(ncclGetErrorString(state)) + ((detail && *detail) ? std::string(": ") + detail : "");
}

void all_reduce(const void* send, void* recv, size_t count, DType dtype, RedOp op, Comm comm, cuda::Stream stream,
                int64_t timeout_ms) {
  ncclComm_t c = as_comm(comm);
  cuda::DeviceGuard guard(comm_device(c), "nccl");
  finish_call(ncclAllReduce(send, recv, count, nccl_dtype(dtype), nccl_op(op, dtype), c, static_cast<cudaStream_t>(stream)),
              c, "all_reduce", timeout_ms);
}

void broadcast(const void* send, void* recv, size_t count, DType dtype, int root, Comm comm, cuda::Stream stream,
               int64_t timeout_ms) {
  ncclComm_t c = as_comm(comm);
  cuda::DeviceGuard guard(comm_device(c), "nccl");
  finish_call(ncclBroadcast(send, recv, count, nccl_dtype(dtype), root, c, static_cast<cudaStream_t>(stream)), c,
              "broadcast", timeout_ms);
}

void all_gather(const void* send, void* recv, size_t send_count, DType dtype, Comm comm, cuda::Stream stream,
                int64_t timeout_ms) {
  ncclComm_t c = as_comm(comm);
  cuda::DeviceGuard guard(comm_device(c), "nccl");
  finish_call(ncclAllGather(send, recv, send_count, nccl_dtype(dtype), c, static_cast<cudaStream_t>(stream)), c,
              "all_gather", timeout_ms);
}

void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, RedOp op, Comm comm,
                    cuda::Stream stream, int64_t timeout_ms) {
  ncclComm_t c = as_comm(comm);
  cuda::DeviceGuard guard(comm_device(c), "nccl");
  finish_call(ncclReduceScatter(send, recv, recv_count, nccl_dtype(dtype), nccl_op(op, dtype), c,
                                static_cast<cudaStream_t>(stream)),
              c, "reduce_scatter", timeout_ms);
}

}  // namespace kiln::kernels::nccl
