// Host batches whose asynchronous copies to a GPU may not have run yet.
//
// A non_blocking copy from pinned memory returns before the GPU reads the
// bytes, and the host can run several steps ahead of the GPU (kiln's step
// never waits for it). The DataLoader's pinned buffers go back to its pool
// when a batch's tensors die, and its workers refill them at once: without a
// hold, a copy still queued behind the previous step would read the next
// batches' examples (torch's CachingHostAllocator records an event for the
// same reason). Each batch is held until an event recorded after its copies
// has completed; batches in pageable memory need no hold (their copies wait).
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

#include "data/dataset.h"
#include "kernels/cuda/runtime.h"

namespace kiln {

class HostBatchHolder {
 public:
  HostBatchHolder() = default;
  ~HostBatchHolder();  // waits for the held copies
  HostBatchHolder(const HostBatchHolder&) = delete;
  HostBatchHolder& operator=(const HostBatchHolder&) = delete;

  // Holds `host` until the work enqueued so far on `stream` (its copies
  // included) has run; a batch with no pinned tensor is dropped at once.
  // Drops the held batches whose copies have run first.
  void hold_until_done(Batch host, int device, cuda::Stream stream);
  // Drops the held batches whose copies have run, oldest first.
  void release_completed();
  // Waits for every held copy and drops the batches.
  void release_all();
  size_t held() const { return held_.size(); }

 private:
  struct Held {
    Batch host;
    cuda::Event copied;
    int device;
  };
  std::deque<Held> held_;
  std::vector<std::pair<int, cuda::Event>> free_events_;  // (device, event), for reuse
};

}  // namespace kiln
