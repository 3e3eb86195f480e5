#include "data/device_prefetcher.h"

namespace kiln {

namespace {

// Restores the device's current stream on scope exit.
class StreamGuard {
 public:
  StreamGuard(int device, cuda::Stream stream) : device_(device), previous_(cuda::current_stream(device)) {
    cuda::set_current_stream(device, stream);
  }
  ~StreamGuard() {
    try {
      cuda::set_current_stream(device_, previous_);
    } catch (...) {
    }
  }
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cuda::Stream previous_;
};

}  // namespace

DevicePrefetcher::DevicePrefetcher(DataLoader& loader, Device device) : loader_(loader), device_(device) {
  if (device.is_cpu()) return;
  KILN_CHECK(device.index < cuda::device_count(), "DevicePrefetcher: no device ", device, " (",
             cuda::device_count(), " available", cuda::compiled_with_cuda() ? "" : "; kiln was built without CUDA",
             ")");
  copy_stream_ = cuda::create_stream(device.index);
  order_event_ = cuda::create_event(device.index, /*timing=*/false);
}

DevicePrefetcher::~DevicePrefetcher() {
  if (device_.is_cpu()) return;
  try {
    cuda::stream_synchronize(copy_stream_);
    if (pending_) free_events_.push_back(pending_->copied);
    returned_.release_all();
    for (cuda::Event event : free_events_) cuda::destroy_event(event);
    cuda::destroy_event(order_event_);
    cuda::destroy_stream(copy_stream_);
  } catch (...) {
  }
}

cuda::Event DevicePrefetcher::take_event() {
  if (free_events_.empty()) return cuda::create_event(device_.index, /*timing=*/false);
  cuda::Event event = free_events_.back();
  free_events_.pop_back();
  return event;
}

void DevicePrefetcher::prefetch() {
  std::optional<Batch> host = loader_.next();
  if (!host) {
    pending_.reset();
    return;
  }
  const int index = device_.index;
  cuda::Stream compute = cuda::current_stream(index);
  InFlight entry;
  // Allocated for the compute stream, which uses them. A block freed earlier
  // may still be read by compute work already enqueued: the copy waits for it.
  entry.device.input = empty(host->input.shape(), {.dtype = host->input.dtype(), .device = device_});
  entry.device.target = empty(host->target.shape(), {.dtype = host->target.dtype(), .device = device_});
  cuda::record_event(order_event_, compute);
  cuda::stream_wait_event(copy_stream_, order_event_);
  try {
    {
      StreamGuard guard(index, copy_stream_);
      entry.device.input.copy_(host->input, /*non_blocking=*/true);
      entry.device.target.copy_(host->target, /*non_blocking=*/true);
    }
    entry.copied = take_event();
    cuda::record_event(entry.copied, copy_stream_);
  } catch (...) {
    // A copy may be queued: the pinned batch and the device blocks must outlive it
    // (the loader refills the one, the compute stream reuses the others).
    try {
      cuda::stream_synchronize(copy_stream_);
    } catch (...) {
    }
    throw;
  }
  entry.host = std::move(*host);
  pending_ = std::move(entry);
}

std::optional<Batch> DevicePrefetcher::next() {
  if (device_.is_cpu()) return loader_.next();
  if (deferred_error_) {
    // The loader failed while prefetching after the previous batch was handed out.
    std::exception_ptr error = deferred_error_;
    deferred_error_ = nullptr;
    std::rethrow_exception(error);
  }
  if (!started_) {
    prefetch();
    started_ = true;
  }
  if (!pending_) {
    started_ = false;  // end of epoch; the next call starts the loader's next epoch
    return std::nullopt;
  }
  InFlight current = std::move(*pending_);
  pending_.reset();
  cuda::stream_wait_event(cuda::current_stream(device_.index), current.copied);
  free_events_.push_back(current.copied);  // the wait above took the event as recorded: free to record again
  Batch batch = std::move(current.device);
  returned_.hold_until_done(std::move(current.host), device_.index, copy_stream_);
  try {
    prefetch();  // overlaps with the step the caller is about to run
  } catch (...) {
    // Deliver this batch now and the error on the next call.
    deferred_error_ = std::current_exception();
    pending_.reset();
    started_ = false;
  }
  return batch;
}

}  // namespace kiln
