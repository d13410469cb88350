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
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/Communicator.h"
#include "runtime/hal/RowBlocks.h"
#include "runtime/kernels/ClipFactor.h" // SquareSums::clip's factor
#include "runtime/kernels/Kernels.h"
#include "support/Status.h"

namespace piper::runtime::hal {

/// Device memory. Every tensor of an executor (persistent state, step
/// buffers, segment values) comes from here; kernels get its pointers.
/// Thread-safe. Every method that can fail on a GPU returns a Status: a
/// device error (a CUDA call's, naming it) becomes the failure of the
/// calling stream, and so of the rank, instead of ending the process.
class Allocator {
public:
  virtual ~Allocator() = default;
  /// `bytes` of device memory in `ptr`, 64-byte aligned, contents
  /// undefined; an error (and null) when out of memory or when the device
  /// fails. Counted in liveBytes() until deallocate.
  virtual Status allocate(size_t bytes, void *&ptr) = 0;
  /// Returns memory from allocate(ptr's `bytes`). Never fails: a device
  /// error here (a sticky CUDA error some other call already reported) is
  /// dropped, so that tearing down after a failure cannot end the process.
  virtual void deallocate(void *ptr, size_t bytes) = 0;
  /// Sets `bytes` at `ptr` to zero.
  virtual Status zero(void *ptr, size_t bytes) = 0;
  /// Device-to-device copy.
  virtual Status copy(void *dst, const void *src, size_t bytes) = 0;
  /// Copies between host memory and device memory (initialization,
  /// checkpoints, metrics). The host memory is ready (or free to reuse)
  /// when they return ok.
  virtual Status copyToHost(void *host, const void *src, size_t bytes) = 0;
  virtual Status copyFromHost(void *dst, const void *host, size_t bytes) = 0;
  /// Host memory the device copies from without the host waiting (CUDA:
  /// page-locked, cudaHostAlloc), for copyFromHostAsync; `ptr` is null on
  /// error. The default is ordinary memory.
  virtual Status allocateHost(size_t bytes, void *&ptr) {
    ptr = std::malloc(bytes == 0 ? 1 : bytes);
    return ptr ? Status::ok()
               : Status::error("out of host memory: cannot allocate " +
                               std::to_string(bytes) + " bytes");
  }
  virtual void deallocateHost(void *ptr, size_t bytes) {
    (void)bytes;
    std::free(ptr);
  }
  /// Queues a copy from host memory (allocateHost's) to device memory on
  /// the calling stream and returns at once (batches: no synchronization
  /// in the middle of a step). `host` must not be written until the stream
  /// has run the copy (the executor rewrites it only after the step's
  /// end-of-step synchronization). The default copies at once.
  virtual Status copyFromHostAsync(void *dst, const void *host, size_t bytes) {
    return copyFromHost(dst, host, bytes);
  }
  /// Bytes allocated and not yet deallocated, and their high-water mark.
  virtual int64_t liveBytes() const = 0;
  virtual int64_t peakBytes() const = 0;
  /// The bytes the device can still hand out, as it reports them (CUDA:
  /// cudaMemGetInfo's free memory; the CPU: the host's MemAvailable), or an
  /// error when it cannot tell. The executor refuses a plan whose arena is
  /// larger before allocating anything.
  virtual StatusOr<int64_t> availableBytes() const {
    return Status::error("the device does not report its free memory");
  }
};

/// A timeline signal between streams: its value only grows. A stream
/// signals value v (the executor uses the step number, so events need no
/// reset between steps); another waits until the value reaches v. Each
/// event has its own synchronization: no lock is shared between events.
class Event {
public:
  virtual ~Event() = default;
  /// Raises the value to `value` and wakes the waiters it satisfies; an
  /// error when the device cannot record the signal on the calling stream.
  virtual Status signal(uint64_t value) = 0;
  /// Blocks until the value is at least `value` (ok), or `abort` is set and
  /// wake() was called after it (an error saying the wait was aborted); also
  /// an error when the device cannot order the calling stream after the
  /// signal.
  virtual Status wait(uint64_t value, const std::atomic<bool> &abort) = 0;
  /// Makes waiters re-check their abort flag.
  virtual void wake() = 0;
  virtual uint64_t value() const = 0;
};

/// The error of an Event::wait that its abort flag ended before the value
/// reached `value`.
inline Status abortedWait(uint64_t value) {
  return Status::error("aborted while waiting for the event to reach " +
                       std::to_string(value));
}

/// An in-order queue of work, created once per logical stream of a plan and
/// kept for the executor's life (no thread is created per step).
class Stream {
public:
  virtual ~Stream() = default;
  virtual const std::string &name() const = 0;
  /// Enqueues `work` to run after everything enqueued before it; returns at
  /// once. `work` must not throw.
  virtual void enqueue(std::function<void()> work) = 0;
  /// Blocks until everything enqueued so far has run, and its device work
  /// has finished: an asynchronous device error found here (a kernel that
  /// faulted after its launch returned) is returned, naming, where the
  /// backend knows it, the last kernel launched on this stream. While the
  /// stream captures (Device::beginStepCapture) it waits for the host work
  /// only: nothing captured runs.
  virtual Status synchronize() = 0;
};

/// What the host writes for a replayed step before its device work runs
/// (StepGraph::launch): the step's number and its schedule's lr scale, from
/// which AdamW's per-step constants follow.
struct StepValues {
  int64_t step = 0;
  double lrScale = 1;
};

/// One step's device work captured once (Device::beginStepCapture ...
/// endStepCapture) and run again for later steps: the same launches with
/// the same arguments on the same memory, without the host issuing them
/// (on CUDA a CUDA graph). Per-step values reach the launches only through
/// tables the host rewrites before each launch (gpu::ConstantTables).
class StepGraph {
public:
  virtual ~StepGraph() = default;
  /// Rewrites the captured work's per-step constants for `values`, then
  /// queues the work; returns at once. The synchronize() of the streams it
  /// was captured on waits for it. The streams must be idle.
  virtual Status launch(const StepValues &values) = 0;
};

/// A run of floats in device memory, and the slot of a SquareSums its sum
/// of squares goes to.
struct SquaresSpan {
  const float *data = nullptr;
  int64_t n = 0;
  int slot = 0;
};

/// Sums of squares of float spans (the global gradient norm), kept in
/// device memory until read: measuring costs no host synchronization, and
/// reading every slot is one device-to-host copy. Created once per executor
/// (Device::createSquareSums).
class SquareSums {
public:
  virtual ~SquareSums() = default;
  /// Queues on the calling stream, for each span, the sum of its x[i]^2 in
  /// double, in a fixed order (the same for any thread count), into its
  /// slot. Spans of different calls may be measured on different streams
  /// as long as their slots differ.
  virtual Status measure(const std::vector<SquaresSpan> &spans) = 0;
  /// Copies slots [0, count) to `out` (host memory) after the work queued
  /// on the calling stream: one device-to-host copy, complete on return.
  /// Slots measured on other streams must be complete by then (their
  /// streams synchronized, or ordered before by an event).
  virtual Status read(double *out, int count) = 0;

