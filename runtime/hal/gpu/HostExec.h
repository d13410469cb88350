// The host emulation's way of running a kernel body (see Simt.h): every
// index, or every row with one lane, in order on the calling thread.
// Included by the *Host.cpp files that instantiate the launchers (*.inl)
// for the emulation; the CUDA twin is CudaExec.cuh.
#ifndef PIPER_RUNTIME_HAL_GPU_HOSTEXEC_H
#define PIPER_RUNTIME_HAL_GPU_HOSTEXEC_H

#include <cstdint>

#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/Simt.h"
#include "runtime/hal/gpu/host/HostCapture.h"

#ifdef PIPER_GPU_LANES32
// The kernel layer's 32-lane test build (host/LanesExec.h).
#include "runtime/hal/gpu/host/LanesExec.h"
namespace piper::runtime::hal::PIPER_GPU_NS {
using HostExec = LanesExec;
} // namespace piper::runtime::hal::PIPER_GPU_NS
#else
namespace piper::runtime::hal::PIPER_GPU_NS {

class HostExec {
public:
  using Lanes = HostLanes;
  explicit HostExec(const Context &ctx) : ctx(ctx) {}
  /// f(i) for i in [0, n) (recorded while the thread captures a step,
  /// host/HostCapture.h: f holds its arguments by value, as a launch).
  template <class F> Status forEach(const char *name, int64_t n, F f) const {
    if (n <= 0)
      return Status::ok();
    if (ctx.timer)
      PIPER_RETURN_IF_ERROR(ctx.timer->begin(ctx));
    runOrRecord([f, n] {
      for (int64_t i = 0; i < n; ++i)
        f(i);
    });
    return ctx.timer ? ctx.timer->end(ctx, name) : Status::ok();
  }
  /// f(lanes, r) for every row r in [0, rows).
  template <class F>
  Status forEachRow(const char *name, int64_t rows, F f) const {
    if (rows <= 0)
      return Status::ok();
    if (ctx.timer)
      PIPER_RETURN_IF_ERROR(ctx.timer->begin(ctx));
    runOrRecord([f, rows] {
      for (int64_t r = 0; r < rows; ++r)
        f(Lanes{}, r);
    });
    return ctx.timer ? ctx.timer->end(ctx, name) : Status::ok();
  }
  const Context &context() const { return ctx; }

private:
  const Context &ctx;
};

} // namespace piper::runtime::hal::PIPER_GPU_NS
#endif

#endif // PIPER_RUNTIME_HAL_GPU_HOSTEXEC_H
