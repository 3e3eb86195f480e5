// A reference-counted block of memory on one device. Views share a Storage;
// its version counter is bumped by every in-place write so that autograd can
// detect that a tensor saved for backward was modified.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>

#include "core/device.h"

namespace kiln {

struct StorageImpl {
  std::shared_ptr<void> data;  // the deleter returns the memory to its allocator
  size_t nbytes = 0;
  Device device;
  bool pinned = false;  // page-locked host memory
  std::atomic<uint64_t> version{0};
};

using Storage = std::shared_ptr<StorageImpl>;

// New uninitialized storage of `nbytes` on `device` (pinned host memory when
// `pinned` and device is cpu). Throws OutOfMemoryError when none is left.
Storage make_storage(size_t nbytes, Device device, bool pinned = false);
// Storage over caller memory without copying; `deleter` runs when the last
// tensor referring to it is gone (none by default: the caller keeps ownership).
Storage storage_from_blob(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter = {});

}  // namespace kiln
