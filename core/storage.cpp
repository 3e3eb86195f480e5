#include "core/storage.h"

#include <cstring>

#include "core/allocator.h"
#include "kernels/error.h"

namespace kiln {

Storage make_storage(size_t nbytes, Device device, bool pinned) {
  auto storage = std::make_shared<StorageImpl>();
  storage->nbytes = nbytes;
  storage->device = device;
  if (device.is_cuda()) {
    KILN_CHECK(!pinned, "make_storage: pinned memory is host memory, not ", device.str());
    storage->data = allocate_cuda(nbytes, device.index, cuda::current_stream(device.index));
  } else if (pinned) {
    storage->data = allocate_pinned(nbytes);
    storage->pinned = true;
  } else {
    storage->data = allocate_cpu(nbytes);
  }
  if (poison_allocations() && nbytes > 0) {
    if (device.is_cuda()) {
      cuda::memset_async(storage->data.get(), 0xFF, nbytes, cuda::current_stream(device.index));  // on the stream's device
    } else {
      std::memset(storage->data.get(), 0xFF, nbytes);
    }
  }
  return storage;
}

Storage storage_from_blob(void* data, size_t nbytes, Device device, std::function<void(void*)> deleter) {
  auto storage = std::make_shared<StorageImpl>();
  storage->nbytes = nbytes;
  storage->device = device;
  if (deleter) {
    storage->data = std::shared_ptr<void>(data, std::move(deleter));
  } else {
    storage->data = std::shared_ptr<void>(data, [](void*) {});
  }
  storage->pinned = device.is_cpu() && cuda::is_pinned(data);
  return storage;
}

}  // namespace kiln
