// Copies the DataLoader's next batch to the GPU on a stream of its own while
// the current step computes. The host never waits: the compute stream waits
// on the copy's event (cudaStreamWaitEvent), and host buffers go back to the
// loader only once an event query shows their copy done. For the copies to be
// asynchronous the loader must use pin_memory = true (pageable batches work,
// but each copy then synchronizes).
#pragma once

#include <exception>
#include <optional>
#include <vector>

#include "data/dataloader.h"
#include "data/host_batch_holder.h"

namespace kiln {

class DevicePrefetcher {
 public:
  // `loader` must outlive the prefetcher. With a cpu device, next() passes
  // the loader's batches through. Throws kiln::Error for an unavailable device.
  DevicePrefetcher(DataLoader& loader, Device device);
  ~DevicePrefetcher();  // waits for its own copies (their host buffers must outlive them)
  DevicePrefetcher(const DevicePrefetcher&) = delete;
  DevicePrefetcher& operator=(const DevicePrefetcher&) = delete;

  // The next batch on the device, ordered before any work later enqueued on
  // the device's current stream; nullopt at the end of the loader's epoch
  // (the next call starts the next epoch). Starts the following batch's copy
  // before returning. Rethrows the loader's errors.
  std::optional<Batch> next();

  Device device() const { return device_; }

 private:
  struct InFlight {
    Batch host;
    Batch device;
    cuda::Event copied = nullptr;
  };
  void prefetch();
  cuda::Event take_event();

  DataLoader& loader_;
  Device device_;
  cuda::Stream copy_stream_ = nullptr;
  cuda::Event order_event_ = nullptr;
  bool started_ = false;
  std::exception_ptr deferred_error_;
  std::optional<InFlight> pending_;
  HostBatchHolder returned_;  // handed out: their host buffers held until their copies complete
  std::vector<cuda::Event> free_events_;
};

}  // namespace kiln
