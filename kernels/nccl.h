// NCCL on raw device pointers (kernels/cuda/nccl.cpp; with CUDA off,
// kernels/cuda/stub_nccl.cpp throws kiln::Error). Communicators are made
// non-blocking so that initialization and every call can be bounded by a
// deadline and aborted from another thread; each call below waits for a
// call that NCCL reports "in progress" until it is issued, or throws after
// `timeout_ms`. The collectives are enqueued on `stream` and return at once.
// After a collective throws, the communicator is unusable and its owner must
// comm_abort it (once: abort frees it).
#pragma once

#include <cstddef>
#include <string>

#include "kernels/cuda/runtime.h"
#include "kernels/dtype.h"

namespace kiln::kernels::nccl {

struct UniqueId {
  char bytes[128];  // ncclUniqueId
};
using Comm = void*;  // ncclComm_t
enum class RedOp { sum, avg, max, min };

UniqueId get_unique_id();
// Collective over the `nranks` ranks that share `id`; the communicator uses
// `device`. Throws kiln::Error (after aborting) when it is not ready within timeout_ms.
Comm comm_init_rank(const UniqueId& id, int nranks, int rank, int device, int64_t timeout_ms);
// Frees the communicator; abort does not wait for pending work (a peer died).
void comm_destroy(Comm comm);
void comm_abort(Comm comm);
// Empty when fine; else NCCL's description of the asynchronous error.
std::string comm_async_error(Comm comm);

// `count` elements of `dtype`; send may equal recv (in place).
void all_reduce(const void* send, void* recv, size_t count, DType dtype, RedOp op, Comm comm,
                cuda::Stream stream, int64_t timeout_ms);
void broadcast(const void* send, void* recv, size_t count, DType dtype, int root, Comm comm,
               cuda::Stream stream, int64_t timeout_ms);
// recv holds nranks * send_count elements, rank-major.
void all_gather(const void* send, void* recv, size_t send_count, DType dtype, Comm comm, cuda::Stream stream,
                int64_t timeout_ms);
// send holds nranks * recv_count elements.
void reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype, RedOp op, Comm comm,
                    cuda::Stream stream, int64_t timeout_ms);

}  // namespace kiln::kernels::nccl
