// The launch timers of one CUDA device's streams (CudaKernelContext.h):
// their CUDA events read after the streams are synchronized.
#include <algorithm>
#include <mutex>

#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/cuda/CudaKernelContext.h"
#include "runtime/hal/cuda/CudaLaunchTimer.h"

namespace piper::runtime::hal {

void CudaLaunchTimers::add(CudaLaunchTimer *timer) {
  std::lock_guard<std::mutex> lock(mu);
  timers.push_back(timer);
}

void CudaLaunchTimers::remove(CudaLaunchTimer *timer) {
  std::lock_guard<std::mutex> lock(mu);
  timers.erase(std::remove(timers.begin(), timers.end(), timer), timers.end());
}

Status CudaLaunchTimers::collect() {
  std::lock_guard<std::mutex> lock(mu);
  // Every launch's interval in ms from one reference event (the first
  // launch's start), so that the union over the streams can be taken.
  cudaEvent_t reference = nullptr;
  Status st = Status::ok();
  for (CudaLaunchTimer *timer : timers) {
    Status drained =
        timer->drain([&](const CudaLaunchTimer::Record &r) -> Status {
          if (!r.end)
            return Status::ok();
          if (!reference)
            reference = r.start;
          float from = 0, to = 0;
          PIPER_CUDA_RETURN_IF_ERROR(
              cudaEventElapsedTime(&from, reference, r.start));
          PIPER_CUDA_RETURN_IF_ERROR(
              cudaEventElapsedTime(&to, reference, r.end));
          totals.add(r.name, from, to);
          return Status::ok();
        });
    if (st)
      st = drained;
  }
  totals.endBatch();
  return st;
}

LaunchTimes CudaLaunchTimers::times() const {
  std::lock_guard<std::mutex> lock(mu);
  return totals.times();
}

void CudaLaunchTimers::reset() {
  std::lock_guard<std::mutex> lock(mu);
  totals.reset();
}

} // namespace piper::runtime::hal
