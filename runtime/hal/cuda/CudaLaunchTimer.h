// One CUDA stream's launch timer (piper-run --profile=gpu), internal to the
// CUDA backend: CudaApi.cpp gives each stream's kernel context one, and
// CudaLaunchTimers (CudaKernelContext.h, CudaLaunchTimers.cpp) reads them.
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDALAUNCHTIMER_H
#define PIPER_RUNTIME_HAL_CUDA_CUDALAUNCHTIMER_H

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "runtime/hal/cuda/CudaCheck.h"
#include "runtime/hal/gpu/GpuApi.h"

namespace piper::runtime::hal {

/// One stream's launch timer: a pooled pair of timing events around each
/// launch, read after the stream is synchronized.
class CudaLaunchTimer final : public gpu::LaunchTimer {
public:
  explicit CudaLaunchTimer(int ordinal) : ordinal(ordinal) {}
  ~CudaLaunchTimer() override {
    for (const Record &r : records) {
      pool.push_back(r.start);
      pool.push_back(r.end);
    }
    if (pending)
      pool.push_back(pending);
    for (cudaEvent_t e : pool)
      cudaEventDestroy(e);
  }
  Status begin(const gpu::Context &ctx) override {
    PIPER_RETURN_IF_ERROR(take(pending));
    PIPER_CUDA_RETURN_IF_ERROR(cudaEventRecord(pending, ctx.stream));
    return Status::ok();
  }
  Status end(const gpu::Context &ctx, const char *name) override {
    Record r{name, pending, nullptr};
    pending = nullptr;
    if (!r.start)
      return Status::error(std::string("launch timer: '") + name +
                           "' ended without a begin");
    Status st = take(r.end);
    if (st)
      st = [&]() -> Status {
        PIPER_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.end, ctx.stream));
        return Status::ok();
      }();
    records.push_back(r);
    return st;
  }

  struct Record {
    const char *name;
    cudaEvent_t start, end;
  };
  /// The launches recorded since the last call (their events go back to the
  /// pool after `use` has read them).
  template <class F> Status drain(F use) {
    Status st = Status::ok();
    for (const Record &r : records) {
      if (st)
        st = use(r);
      pool.push_back(r.start);
      if (r.end)
        pool.push_back(r.end);
    }
    records.clear();
    return st;
  }

private:
  Status take(cudaEvent_t &event) {
    if (!pool.empty()) {
      event = pool.back();
      pool.pop_back();
      return Status::ok();
    }
    PIPER_CUDA_RETURN_IF_ERROR(cudaSetDevice(ordinal));
    PIPER_CUDA_RETURN_IF_ERROR(cudaEventCreate(&event));
    return Status::ok();
  }

  int ordinal;
  cudaEvent_t pending = nullptr;
  std::vector<Record> records;
  std::vector<cudaEvent_t> pool;
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_CUDALAUNCHTIMER_H