  // The clipped step's norm, kept on the device: no host read in the middle
  // of a step (issue 41). CLIP_GRADS measures every slot, weigh()s them into
  // the rank's share of the world's sum of squares, has the communicator
  // sum total() over the ranks in place (Communicator::
  // allReduceSumWorldOn), and clip() turns the sum into the norm and the
  // clip factor, which the update reads where it is (KernelContext::
  // clipFactor: `adamw` multiplies each gradient by it). The host reads
  // the norm once, after the step (readNorm).

  /// The weight of each slot in weigh(), copied to the device once; an
  /// error unless there is one per slot.
  virtual Status setWeights(const std::vector<double> &weights) = 0;
  /// Queues on the calling stream: *total() = the sum over the slots of
  /// weight[i] * slot[i], added in slot order in double (as the host loop
  /// `for i: t += slot[i] * weight[i]` adds them).
  virtual Status weigh() = 0;
  /// One double in device memory: weigh()'s result, summed over the ranks
  /// in place by the caller before clip().
  virtual double *total() = 0;
  /// Queues on the calling stream: norm = sqrt(*total() / replicas) and the
  /// clip factor, float(maxNorm / (norm + 1e-6)) where maxNorm > 0 and
  /// norm > maxNorm, 1 where not, and NaN where the norm is not finite (a
  /// diverged step: the update then leaves everything as it is).
  virtual Status clip(double replicas, double maxNorm) = 0;
  /// The factor clip() writes: one float in device memory.
  virtual const float *factor() const = 0;
  /// clip()'s norm, copied to the host after the calling stream's work
  /// (the end of the step: one device-to-host copy).
  virtual Status readNorm(double &norm) = 0;
};

/// The step's loss on the device: one double per plan stream, which that
/// stream's `loss_accumulate` calls add to (KernelContext::lossAccumulator)
/// as the stream reaches them, with no hand-off to the host per microbatch;
/// the executor reads every slot once, after the step (issue 41: what a
/// step captured as one CUDA graph needs). Created once per executor
/// (Device::createLossSums).
class LossSums {
public:
  virtual ~LossSums() = default;
  /// Slot `i` (0 <= i < slots): one double in device memory.
  virtual double *slot(int i) = 0;
  /// Sets every slot to zero; the device's streams must be idle (before a
  /// step). Complete on return.
  virtual Status reset() = 0;
  /// Copies every slot, in slot order, to `out` (host memory): one
  /// device-to-host copy, complete on return. The streams that wrote them
  /// must have been synchronized.
  virtual Status read(double *out) = 0;
};

/// An error unless every span's slot is one of `slots` and `read` asks for
/// at most `slots` (for the SquareSums implementations).
inline Status checkSquaresSlots(const std::vector<SquaresSpan> &spans, int read,
                                int slots) {
  for (const SquaresSpan &span : spans)
    if (span.slot < 0 || span.slot >= slots)
      return Status::error("sum of squares: slot " + std::to_string(span.slot) +
                           " is not one of the " + std::to_string(slots));
  if (read < 0 || read > slots)
    return Status::error("sum of squares: cannot read " + std::to_string(read) +
                         " of " + std::to_string(slots) + " slots");
  return Status::ok();
}

/// An error unless a LossSums is asked for at least one slot.
inline Status checkLossSlots(int slots) {
  if (slots >= 1)
    return Status::ok();
  return Status::error("loss accumulators: " + std::to_string(slots) +
                       " slots asked for; at least one is needed");
}

/// An error unless there are as many weights as slots (SquareSums::
/// setWeights, and weigh() before it).
inline Status checkSquaresWeights(size_t weights, int slots) {
  if (weights == static_cast<size_t>(slots))
    return Status::ok();
  return Status::error("sum of squares: " + std::to_string(weights) +
                       " weights for " + std::to_string(slots) + " slots");
}

/// How a device runs attention (piper-run --attention; docs/gpu.md): on
/// CUDA, `Auto` runs bf16 plans' attention on cuDNN's fused kernels where
/// cuDNN takes the shape (else on the SIMT kernels, saying so once),
/// `Cudnn` requires them, `Simt` never uses them. Other devices run their
/// own kernels whatever the choice (the launcher refuses `Cudnn` there).
enum class AttentionChoice { Auto, Cudnn, Simt };

/// The choices a rank's device is created with.
struct DeviceOptions {
  AttentionChoice attention = AttentionChoice::Auto;
  /// piper-run --profile=gpu: time every device launch (Device::
  /// collectLaunchTimes).
  bool timeLaunches = false;
};

/// The device time of one launch name (--profile=gpu): kernels, GEMMs,
/// cuDNN calls, summed over launches and streams.
struct LaunchTime {
  std::string name;
  int64_t count = 0;
  double seconds = 0;
};

/// What --profile=gpu measured since the last reset.
struct LaunchTimes {
  std::vector<LaunchTime> rows; ///< by decreasing time
  /// The union of the launches' intervals over every stream, per step
  /// summed: the time the device was busy with at least one launch.
  double busySeconds = 0;
};

/// One accelerator (or the host CPU) as seen by one rank.
class Device {
public:
  virtual ~Device() = default;
  /// E.g. "cpu".
  virtual std::string name() const = 0;
  virtual Allocator &allocator() = 0;
  /// A new stream in `stream`. Streams of one device run concurrently;
  /// kernels on them share the device's compute threads.
  virtual Status createStream(const std::string &name,
                              std::unique_ptr<Stream> &stream) = 0;
  virtual Status createEvent(std::unique_ptr<Event> &event) = 0;
  /// The kernel of op `name` on this device, or null. Called when a plan
  /// loads, never per kernel call.
  virtual const KernelInfo *findKernel(const std::string &name) const = 0;
  /// Names of every kernel this device implements. The executor checks them
  /// against the kernel table (proto/KernelIds.h) when a plan loads: a
  /// backend must implement every kernel id and no other.
  virtual std::vector<std::string> kernelNames() const = 0;
  /// Runs a resolved kernel on the calling stream's context; `attrs` is
  /// decodeKernelAttrs(kernel), made once when the plan loaded (kernels
  /// read their attributes from it, not from `kernel`).
  virtual Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                           const KernelAttrs &attrs,
                           const std::vector<TensorRef> &inputs,
                           const std::vector<TensorRef> &outputs,
                           KernelContext &ctx) = 0;
  /// Prepares what a kernel's calls need, once, when a plan loads: called
  /// by the stream that will run the kernel (its worker), for every kernel
  /// of the segments that stream calls, with the operands' shapes and no
  /// data, so that no step builds it. The CUDA backend builds cuDNN's
  /// attention plans and reserves the attention kernels' scratch here; an
  /// error (--attention cudnn where cuDNN refuses a shape) fails the
  /// plan's loading. The default prepares nothing.
  virtual Status prepareKernel(const KernelInfo &, const plan::Kernel &,
                               const KernelAttrs &,
                               const std::vector<TensorRef> &,
                               const std::vector<TensorRef> &,
                               KernelContext &) {
    return Status::ok();
  }
  /// Mixed precision: whether kernel `info`, run with KernelContext::
  /// lowPrecision, stores its fp32 outputs rounded to bf16 itself (the GPU
  /// backends' elementwise kernels: a pass over each output saved), so
  /// that the executor does not round them after it. The default: no.
  virtual bool roundsOutputs(const KernelInfo &) const { return false; }
  /// Mixed precision: whether kernel `info`, run with KernelContext::
  /// lowPrecision, takes its input `input` (an f32 tensor in the plan) as
  /// packed bf16 too, as a step buffer is stored: the executor then passes
  /// such a step buffer as it is (TensorRef::dtype BF16) instead of
  /// unpacking it to fp32 first, and the GPU backends' GEMMs read it
  /// without packing it again (the same values: the same bits). The
  /// default: no.
  virtual bool readsPackedInput(const KernelInfo &, int input) const {
    (void)input;
    return false;
  }
  /// Mixed precision: whether kernel `info`, run with KernelContext::
  /// lowPrecision, stores its output `output` (an f32 tensor in the plan,
  /// which it rounds to bf16 itself: roundsOutputs) packed bf16 when given
  /// a TensorRef of dtype BF16: the executor then gives it the packed step
  /// buffer of a segment result whose readers all take it packed, with no
  /// fp32 value and no packing pass after it (the same values: the same
  /// bits). The default: no.
  virtual bool writesPackedOutput(const KernelInfo &, int output) const {
    (void)output;
    return false;
  }
  /// Runs consecutive `adamw` calls (the optimizer step's), each as
  /// runKernel would with `ctx` and the call's own bf16 copy; a backend may
  /// fuse them into fewer launches giving the same bits (the GPU backends:
  /// one per 32 parameters). On an error `failed` is the index of the call
  /// it belongs to. The default runs them one by one.
  virtual Status runAdamwCalls(const KernelInfo &info,
                               const std::vector<AdamwCall> &calls,
                               KernelContext &ctx, size_t &failed) {
    for (failed = 0; failed < calls.size(); ++failed) {
      const AdamwCall &c = calls[failed];
      ctx.bf16Copy = c.bf16Copy;
      ctx.bf16PackedCopy = c.bf16PackedCopy;
      PIPER_RETURN_IF_ERROR(
          runKernel(info, *c.kernel, *c.attrs, c.inputs, c.outputs, ctx));
    }
    return Status::ok();
  }
  // The executor's own elementwise work on device memory, outside kernels.
  // Queued on the calling stream like a kernel; an error names the device
  // call that failed.

