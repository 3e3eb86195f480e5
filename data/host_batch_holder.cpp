#include "data/host_batch_holder.h"

#include "kernels/cuda/runtime.h"

namespace kiln {

namespace {
bool any_pinned(const Batch& batch) {
  return (batch.input.defined() && batch.input.is_pinned()) || (batch.target.defined() && batch.target.is_pinned());
}
}  // namespace

HostBatchHolder::~HostBatchHolder() {
  try {
    release_all();
    for (const auto& [device, event] : free_events_) cuda::destroy_event(event);
  } catch (...) {
  }
}

void HostBatchHolder::hold_until_done(Batch host, int device, cuda::Stream stream) {
  release_completed();
  if (!any_pinned(host)) return;  // pageable: its copies waited for themselves
  cuda::Event event = nullptr;
  for (size_t i = 0; i < free_events_.size(); ++i) {
    if (free_events_[i].first != device) continue;
    event = free_events_[i].second;
    free_events_.erase(free_events_.begin() + static_cast<std::ptrdiff_t>(i));
    break;
  }
  if (event == nullptr) event = cuda::create_event(device, /*timing=*/false);
  cuda::record_event(event, stream);
  held_.push_back({std::move(host), event, device});
}

void HostBatchHolder::release_completed() {
  while (!held_.empty() && cuda::event_query(held_.front().copied)) {
    free_events_.emplace_back(held_.front().device, held_.front().copied);
    held_.pop_front();  // the pinned buffers return to the loader's pool
  }
}

void HostBatchHolder::release_all() {
  while (!held_.empty()) {
    cuda::event_synchronize(held_.front().copied);
    free_events_.emplace_back(held_.front().device, held_.front().copied);
    held_.pop_front();
  }
}

}  // namespace kiln
