// The hardware abstraction the executor runs on, in the style of IREE's HAL:
// a Device hands out an Allocator, Streams (in-order work queues), Events
// (timeline signals between streams), its kernel registry and Communicator.
// The CPU backend (runtime/hal/cpu) is the first implementation; a CUDA
// backend implements the same interfaces and the executor does not change.
#ifndef PIPER_RUNTIME_HAL_HAL_H
#define PIPER_RUNTIME_HAL_HAL_H

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/Communicator.h"
#include "runtime/kernels/Kernels.h"
#include "runtime/support/Status.h"

namespace piper::runtime::hal {

/// Device memory. Every tensor of an executor (persistent state, step
/// buffers, segment values) comes from here; kernels get its pointers.
/// Thread-safe.
class Allocator {
public:
  virtual ~Allocator() = default;
  /// `bytes` of device memory, 64-byte aligned, contents undefined; null
  /// when out of memory. Counted in liveBytes() until deallocate.
  virtual void *allocate(size_t bytes) = 0;
  /// Returns memory from allocate(ptr's `bytes`).
  virtual void deallocate(void *ptr, size_t bytes) = 0;
  /// Sets `bytes` at `ptr` to zero.
  virtual void zero(void *ptr, size_t bytes) = 0;
  /// Device-to-device copy.
  virtual void copy(void *dst, const void *src, size_t bytes) = 0;
  /// Copies between host memory and device memory (initialization,
  /// checkpoints, metrics).
  virtual void copyToHost(void *host, const void *src, size_t bytes) = 0;
  virtual void copyFromHost(void *dst, const void *host, size_t bytes) = 0;
  /// Bytes allocated and not yet deallocated, and their high-water mark.
  virtual int64_t liveBytes() const = 0;
  virtual int64_t peakBytes() const = 0;
};

/// A timeline signal between streams: its value only grows. A stream
/// signals value v (the executor uses the step number, so events need no
/// reset between steps); another waits until the value reaches v. Each
/// event has its own synchronization: no lock is shared between events.
class Event {
public:
  virtual ~Event() = default;
  /// Raises the value to `value` and wakes the waiters it satisfies.
  virtual void signal(uint64_t value) = 0;
  /// Blocks until the value is at least `value` (true) or `abort` is set and
  /// wake() was called after it (false).
  virtual bool wait(uint64_t value, const std::atomic<bool> &abort) = 0;
  /// Makes waiters re-check their abort flag.
  virtual void wake() = 0;
  virtual uint64_t value() const = 0;
};

/// An in-order queue of work, created once per logical stream of a plan and
/// kept for the executor's life (no thread is created per step).
class Stream {
public:
  virtual ~Stream() = default;
  virtual const std::string &name() const = 0;
  /// Enqueues `work` to run after everything enqueued before it; returns at
  /// once. `work` must not throw.
  virtual void enqueue(std::function<void()> work) = 0;
  /// Blocks until everything enqueued so far has run.
  virtual void synchronize() = 0;
};

/// One accelerator (or the host CPU) as seen by one rank.
class Device {
public:
  virtual ~Device() = default;
  /// E.g. "cpu".
  virtual std::string name() const = 0;
  virtual Allocator &allocator() = 0;
  /// A new stream. Streams of one device run concurrently; kernels on them
  /// share the device's compute threads.
  virtual std::unique_ptr<Stream> createStream(const std::string &name) = 0;
  virtual std::unique_ptr<Event> createEvent() = 0;
  /// The kernel of op `name` on this device, or null. Called when a plan
  /// loads, never per kernel call.
  virtual const KernelInfo *findKernel(const std::string &name) const = 0;
  /// Names of every kernel this device implements. The executor checks them
  /// against the kernel table (proto/KernelIds.h) when a plan loads: a
  /// backend must implement every kernel id and no other.
  virtual std::vector<std::string> kernelNames() const = 0;
  /// Runs a resolved kernel on the calling stream's context.
  virtual Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                           const std::vector<TensorRef> &inputs,
                           const std::vector<TensorRef> &outputs,
                           KernelContext &ctx) = 0;
  // The executor's own elementwise work on device memory, outside kernels.

  /// Sum of x[i]^2 in double, in a fixed order (the same for any thread
  /// count), for the global gradient norm.
  virtual double sumOfSquares(const float *x, int64_t n) = 0;
  /// x[i] *= scale (gradient clipping).
  virtual void scale(float *x, float scale, int64_t n) = 0;
  /// dst[i] += src[i] (a ZeRO shard's gradient accumulation).
  virtual void add(float *dst, const float *src, int64_t n) = 0;
  /// Mixed precision: float -> packed bf16 (round to nearest even), packed
  /// bf16 -> float, and rounding floats to bf16 values in place.
  virtual void packBf16(uint16_t *dst, const float *src, int64_t n) = 0;
  virtual void unpackBf16(float *dst, const uint16_t *src, int64_t n) = 0;
  virtual void roundBf16(float *x, int64_t n) = 0;

  /// The communicator of this rank; null for a single rank without one.
  virtual Communicator *communicator() = 0;

  /// The peak FLOP/s of this device at the plan's compute precision, for
  /// piper-run's MFU; 0 when unknown (the CPU backend: its peak depends on
  /// cores, clocks and what else runs).
  virtual double peakFlops() const { return 0; }
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_HAL_H
