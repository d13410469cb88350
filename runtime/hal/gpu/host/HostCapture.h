// The host emulation's model of CUDA stream capture (Device::
// beginStepCapture, docs/gpu.md "The step as one graph"): while a stream's
// worker thread captures, the device work it issues (kernel bodies,
// GEMMs, memsets and copies, the fused-attention model) is recorded, not
// run, with the arguments it was issued with, exactly what a CUDA graph
// keeps of a captured launch; the step's host code runs once, at capture.
// A replay runs the recorded work again, for a later step. So a per-step
// value that reaches the device as a launch argument instead of through a
// table the host rewrites before each replay shows on the emulation as a
// replayed step that differs from the step run eagerly.
#ifndef PIPER_RUNTIME_HAL_GPU_HOST_HOSTCAPTURE_H
#define PIPER_RUNTIME_HAL_GPU_HOST_HOSTCAPTURE_H

#include <atomic>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "runtime/hal/gpu/GpuApi.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

/// The device work one stream issued while it captured, in issue order,
/// and the host refills of the constant tables that work reads
/// (ConstantTables::keepForReplay).
struct HostRecording {
  std::vector<std::function<void()>> work;
  std::vector<ConstantRefill> refills;
  /// The capture this stream's recording belongs to (one per step
  /// captured, shared by its streams, numbered from 1 in the process), and
  /// the number of its latest launch (launches of every capture are
  /// numbered in one sequence): the replayed edges between streams (the
  /// emulated device's events) compare it.
  uint64_t capture = 0;
  const std::atomic<uint64_t> *launches = nullptr;
  /// Reports an error found while the recorded work runs (a replayed
  /// operation between ranks) to the stream's synchronization at the end of
  /// the step, as a CUDA stream reports a fault of its queued work.
  std::function<void(const Status &)> fail;
};

/// The recording of the calling thread's stream while it captures; null
/// otherwise (set and cleared on the stream's worker by the emulated
/// device).
inline thread_local HostRecording *currentRecording = nullptr;

/// Runs `f` now, or records it while the calling thread captures.
template <class F> void runOrRecord(F &&f) {
  if (HostRecording *r = currentRecording)
    r->work.emplace_back(std::forward<F>(f));
  else
    f();
}

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_HOST_HOSTCAPTURE_H