  /// `slots` slots of sums of squares, for the global gradient norm.
  virtual Status createSquareSums(int slots,
                                  std::unique_ptr<SquareSums> &sums) = 0;
  /// `slots` (at least 1) loss accumulators, zero.
  virtual Status createLossSums(int slots, std::unique_ptr<LossSums> &sums) = 0;
  /// dst[i] += src[i] (a ZeRO shard's gradient accumulation).
  virtual Status add(float *dst, const float *src, int64_t n) = 0;
  /// Mixed precision: float -> packed bf16 (round to nearest even), packed
  /// bf16 -> float, and rounding floats to bf16 values in place.
  virtual Status packBf16(uint16_t *dst, const float *src, int64_t n) = 0;
  virtual Status unpackBf16(float *dst, const uint16_t *src, int64_t n) = 0;
  virtual Status roundBf16(float *x, int64_t n) = 0;

  /// The communicator of this rank; null for a single rank without one.
  virtual Communicator *communicator() = 0;

  /// A captured step's all-to-all (docs/runtime.md, "Steps as graphs")
  /// sends each member a block of RowBlocks::blockRows rows whatever the
  /// counts, so that the exchange is the same every step: packRowBlocks
  /// copies the rows of `input` (RowBlocks::rows of rowBytes) that `counts`
  /// (device memory, one i32 per member) gives each member, in order, to
  /// the member's block of `blocks` (members x blockRows rows) and writes
  /// what is sent as the counts to `sent`: the counts, or -1 for every
  /// member where one is negative or above blockRows (RowBlockFault::
  /// kCount, RowBlocks.h) or they sum past the input's rows (kInput), which is
  /// then recorded in `*fault` (device memory) unless it holds one already, and
  /// nothing is copied. unpackRowBlocks copies the first received[j] rows
  /// of member j's block of `blocks` to `output` (RowBlocks::rows rows), in
  /// order, and zeroes the rest; where a received count is -1 (kPeer: the
  /// member's own fault), above blockRows (kCount) or they sum past the
  /// output's rows (kOutput), the output is all zeros and the fault is
  /// recorded. Both are queued on the calling stream; nothing waits.
  /// Devices that do not capture steps do not have them.
  virtual Status packRowBlocks(const RowBlocks &shape, const void *input,
                               const int32_t *counts, void *blocks,
                               int32_t *sent, int32_t *fault) {
    (void)shape, (void)input, (void)counts, (void)blocks, (void)sent,
        (void)fault;
    return Status::error(stepCaptureRefusal());
  }
  virtual Status unpackRowBlocks(const RowBlocks &shape, const void *blocks,
                                 const int32_t *received, void *output,
                                 int32_t *fault) {
    (void)shape, (void)blocks, (void)received, (void)output, (void)fault;
    return Status::error(stepCaptureRefusal());
  }

  /// Whether this device captures steps (StepGraph): "" where it does,
  /// else why not.
  virtual std::string stepCaptureRefusal() const {
    return "the " + name() + " backend does not capture steps";
  }
  /// Starts capturing the device work that `streams` (this device's, idle,
  /// the first the capture's origin) issue from the work enqueued on them
  /// from now on: it is kept, not run, until endStepCapture. Host code runs
  /// as usual; a call that waits for the device (a synchronizing copy) is
  /// an error, at the call or at endStepCapture.
  virtual Status beginStepCapture(const std::vector<Stream *> &streams) {
    (void)streams;
    return Status::error(stepCaptureRefusal());
  }
  /// Ends the capture once the work enqueued on its streams has run on the
  /// host (Stream::synchronize), into `graph`, of which nothing has run yet.
  /// On an error (a call the capture could not keep) `graph` is null and
  /// the streams are back to running their work.
  virtual Status endStepCapture(std::unique_ptr<StepGraph> &graph) {
    graph = nullptr;
    return Status::error(stepCaptureRefusal());
  }

  /// The peak FLOP/s of this device at the plan's compute precision, for
  /// piper-run's MFU; 0 when unknown (the CPU backend: its peak depends on
  /// cores, clocks and what else runs).
  virtual double peakFlops() const { return 0; }

  /// With DeviceOptions::timeLaunches: adds the launches timed since the
  /// last call to the totals (called after the step's streams are
  /// synchronized, so every launch has finished). Devices that do not time
  /// launches (the CPU) have none.
  virtual Status collectLaunchTimes() { return Status::ok(); }
  virtual LaunchTimes launchTimes() const { return {}; }
  virtual void resetLaunchTimes() {}
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_HAL_H
