// In-process tests of the executor on its device: gradients held per step,
// the gradient norm without clipping, kernels resolved at load, a HAL device
// plugged in through ExecutorOptions, streams running concurrently, and
// device errors failing a step instead of the process.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <unistd.h>

#include <catch2/catch.hpp>

#include "proto/PlanFile.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/Validate.h"
#include "runtime/exec/test_plans.h"
#include "runtime/hal/StagingCommunicator.h"
#include "runtime/hal/cpu/CpuDevice.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"

using namespace piper;
using namespace piper::runtime;
using namespace piper::runtime::testplans;
using plan::Instruction;
using plan::Operand;

namespace {

/// The losses of `steps` steps of `plan` on the CPU device.
std::vector<double> runSteps(const plan::Plan &plan, int steps, uint64_t seed) {
  ExecutorOptions opts;
  opts.seed = seed;
  Status status;
  auto exec = Executor::create(plan, opts, status);
  INFO(status.message());
  REQUIRE(exec);
  std::vector<double> losses;
  for (int t = 1; t <= steps; ++t) {
    double loss = 0;
    REQUIRE(exec->runStep(t, loss));
    losses.push_back(loss);
  }
  CHECK(exec->peakBytes() == exec->plan().arena_bytes());
  return losses;
}

} // namespace

namespace {
/// Runs `steps` steps of `plan` and returns lastGradNorm() after each.
std::vector<double> gradNorms(const plan::Plan &plan, int steps) {
  ExecutorOptions opts;
  opts.seed = 5;
  Status status;
  auto exec = Executor::create(plan, opts, status);
  INFO(status.message());
  REQUIRE(exec);
  CHECK(exec->lastGradNorm() == -1);
  std::vector<double> norms;
  for (int t = 1; t <= steps; ++t) {
    double loss = 0;
    REQUIRE(exec->runStep(t, loss));
    norms.push_back(exec->lastGradNorm());
  }
  return norms;
}
} // namespace

TEST_CASE("executor: the gradient norm is reported without clipping",
          "[executor]") {
  TinyModel m;
  plan::Plan noClip = singleClassPlan(m, 2, {0}, 1, true);
  // The same plan with a CLIP_GRADS that never clips, before the update.
  plan::Plan clip = noClip;
  clip.mutable_training()->set_clip_grad_norm(1e9);
  addClipBeforeUpdate(clip);
  REQUIRE(validatePlan(clip));

  std::vector<double> with = gradNorms(clip, 3), without = gradNorms(noClip, 3);
  REQUIRE(with.size() == without.size());
  for (size_t i = 0; i < with.size(); ++i) {
    CHECK(with[i] > 0);
    CHECK(without[i] == Approx(with[i]).epsilon(1e-12));
  }
}

TEST_CASE("executor: a non-finite gradient norm is a divergence, named with "
          "its step, and the diverged step updates nothing",
          "[executor]") {
  TinyModel m;
  // A learning rate that throws the weights to ~1e30: the logits overflow
  // and the next gradients are not finite.
  m.lr = 1e30;
  plan::Plan clip = singleClassPlan(m, 2, {0}, 1, true);
  clip.mutable_training()->set_clip_grad_norm(1.0);
  addClipBeforeUpdate(clip);
  REQUIRE(validatePlan(clip));
  // The CPU, and the GPU kernel layer on the host: the norm, the clip
  // factor and the skipped update all stay on the device.
  for (bool emulated : {false, true}) {
    INFO((emulated ? "cuda-emulation" : "cpu"));
    ExecutorOptions opts;
    if (emulated)
      opts.createDevice = [](Communicator *comm) {
        return hal::createEmulatedGpuDevice(comm);
      };
    Status status;
    auto exec = Executor::create(clip, opts, status);
    REQUIRE(exec);
    auto params = [&] {
      std::vector<std::vector<float>> all(clip.params_size());
      for (int p = 0; p < clip.params_size(); ++p)
        REQUIRE(exec->stateToHost(p, Operand::PARAM, all[p]));
      return all;
    };
    Status st;
    int64_t step = 1;
    std::vector<std::vector<float>> before;
    for (double loss = 0; step <= 5; ++step) {
      before = params();
      if (!(st = exec->runStep(step, loss)))
        break;
    }
    REQUIRE_FALSE(st);
    INFO(st.message());
    CHECK(step > 1);
    CHECK(st.isDiverged());
    CHECK(st.message().find("CLIP_GRADS") != std::string::npos);
    CHECK(st.message().find("non-finite gradient norm at step " +
                            std::to_string(step) + " (") != std::string::npos);
    CHECK_FALSE(std::isfinite(exec->lastGradNorm()));
    // The clip factor was NaN: the update left every weight (bit for bit)
    // as the step before left it.
    CHECK(params() == before);
  }
}

TEST_CASE("executor: on the emulated GPU a step synchronizes only at its end",
          "[executor]") {
  // What would make the host wait for a GPU in the middle of a step: a
  // batch copied from pageable memory, the clipped norm read back, a
  // stream synchronized. Two streams (LOAD_BATCH on its own), four
  // microbatches, with and without clipping: every step makes the same
  // synchronizing calls, those of its end alone (each stream's
  // synchronize, one read of the streams' losses and one of the gradient
  // norm), not two per batch.
  TinyModel m;
  for (bool clip : {false, true}) {
    INFO((clip ? "clipping" : "no clipping"));
    plan::Plan plan = singleClassPlan(m, 4, {0}, 1, /*twoStreams=*/true);
    if (clip) {
      plan.mutable_training()->set_clip_grad_norm(0.01);
      addClipBeforeUpdate(plan);
    }
    REQUIRE(validatePlan(plan));
    REQUIRE(plan.streams_size() == 2);
    ExecutorOptions opts;
    opts.createDevice = [](Communicator *comm) {
      return hal::createEmulatedGpuDevice(comm);
    };
    Status status;
    auto exec = Executor::create(plan, opts, status);
    INFO(status.message());
    REQUIRE(exec);
    for (int64_t step = 1; step <= 3; ++step) {
      int64_t before = hal::emulatedSyncCalls();
      double loss = 0;
      REQUIRE(exec->runStep(step, loss));
      INFO("step " << step);
      CHECK(hal::emulatedSyncCalls() - before == plan.streams_size() + 2);
      CHECK(exec->lastGradNorm() > 0);
    }
  }
}

TEST_CASE("executor: gradients without an optimizer are the last step's",
          "[executor]") {
  TinyModel m;
  m.normalHead = true;
  plan::Plan plan = singleClassPlan(m, 2, {0}, 1);
  // --no-optimizer: drop the update call, so nothing clears the gradients.
  auto *insts = plan.mutable_streams(0)->mutable_instructions();
  insts->RemoveLast();
  REQUIRE(validatePlan(plan));

  ExecutorOptions opts;
  opts.seed = 9;
  Status status;
  auto twoSteps = Executor::create(plan, opts, status);
  auto stepTwoOnly = Executor::create(plan, opts, status);
  REQUIRE(twoSteps);
  REQUIRE(stepTwoOnly);
  double loss = 0;
  REQUIRE(twoSteps->runStep(1, loss));
  REQUIRE(twoSteps->runStep(2, loss));
  REQUIRE(stepTwoOnly->runStep(2, loss));
  // The parameters never change, so step 2's gradients alone are those of a
  // fresh executor running step 2.
  for (int p = 0; p < plan.params_size(); ++p) {
    TensorRef a = twoSteps->state(p, Operand::GRAD);
    TensorRef b = stepTwoOnly->state(p, Operand::GRAD);
    CHECK(std::equal(a.f32(), a.f32() + a.numel(), b.f32()));
    CHECK(std::any_of(a.f32(), a.f32() + a.numel(),
                      [](float g) { return g != 0.0f; }));
  }
  CHECK(twoSteps->lastGradNorm() == Approx(stepTwoOnly->lastGradNorm()));
}

// The plan's events count steps (RECORD in step t signals t), so a step at
// or below one already run is refused before it starts, and the executor
// runs on.
TEST_CASE("executor: steps must increase", "[executor]") {
  TinyModel m;
  plan::Plan plan = singleClassPlan(m, 2, {0}, 1, /*twoStreams=*/true);
  ExecutorOptions opts;
  Status status;
  auto exec = Executor::create(plan, opts, status);
  REQUIRE(exec);
  double loss = 0;
  CHECK(exec->runStep(0, loss).message() ==
        "rank 0: cannot run step 0: steps are numbered from 1 and must "
        "increase");
  REQUIRE(exec->runStep(3, loss));
  for (int64_t step : {3, 1})
    CHECK(exec->runStep(step, loss).message() ==
          "rank 0: cannot run step " + std::to_string(step) +
              " after step 3: steps are numbered from 1 and must increase");
  CHECK(exec->runStep(4, loss));
}

TEST_CASE("executor: an unknown kernel is a load-time error naming it",
          "[executor]") {
  TinyModel m;
  plan::Plan plan = singleClassPlan(m, 1, {0}, 1);
  plan.mutable_segments(1)->mutable_kernels(2)->set_op("no_such_kernel");
  ExecutorOptions opts;
  Status status;
  auto exec = Executor::create(plan, opts, status);
  CHECK_FALSE(exec);
  INFO(status.message());
  CHECK(status.message().find("rank 0") != std::string::npos);
  CHECK(status.message().find("kernel 2 ('no_such_kernel')") !=
        std::string::npos);
  CHECK(status.message().find("unknown kernel 'no_such_kernel'") !=
        std::string::npos);
}

namespace {
/// A device that forwards everything to the CPU backend: the test devices
/// below override what they observe or change.
class ForwardingDevice : public hal::Device {
public:
  explicit ForwardingDevice(Communicator *comm)
      : cpu(hal::createCpuDevice(comm)) {}
  /// Forwarding to `inner` instead of a CPU device.
  explicit ForwardingDevice(std::unique_ptr<hal::Device> inner)
      : cpu(std::move(inner)) {}
  std::string name() const override { return "forwarding"; }
  hal::Allocator &allocator() override { return cpu->allocator(); }
  Status createStream(const std::string &name,
                      std::unique_ptr<hal::Stream> &stream) override {
    return cpu->createStream(name, stream);
  }
  Status createEvent(std::unique_ptr<hal::Event> &event) override {
    return cpu->createEvent(event);
  }
  const KernelInfo *findKernel(const std::string &name) const override {
    return cpu->findKernel(name);
  }
  std::vector<std::string> kernelNames() const override {
    return cpu->kernelNames();
  }
  Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                   const KernelAttrs &attrs,
                   const std::vector<TensorRef> &inputs,
                   const std::vector<TensorRef> &outputs,
                   KernelContext &ctx) override {
    return cpu->runKernel(info, kernel, attrs, inputs, outputs, ctx);
  }
  Status createSquareSums(int slots,
                          std::unique_ptr<hal::SquareSums> &sums) override {
    return cpu->createSquareSums(slots, sums);
  }
  Status createLossSums(int slots,
                        std::unique_ptr<hal::LossSums> &sums) override {
    return cpu->createLossSums(slots, sums);
  }
  Status add(float *dst, const float *src, int64_t n) override {
    return cpu->add(dst, src, n);
  }
  Status packBf16(uint16_t *dst, const float *src, int64_t n) override {
    return cpu->packBf16(dst, src, n);
  }
  Status unpackBf16(float *dst, const uint16_t *src, int64_t n) override {
    return cpu->unpackBf16(dst, src, n);
  }
  Status roundBf16(float *x, int64_t n) override {
    return cpu->roundBf16(x, n);
  }
  Communicator *communicator() override { return cpu->communicator(); }

protected:
  std::unique_ptr<hal::Device> cpu;
};

/// A device that forwards to the CPU backend and counts what the executor
/// asks of it: how another backend plugs in.
class CountingDevice : public ForwardingDevice {
public:
  using ForwardingDevice::ForwardingDevice;
  std::string name() const override { return "counting"; }
  Status createStream(const std::string &name,
                      std::unique_ptr<hal::Stream> &stream) override {
    ++streams;
    return cpu->createStream(name, stream);
  }
  Status createEvent(std::unique_ptr<hal::Event> &event) override {
    ++events;
    return cpu->createEvent(event);
  }
  const KernelInfo *findKernel(const std::string &name) const override {
    ++lookups;
    return cpu->findKernel(name);
  }
  Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                   const KernelAttrs &attrs,
                   const std::vector<TensorRef> &inputs,
                   const std::vector<TensorRef> &outputs,
                   KernelContext &ctx) override {
    ++kernelRuns;
    return cpu->runKernel(info, kernel, attrs, inputs, outputs, ctx);
  }

  static inline int streams = 0, events = 0, lookups = 0;
  static inline std::atomic<int> kernelRuns{0}; // from the stream workers
};
} // namespace

TEST_CASE("executor: a device plugs in through ExecutorOptions", "[executor]") {
  TinyModel m;
  plan::Plan plan = singleClassPlan(m, 2, {0}, 1, /*twoStreams=*/true);
  ExecutorOptions opts;
  opts.seed = 4;
  opts.createDevice = [](Communicator *comm) {
    return std::make_unique<CountingDevice>(comm);
  };
  Status status;
  auto exec = Executor::create(plan, opts, status);
  INFO(status.message());
  REQUIRE(exec);
  int kernelCount = 0;
  for (const plan::Segment &seg : plan.segments())
    kernelCount += seg.kernels_size();
  // Streams, events and kernels are resolved once, at load.
  CHECK(CountingDevice::streams == 2);
  CHECK(CountingDevice::events == plan.num_events());
  CHECK(CountingDevice::lookups == kernelCount);
  std::vector<double> losses;
  for (int t = 1; t <= 3; ++t) {
    double loss = 0;
    REQUIRE(exec->runStep(t, loss));
    losses.push_back(loss);
  }
  CHECK(CountingDevice::streams == 2);
  CHECK(CountingDevice::lookups == kernelCount);
  CHECK(CountingDevice::kernelRuns.load() > 0);
  CHECK(losses == runSteps(plan, 3, 4));
}

namespace {
/// A CPU device that records which kernels were prepared (Device::
/// prepareKernel) and run, and on which thread; it fails the preparation
/// of op `failOp`.
class PreparingDevice : public ForwardingDevice {
public:
  PreparingDevice(Communicator *comm, std::string failOp)
      : ForwardingDevice(comm), failOp(std::move(failOp)) {}
  std::string name() const override { return "preparing"; }
  Status prepareKernel(const KernelInfo &, const plan::Kernel &kernel,
                       const KernelAttrs &, const std::vector<TensorRef> &in,
                       const std::vector<TensorRef> &,
                       KernelContext &) override {
    std::lock_guard<std::mutex> lock(mu);
    prepared.push_back({std::this_thread::get_id(), &kernel});
    // Shapes, no data.
    for (const TensorRef &t : in)
      dataGiven |= t.data != nullptr;
    if (kernel.op() == failOp)
      return Status::error("cannot prepare " + kernel.op());
    return Status::ok();
  }
  Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                   const KernelAttrs &attrs,
                   const std::vector<TensorRef> &inputs,
                   const std::vector<TensorRef> &outputs,
                   KernelContext &ctx) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      ran.push_back({std::this_thread::get_id(), &kernel});
    }
    return cpu->runKernel(info, kernel, attrs, inputs, outputs, ctx);
  }

  using Call = std::pair<std::thread::id, const plan::Kernel *>;
  std::string failOp;
  std::mutex mu;
  std::vector<Call> prepared, ran;
  bool dataGiven = false;
};
} // namespace

TEST_CASE("executor: every kernel is prepared when the plan loads, on the "
          "stream that runs it",
          "[executor]") {
  TinyModel m;
  for (bool twoStreams : {false, true}) {
    INFO((twoStreams ? "two streams" : "one stream"));
    plan::Plan plan = singleClassPlan(m, 2, {0}, 1, twoStreams);
    PreparingDevice *device = nullptr;
    ExecutorOptions opts;
    opts.createDevice = [&](Communicator *comm) {
      auto d = std::make_unique<PreparingDevice>(comm, "");
      device = d.get();
      return d;
    };
    Status status;
    auto exec = Executor::create(plan, opts, status);
    INFO(status.message());
    REQUIRE(exec);
    REQUIRE(device);
    // Every kernel of every called segment, once (each segment is called
    // by one stream), off the loading thread.
    std::vector<PreparingDevice::Call> prepared = device->prepared;
    size_t kernelCount = 0;
    for (const plan::Segment &seg : plan.segments())
      kernelCount += static_cast<size_t>(seg.kernels_size());
    CHECK(prepared.size() == kernelCount);
    CHECK_FALSE(device->dataGiven);
    for (const auto &[thread, kernel] : prepared)
      CHECK(thread != std::this_thread::get_id());
    for (int t = 1; t <= 2; ++t) {
      double loss = 0;
      REQUIRE(exec->runStep(t, loss));
    }
    // Steps prepare nothing, and each kernel runs on the thread (the
    // stream's worker) that prepared it.
    CHECK(device->prepared.size() == kernelCount);
    std::sort(prepared.begin(), prepared.end());
    std::vector<PreparingDevice::Call> ran = device->ran;
    std::sort(ran.begin(), ran.end());
    ran.erase(std::unique(ran.begin(), ran.end()), ran.end());
    CHECK(ran == prepared);
  }
}

TEST_CASE("executor: a kernel the device cannot prepare fails the plan's "
          "loading, naming it",
          "[executor]") {
  TinyModel m;
  plan::Plan plan = singleClassPlan(m, 1, {0}, 1);
  int linearAt = -1, segment = -1;
  for (int g = 0; g < plan.segments_size() && linearAt < 0; ++g)
    for (int k = 0; k < plan.segments(g).kernels_size(); ++k)
      if (plan.segments(g).kernels(k).op() == "linear") {
        linearAt = k;
        segment = g;
        break;
      }
  REQUIRE(linearAt >= 0);
  ExecutorOptions opts;
  opts.createDevice = [](Communicator *comm) {
    return std::make_unique<PreparingDevice>(comm, "linear");
  };
  Status status;
  auto exec = Executor::create(plan, opts, status);
  CHECK_FALSE(exec);
  CHECK(status.message() == "rank 0: stream '" + plan.streams(0).name() +
                                "', segment '" + plan.segments(segment).name() +
                                "', kernel " + std::to_string(linearAt) +
                                ": preparing its calls: cannot prepare linear");
}

namespace {
/// A CPU device whose registry lacks the kernels `drop` and claims the
/// kernels `extra` (which it cannot run): a backend out of step with the
/// kernel table.
class MismatchedDevice : public CountingDevice {
public:
  MismatchedDevice(Communicator *comm, std::vector<std::string> drop,
                   std::vector<std::string> extra)
      : CountingDevice(comm), drop(std::move(drop)), extra(std::move(extra)) {}
  std::string name() const override { return "partial"; }
  const KernelInfo *findKernel(const std::string &name) const override {
    if (std::find(drop.begin(), drop.end(), name) != drop.end())
      return nullptr;
    return CountingDevice::findKernel(name);
  }
  std::vector<std::string> kernelNames() const override {
    std::vector<std::string> names;
    for (const std::string &name : CountingDevice::kernelNames())
      if (std::find(drop.begin(), drop.end(), name) == drop.end())
        names.push_back(name);
    names.insert(names.end(), extra.begin(), extra.end());
    return names;
  }

private:
  std::vector<std::string> drop, extra;
};

/// The load error of the tiny model's plan on a MismatchedDevice.
std::string loadOnMismatchedDevice(std::vector<std::string> drop,
                                   std::vector<std::string> extra) {
  TinyModel m;
  ExecutorOptions opts;
  opts.createDevice = [=](Communicator *comm) {
    return std::make_unique<MismatchedDevice>(comm, drop, extra);
  };
  Status status;
  auto exec = Executor::create(singleClassPlan(m, 1, {0}, 1), opts, status);
  CHECK_FALSE(exec);
  return status.message();
}
} // namespace

TEST_CASE("executor: a backend missing a kernel id fails to load, naming it",
          "[executor]") {
  // swiglu is not in the tiny model's plan: the whole table is required.
  CHECK(loadOnMismatchedDevice({"swiglu", "adamw"}, {}) ==
        "rank 0: backend 'partial': no kernel 'swiglu', 'adamw'");
  CHECK(loadOnMismatchedDevice({}, {"flash_attention"}) ==
        "rank 0: backend 'partial': kernel 'flash_attention' not in the "
        "kernel table (proto/KernelIds.cpp)");
}
namespace {
/// A CPU device whose kernels each wait until `parties` kernels are running
/// at once (or fail after a timeout): a plan only completes when its
/// streams really progress concurrently.
class RendezvousDevice : public ForwardingDevice {
public:
  RendezvousDevice(Communicator *comm, int parties)
      : ForwardingDevice(comm), parties(parties) {}
  std::string name() const override { return "rendezvous"; }
  Status runKernel(const KernelInfo &info, const plan::Kernel &kernel,
                   const KernelAttrs &attrs,
                   const std::vector<TensorRef> &inputs,
                   const std::vector<TensorRef> &outputs,
                   KernelContext &ctx) override {
    {
      std::unique_lock<std::mutex> lock(mu);
      ++arrived;
      cv.notify_all();
      if (!cv.wait_for(lock, std::chrono::seconds(10),
                       [&] { return arrived >= parties; }))
        return Status::error("the other stream never ran a kernel meanwhile");
    }
    return cpu->runKernel(info, kernel, attrs, inputs, outputs, ctx);
  }

private:
  int parties;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
};
} // namespace

TEST_CASE("executor: compute streams progress at the same time", "[executor]") {
  // Two streams, each calling a one-kernel segment; no event orders them.
  plan::Plan plan;
  plan.set_schema_version(plan::kPlanSchemaVersion);
  plan.add_ranks(0);
  plan.set_world_size(1);
  plan.mutable_training()->set_vocab_size(8);
  plan::Segment *seg =
      addSegment(plan, "zero", {tensorType(plan::F32, {16})}, {}, {});
  addKernel(seg, "zero", {}, {value(0)});
  for (const char *name : {"compute0", "compute1"}) {
    plan::Stream *stream = plan.add_streams();
    stream->set_name(name);
    addInst(stream, Instruction::CALL, std::string("zero on ") + name)
        ->set_segment(0);
  }
  withArena(plan);
  ExecutorOptions opts;
  opts.createDevice = [](Communicator *comm) {
    return std::make_unique<RendezvousDevice>(comm, 2);
  };
  Status status;
  auto exec = Executor::create(plan, opts, status);
  INFO(status.message());
  REQUIRE(exec);
  double loss = 0;
  Status step = exec->runStep(1, loss);
  INFO(step.message());
  CHECK(step);
}

namespace {
/// The CPU allocator, failing its host-to-device copies as a GPU's could
/// once `failCopyIn` is set, reporting `reportedFree` bytes free when set,
/// and counting its allocations in `*allocations` when set.
class FaultyAllocator final : public hal::Allocator {
public:
  explicit FaultyAllocator(hal::Allocator &inner) : inner(inner) {}
  Status allocate(size_t bytes, void *&ptr) override {
    if (allocations)
      ++*allocations;
    return inner.allocate(bytes, ptr);
  }
  void deallocate(void *ptr, size_t bytes) override {
    inner.deallocate(ptr, bytes);
  }
  Status zero(void *ptr, size_t bytes) override {
    return inner.zero(ptr, bytes);
  }
  Status copy(void *dst, const void *src, size_t bytes) override {
    return inner.copy(dst, src, bytes);
  }
  Status copyToHost(void *host, const void *src, size_t bytes) override {
    return inner.copyToHost(host, src, bytes);
  }
  Status copyFromHost(void *dst, const void *host, size_t bytes) override {
    if (failCopyIn)
      return Status::error("cudaMemcpyAsync: injected device error");
    return inner.copyFromHost(dst, host, bytes);
  }
  int64_t liveBytes() const override { return inner.liveBytes(); }
  int64_t peakBytes() const override { return inner.peakBytes(); }
  StatusOr<int64_t> availableBytes() const override {
    if (reportedFree >= 0)
      return reportedFree;
    return inner.availableBytes();
  }

  std::atomic<bool> failCopyIn{false};
  int64_t reportedFree = -1;
  std::atomic<int> *allocations = nullptr;

private:
  hal::Allocator &inner;
};

/// A CPU stream whose synchronize() reports an asynchronous device error
/// (a kernel that faulted after its launch returned) once `failSync` is set.
class FaultyStream final : public hal::Stream {
public:
  FaultyStream(std::unique_ptr<hal::Stream> inner,
               const std::atomic<bool> &failSync)
      : inner(std::move(inner)), failSync(failSync) {}
  const std::string &name() const override { return inner->name(); }
  void enqueue(std::function<void()> work) override {
    inner->enqueue(std::move(work));
  }
  Status synchronize() override {
    PIPER_RETURN_IF_ERROR(inner->synchronize());
    if (failSync)
      return Status::error("cudaStreamSynchronize: injected illegal address");
    return Status::ok();
  }

private:
  std::unique_ptr<hal::Stream> inner;
  const std::atomic<bool> &failSync;
};

/// CPU loss accumulators whose zeroing or reading fails once `failReset`
/// or `failRead` is set (a device copy's error).
class FaultyLossSums final : public hal::LossSums {
public:
  FaultyLossSums(std::unique_ptr<hal::LossSums> inner,
                 const std::atomic<bool> &failReset,
                 const std::atomic<bool> &failRead)
      : inner(std::move(inner)), failReset(failReset), failRead(failRead) {}
  double *slot(int i) override { return inner->slot(i); }
  Status reset() override {
    if (failReset)
      return Status::error("cudaMemsetAsync: injected device error");
    return inner->reset();
  }
  Status read(double *out) override {
    if (failRead)
      return Status::error("cudaMemcpyAsync: injected device error");
    return inner->read(out);
  }

private:
  std::unique_ptr<hal::LossSums> inner;
  const std::atomic<bool> &failReset, &failRead;
};

/// A CPU device whose memory, streams and loss accumulators fail as a GPU's
/// can.
class FaultyDevice : public ForwardingDevice {
public:
  using ForwardingDevice::ForwardingDevice;
  std::string name() const override { return "faulty"; }
  hal::Allocator &allocator() override { return memory; }
  Status createStream(const std::string &name,
                      std::unique_ptr<hal::Stream> &stream) override {
    std::unique_ptr<hal::Stream> inner;
    PIPER_RETURN_IF_ERROR(cpu->createStream(name, inner));
    stream = std::make_unique<FaultyStream>(std::move(inner), failSync);
    return Status::ok();
  }
  Status createLossSums(int slots,
                        std::unique_ptr<hal::LossSums> &sums) override {
    std::unique_ptr<hal::LossSums> inner;
    PIPER_RETURN_IF_ERROR(cpu->createLossSums(slots, inner));
    sums = std::make_unique<FaultyLossSums>(std::move(inner), failLossReset,
                                            failLossRead);
    return Status::ok();
  }

  FaultyAllocator memory{cpu->allocator()};
  std::atomic<bool> failSync{false}, failLossReset{false}, failLossRead{false};
};

/// An executor of the tiny model's one-stream plan on a FaultyDevice
/// (`device`), recording what its stream errors report.
struct FaultyRun {
  FaultyDevice *device = nullptr;
  std::vector<std::string> streamErrors;
  std::unique_ptr<Executor> exec;

  FaultyRun() {
    TinyModel m;
    ExecutorOptions opts;
    opts.seed = 3;
    opts.createDevice = [this](Communicator *comm) {
      auto created = std::make_unique<FaultyDevice>(comm);
      device = created.get();
      return created;
    };
    opts.onStreamError = [this](const Status &status) {
      streamErrors.push_back(status.message());
    };
    Status status;
    exec = Executor::create(singleClassPlan(m, 1, {0}, 1), opts, status);
    INFO(status.message());
    REQUIRE(exec);
    double loss = 0;
    REQUIRE(exec->runStep(1, loss));
  }
};
} // namespace

// A device error (on a GPU, a CUDA call's) is the failure of the stream that
// met it, with the rank, instruction and segment it happened in, and reaches
// the rank's error handler (piper-run's watchdog) like a kernel's error:
// the process does not end, and the executor refuses further steps.
TEST_CASE("executor: a device error fails the step, naming where",
          "[executor]") {
  FaultyRun run;
  // (The values of this plan's segments are all written whole by their
  // first kernels, so no step zeroes memory: the batch's copy fails.)
  run.device->memory.failCopyIn = true;
  double loss = 0;
  Status step = run.exec->runStep(2, loss);
  INFO(step.message());
  CHECK_FALSE(step);
  CHECK(step.message().rfind("rank 0, stream 'compute', instruction 0 (", 0) ==
        0);
  CHECK(step.message().find("cudaMemcpyAsync: injected device error") !=
        std::string::npos);
  REQUIRE(run.streamErrors.size() == 1);
  CHECK(run.streamErrors[0] == step.message());
  run.device->memory.failCopyIn = false;
  Status again = run.exec->runStep(3, loss);
  CHECK(again.message() ==
        "rank 0: the executor cannot run after a failed step");
}

// An asynchronous device error surfaces when the step synchronizes its
// streams: the stream's failure too.
TEST_CASE("executor: an asynchronous device error found at the end of a "
          "step fails it",
          "[executor]") {
  FaultyRun run;
  run.device->failSync = true;
  double loss = 0;
  Status step = run.exec->runStep(2, loss);
  INFO(step.message());
  CHECK_FALSE(step);
  CHECK(step.message() == "rank 0, stream 'compute', end of step: "
                          "cudaStreamSynchronize: injected illegal address");
  REQUIRE(run.streamErrors.size() == 1);
  CHECK(run.streamErrors[0] == step.message());
}

// The step's loss lives in device memory (hal::LossSums): a device error
// zeroing it before a step or reading it after one fails that step, named,
// and the executor refuses further steps.
TEST_CASE("executor: a device error on the loss accumulators fails the step",
          "[executor]") {
  for (bool reading : {false, true}) {
    INFO((reading ? "reading" : "zeroing"));
    FaultyRun run;
    (reading ? run.device->failLossRead : run.device->failLossReset) = true;
    double loss = 0;
    Status step = run.exec->runStep(2, loss);
    INFO(step.message());
    CHECK_FALSE(step);
    CHECK(step.message() ==
          (reading ? "rank 0: reading the loss of step 2: cudaMemcpyAsync: "
                     "injected device error"
                   : "rank 0: zeroing the loss accumulators before step 2: "
                     "cudaMemsetAsync: injected device error"));
    run.device->failLossRead = run.device->failLossReset = false;
    CHECK(run.exec->runStep(3, loss).message() ==
          "rank 0: the executor cannot run after a failed step");
  }
}

// "Will it fit?" at run time: a plan whose arena exceeds what the device
// reports free, or the --device-memory cap, is refused before the executor
// allocates anything; an arena of exactly the budget fits (the arena is the
// one allocation the plan's memory is, so the bound is exact).
TEST_CASE("executor: a plan larger than the device's free memory or the "
          "cap is refused before anything is allocated",
          "[executor]") {
  TinyModel m;
  const plan::Plan plan = singleClassPlan(m, 1, {0}, 1);
  const int64_t need = plan.arena_bytes();
  REQUIRE(need > 0);
  std::atomic<int> allocations{0};
  Status status;
  auto create = [&](int64_t reportedFree, int64_t cap) {
    allocations = 0;
    ExecutorOptions opts;
    opts.seed = 3;
    opts.deviceMemory = cap;
    opts.createDevice = [&](Communicator *comm) {
      auto device = std::make_unique<FaultyDevice>(comm);
      device->memory.reportedFree = reportedFree;
      device->memory.allocations = &allocations;
      return device;
    };
    return Executor::create(plan, opts, status);
  };
  const std::string refused =
      "rank 0: the plan does not fit this device's memory (";
  CHECK_FALSE(create(need - 1, -1));
  CHECK(status.message().rfind(refused + "free on the device), nothing was "
                                         "allocated: rank 0 (device class 0) "
                                         "needs ",
                               0) == 0);
  CHECK(status.message().find("the step peaks at stream 'compute'") !=
        std::string::npos);
  CHECK(allocations == 0);
  CHECK_FALSE(create(need * 100, need - 1));
  CHECK(status.message().rfind(refused + "--device-memory), nothing was "
                                         "allocated",
                               0) == 0);
  CHECK(allocations == 0);
  // The smaller budget is the one that counts.
  CHECK_FALSE(create(need - 1, need * 100));
  CHECK(status.message().rfind(refused + "free on the device)", 0) == 0);
  CHECK(create(need, need));
  CHECK(allocations > 0);
  // The host's own report (the CPU device's) and no cap: this plan fits.
  CHECK(create(-1, -1));
}

namespace {
/// A CPU event that counts its signals and waits.
class CountedEvent final : public hal::Event {
public:
  CountedEvent(std::unique_ptr<hal::Event> inner, std::atomic<int> &signals,
               std::atomic<int> &waits)
      : inner(std::move(inner)), signals(signals), waits(waits) {}
  Status signal(uint64_t value) override {
    ++signals;
    return inner->signal(value);
  }
  Status wait(uint64_t value, const std::atomic<bool> &abort) override {
    ++waits;
    return inner->wait(value, abort);
  }
  void wake() override { inner->wake(); }
  uint64_t value() const override { return inner->value(); }

private:
  std::unique_ptr<hal::Event> inner;
  std::atomic<int> &signals, &waits;
};

/// A CPU device whose events count their signals and waits.
class EventCountingDevice : public ForwardingDevice {
public:
  using ForwardingDevice::ForwardingDevice;
  Status createEvent(std::unique_ptr<hal::Event> &event) override {
    std::unique_ptr<hal::Event> inner;
    PIPER_RETURN_IF_ERROR(cpu->createEvent(inner));
    ++created;
    event = std::make_unique<CountedEvent>(std::move(inner), signals, waits);
    return Status::ok();
  }
  static inline std::atomic<int> created{0}, signals{0}, waits{0};
};
} // namespace

namespace {
/// An empty one-rank bf16 plan with one parameter, "w" [4, 4].
plan::Plan bf16PlanOfOneParam() {
  plan::Plan plan;
  plan.set_schema_version(plan::kPlanSchemaVersion);
  plan.add_ranks(0);
  plan.set_world_size(1);
  plan.mutable_training()->set_vocab_size(8);
  plan.mutable_training()->set_compute_dtype(plan::BF16);
  addParam(plan, "w", {4, 4}, true);
  return plan;
}
} // namespace

// gpu-review B.7: in mixed precision a parameter's bf16 copy is refreshed
// once per step by the first stream that reads it (on a GPU, queued on that
// stream). Another stream reading the same copy is ordered after the
// refresh by an event, as for any value another stream writes.
TEST_CASE("executor: bf16 parameter copies are ordered across streams by an "
          "event",
          "[executor]") {
  plan::Plan plan = bf16PlanOfOneParam();
  // Reads w twice (the second read finds the copy this stream has).
  plan::Segment *seg = addSegment(
      plan, "use w",
      {tensorType(plan::F32, {4, 4}), tensorType(plan::F32, {4, 4})}, {}, {});
  addKernel(seg, "add", {state(Operand::PARAM, 0), state(Operand::PARAM, 0)},
            {value(0)});
  addKernel(seg, "add", {value(0), state(Operand::PARAM, 0)}, {value(1)});
  for (const char *name : {"compute0", "compute1"}) {
    plan::Stream *stream = plan.add_streams();
    stream->set_name(name);
    addInst(stream, Instruction::CALL, std::string("use w on ") + name)
        ->set_segment(0);
  }
  withArena(plan);
  ExecutorOptions opts;
  opts.createDevice = [](Communicator *comm) {
    return std::make_unique<EventCountingDevice>(comm);
  };
  Status status;
  auto exec = Executor::create(plan, opts, status);
  INFO(status.message());
  REQUIRE(exec);
  CHECK(EventCountingDevice::created == 1); // the parameter's; no plan event
  for (int t = 1; t <= 3; ++t) {
    double loss = 0;
    Status step = exec->runStep(t, loss);
    INFO(step.message());
    REQUIRE(step);
    // One refresh (and signal) per step; the other stream waits for it.
    CHECK(EventCountingDevice::signals == t);
    CHECK(EventCountingDevice::waits == t);
  }
}

namespace {
/// A CPU device that counts the executor's bf16 rounding passes and says
/// that its `gelu` rounds its own outputs (when `claims`).
class RoundingDevice : public ForwardingDevice {
public:
  RoundingDevice(Communicator *comm, bool claims)
      : ForwardingDevice(comm), claims(claims) {}
  bool roundsOutputs(const KernelInfo &info) const override {
    return claims && std::string(info.name) == "gelu";
  }
  Status roundBf16(float *x, int64_t n) override {
    ++rounds;
    return cpu->roundBf16(x, n);
  }
  bool claims;
  std::atomic<int> rounds{0};
};
} // namespace

// In mixed precision the executor rounds a compute kernel's outputs to
// bf16 after it, unless the device says the kernel stores them rounded
// (Device::roundsOutputs: the GPU backends' elementwise kernels).
TEST_CASE("executor: a kernel that rounds its own outputs is not rounded "
          "again",
          "[executor]") {
  plan::Plan plan = bf16PlanOfOneParam();
  plan::Segment *seg = addSegment(
      plan, "gelu then add",
      {tensorType(plan::F32, {4, 4}), tensorType(plan::F32, {4, 4})}, {}, {});
  addKernel(seg, "gelu", {state(Operand::PARAM, 0)}, {value(0)});
  addKernel(seg, "add", {value(0), state(Operand::PARAM, 0)}, {value(1)});
  addInst(plan.add_streams(), Instruction::CALL, "call")->set_segment(0);
  plan.mutable_streams(0)->set_name("compute");
  withArena(plan);
  int rounds[2] = {0, 0};
  for (bool claims : {false, true}) {
    RoundingDevice *device = nullptr;
    ExecutorOptions opts;
    opts.createDevice = [&](Communicator *comm) {
      auto d = std::make_unique<RoundingDevice>(comm, claims);
      device = d.get();
      return d;
    };
    Status status;
    auto exec = Executor::create(plan, opts, status);
    INFO(status.message());
    REQUIRE(exec);
    int before = device->rounds.load();
    double loss = 0;
    REQUIRE(exec->runStep(1, loss));
    rounds[claims] = device->rounds.load() - before;
  }
  // add's output is rounded by the executor either way; gelu's only when
  // the device does not round it.
  CHECK(rounds[0] >= 2);
  CHECK(rounds[0] - rounds[1] == 1);
}

namespace {
/// The losses and final parameters of a training run.
struct Trained {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;
};

/// Trains `plan` for `steps` steps with `opts`; `started` runs once the
/// executor (and its device) exists, `finished` after the last step,
/// before they go (to read a counting device).
Trained trainPlan(const plan::Plan &plan, const ExecutorOptions &opts,
                  int steps, const std::function<void()> &started,
                  const std::function<void()> &finished) {
  Status status;
  auto exec = Executor::create(plan, opts, status);
  INFO(status.message());
  REQUIRE(exec);
  started();
  Trained run;
  for (int64_t t = 1; t <= steps; ++t) {
    double loss = 0;
    REQUIRE(exec->runStep(t, loss));
    run.losses.push_back(loss);
  }
  finished();
  run.params.resize(plan.params_size());
  for (int p = 0; p < plan.params_size(); ++p)
    REQUIRE(exec->stateToHost(p, Operand::PARAM, run.params[p]));
  return run;
}

/// A CPU device whose linear_grad_weight takes its x packed (as the GPU
/// backends' GEMMs do: Device::readsPackedInput; the CPU kernels unpack
/// it themselves), counting the executor's unpacking passes.
class PackedReadingDevice : public ForwardingDevice {
public:
  using ForwardingDevice::ForwardingDevice;
  bool readsPackedInput(const KernelInfo &info, int input) const override {
    return std::string(info.name) == "linear_grad_weight" && input == 0;
  }
  Status unpackBf16(float *dst, const uint16_t *src, int64_t n) override {
    ++unpacks;
    unpacked += n;
    return cpu->unpackBf16(dst, src, n);
  }
  std::atomic<int> unpacks{0};
  std::atomic<int64_t> unpacked{0};
};
} // namespace

// In mixed precision a step buffer is stored packed; an argument that every
// reader takes packed (Device::readsPackedInput) is passed as it is instead
// of being unpacked into its slot first (ExecutorOptions::packedStepBuffers;
// off: piper-run --unpack-step-buffers). The bigram plan's backward reads x
// (the embedding's output) only in linear_grad_weight, and its logits in
// cross_entropy_grad (fp32): x is no longer unpacked, the logits still
// are, and the losses and parameters are those of unpacking both, bit for
// bit; on a device declaring it and on the emulated GPU (its GEMMs).
TEST_CASE("executor: a packed step buffer that every reader takes packed is "
          "not unpacked, with the same bits",
          "[executor]") {
  TinyModel m;
  const int microbatches = 2, steps = 3;
  plan::Plan plan = singleClassPlan(m, microbatches, {0}, 1);
  plan.mutable_training()->set_compute_dtype(plan::BF16);
  withArena(plan);
  REQUIRE(validatePlan(plan));
  const int64_t rows = int64_t(m.batch) * m.seqLen;
  for (bool emulated : {false, true}) {
    INFO((emulated ? "cuda-emulation" : "packed-reading cpu"));
    Trained runs[2];
    int unpacks[2] = {0, 0};
    int64_t unpacked[2] = {0, 0};
    for (bool packed : {false, true}) {
      PackedReadingDevice *counting = nullptr;
      ExecutorOptions opts;
      opts.packedStepBuffers = packed;
      opts.createDevice =
          [&](Communicator *comm) -> std::unique_ptr<hal::Device> {
        if (emulated)
          return hal::createEmulatedGpuDevice(comm);
        auto d = std::make_unique<PackedReadingDevice>(comm);
        counting = d.get();
        return d;
      };
      auto counts = [&](int sign) {
        if (counting) {
          unpacks[packed] += sign * counting->unpacks.load();
          unpacked[packed] += sign * counting->unpacked.load();
        }
      };
      runs[packed] = trainPlan(
          plan, opts, steps, [&] { counts(-1); }, [&] { counts(1); });
    }
    CHECK(runs[1].losses == runs[0].losses);
    CHECK(runs[1].params == runs[0].params);
    if (!emulated) {
      // One unpacking pass of x [rows, hidden] less per microbatch.
      CHECK(unpacks[0] - unpacks[1] == steps * microbatches);
      CHECK(unpacked[0] - unpacked[1] ==
            int64_t(steps) * microbatches * rows * m.hidden);
    }
  }
}

namespace {
/// The emulated GPU, counting the executor's packing and unpacking passes.
class PackCountingGpu : public ForwardingDevice {
public:
  explicit PackCountingGpu(Communicator *comm)
      : ForwardingDevice(hal::createEmulatedGpuDevice(comm)) {}
  bool roundsOutputs(const KernelInfo &info) const override {
    return cpu->roundsOutputs(info);
  }
  bool readsPackedInput(const KernelInfo &info, int input) const override {
    return cpu->readsPackedInput(info, input);
  }
  bool writesPackedOutput(const KernelInfo &info, int output) const override {
    return cpu->writesPackedOutput(info, output);
  }
  Status packBf16(uint16_t *dst, const float *src, int64_t n) override {
    ++packs;
    return cpu->packBf16(dst, src, n);
  }
  Status unpackBf16(float *dst, const uint16_t *src, int64_t n) override {
    ++unpacks;
    return cpu->unpackBf16(dst, src, n);
  }
  Status roundBf16(float *x, int64_t n) override {
    ++rounds;
    return cpu->roundBf16(x, n);
  }
  std::atomic<int> packs{0}, unpacks{0}, rounds{0};
};

/// singleClassPlan with the fused classifier, as piperc emits it: the
/// forward's cross_entropy_fused computes the loss and dlogits, which go
/// to the backward (in the logits' buffer) instead of the logits, and the
/// backward's GEMMs read them there.
plan::Plan fusedClassifierPlan(const TinyModel &m, int microbatches) {
  plan::Plan plan = singleClassPlan(m, microbatches, {0}, 1);
  plan.mutable_training()->set_compute_dtype(plan::BF16);
  plan::Segment *fwd = plan.mutable_segments(0);
  plan::Segment *bwd = plan.mutable_segments(1);
  const plan::Kernel grad = bwd->kernels(0);
  REQUIRE(grad.op() == "cross_entropy_grad");
  // fwd: values 0 tokens, 1 targets, 2 x, 3 logits, 4 loss; + 5 dlogits.
  *fwd->add_values() = fwd->values(3);
  plan::Kernel *ce = fwd->mutable_kernels(2);
  REQUIRE(ce->op() == "cross_entropy");
  ce->set_op("cross_entropy_fused");
  *ce->add_outputs() = value(5);
  (*ce->mutable_attrs())["scale"] = grad.attrs().at("scale");
  fwd->set_results(1, 5);
  // bwd: its argument 3 is dlogits now; value 4 (its dlogits) goes unused.
  bwd->mutable_kernels()->DeleteSubrange(0, 1);
  for (plan::Kernel &k : *bwd->mutable_kernels())
    for (plan::Operand &o : *k.mutable_inputs())
      if (o.kind() == Operand::VALUE && o.index() == 4)
        o.set_index(3);
  withArena(plan);
  return plan;
}
} // namespace

// The fused classifier's dlogits: its kernel stores them straight into
// their packed step buffer (Device::writesPackedOutput: no fp32 value, no
// packing pass) and the backward's two GEMMs read them there
// (readsPackedInput: no unpacking), on the emulated GPU; the losses and
// parameters are those of the fp32 value packed and unpacked
// (ExecutorOptions::packedStepBuffers off), bit for bit.
// The plan file's memory plan gives every segment value its float32 bytes
// (the plan is device-agnostic). Where the device stores values packed, the
// executor lays the step out again (plan::relayoutStep): a value written
// straight into its step buffer or read from it as stored needs no
// scratch, one packed in its slot half of it; and the state region (the
// compute copies stored packed take their bf16 bytes: plan::layOutState).
// On the emulated GPU the bigram's segments then need less scratch, its
// state less room and the arena is smaller, its peak the new layout's,
// with the numbers of the file's layout (the unpacked run); the CPU device
// and --unpack-step-buffers keep the file's.
TEST_CASE("executor: where values are stored packed, the step's memory plan "
          "is laid out again, smaller",
          "[executor]") {
  TinyModel m;
  plan::Plan plan = singleClassPlan(m, 2, {0}, 1);
  plan.mutable_training()->set_compute_dtype(plan::BF16);
  withArena(plan);
  REQUIRE(validatePlan(plan));
  Trained runs[2][2]; // [emulated][packed]
  for (bool emulated : {false, true})
    for (bool packed : {false, true}) {
      INFO((emulated ? "cuda-emulation" : "cpu") << (packed ? ", packed" : ""));
      ExecutorOptions opts;
      opts.packedStepBuffers = packed;
      if (emulated)
        opts.createDevice = [](Communicator *comm) {
          return hal::createEmulatedGpuDevice(comm);
        };
      Status status;
      auto exec = Executor::create(plan, opts, status);
      INFO(status.message());
      REQUIRE(exec);
      const plan::Plan &ran = exec->plan();
      CHECK(exec->fileArenaBytes() == plan.arena_bytes());
      // The layout alone, without allocating (piper-plan --backend).
      plan::StorageBytes sizes;
      StatusOr<plan::Plan> laid = Executor::deviceLayout(plan, opts, sizes);
      REQUIRE(laid);
      // (Text: its maps in key order, unlike the wire format's.)
      CHECK(laid->DebugString() == ran.DebugString());
      std::string arenaError;
      CHECK(plan::checkArena(*laid, arenaError, &sizes.values, &sizes.copies));
      CHECK(arenaError == "");
      if (emulated && packed) {
        // The head's [8, 16] copy (only its GEMMs read it) in 256 bytes
        // instead of 512 (both multiples of the 64-byte alignment); the
        // table's stays fp32 (the embedding reads it so).
        CHECK(exec->packedCounts().paramCopies == 1);
        CHECK(ran.state_bytes() == plan.state_bytes() - 256);
        CHECK(ran.arena_bytes() < plan.arena_bytes());
        for (int g = 0; g < 2; ++g)
          CHECK(ran.segments(g).scratch_bytes() <
                plan.segments(g).scratch_bytes());
      } else {
        // The file's layout: arena, scratch, value and buffer offsets.
        auto layout = [](const plan::Plan &p) {
          std::vector<int64_t> out = {p.arena_bytes()};
          for (const plan::Segment &seg : p.segments()) {
            out.push_back(seg.scratch_bytes());
            out.insert(out.end(), seg.value_offsets().begin(),
                       seg.value_offsets().end());
          }
          for (const plan::Buffer &b : p.buffers())
            out.push_back(b.offset());
          for (const plan::Parameter &param : p.params())
            out.insert(out.end(), param.state_offsets().begin(),
                       param.state_offsets().end());
          return out;
        };
        CHECK(ran.state_bytes() == plan.state_bytes());
        CHECK(layout(ran) == layout(plan));
      }
      runs[emulated][packed] = trainPlan(
          plan, opts, 3, [] {}, [] {});
      double loss = 0;
      REQUIRE(exec->runStep(1, loss));
      CHECK(exec->peakBytes() == ran.arena_bytes());
    }
  CHECK(runs[1][1].losses == runs[1][0].losses);
  CHECK(runs[1][1].params == runs[1][0].params);
  // An invalid plan is refused as Executor::create refuses it.
  plan::Plan bad = plan;
  bad.mutable_segments(0)->mutable_kernels(0)->set_op("no_such_kernel");
  plan::StorageBytes sizes;
  StatusOr<plan::Plan> refused =
      Executor::deviceLayout(bad, ExecutorOptions{}, sizes);
  REQUIRE_FALSE(refused);
  CHECK_THAT(refused.status().message(),
             Catch::Contains("invalid plan for device class 0") &&
                 Catch::Contains("no_such_kernel"));
}

TEST_CASE("executor: the fused classifier's dlogits are written and read "
          "packed, with the same bits",
          "[executor]") {
  TinyModel m;
  const int microbatches = 2, steps = 3;
  plan::Plan plan = fusedClassifierPlan(m, microbatches);
  Status valid = validatePlan(plan);
  INFO(valid.message());
  REQUIRE(valid);
  Trained runs[2];
  int packs[2] = {0, 0}, unpacks[2] = {0, 0}, rounds[2] = {0, 0};
  for (bool packed : {false, true}) {
    PackCountingGpu *device = nullptr;
    ExecutorOptions opts;
    opts.packedStepBuffers = packed;
    opts.createDevice = [&](Communicator *comm) {
      auto d = std::make_unique<PackCountingGpu>(comm);
      device = d.get();
      return d;
    };
    auto counts = [&](int sign) {
      packs[packed] += sign * device->packs.load();
      unpacks[packed] += sign * device->unpacks.load();
      rounds[packed] += sign * device->rounds.load();
    };
    runs[packed] = trainPlan(
        plan, opts, steps, [&] { counts(-1); }, [&] { counts(1); });
  }
  CHECK(runs[1].losses == runs[0].losses);
  CHECK(runs[1].params == runs[0].params);
  // Per microbatch: dlogits neither packed nor unpacked, x neither
  // unpacked (only linear_grad_weight reads it) nor packed by a pass (its
  // writer, the embedding, stores it packed). And the head's weight, which
  // only GEMMs read, keeps its bf16 copy packed: refreshed at step 1 by one
  // packing pass instead of a rounding pass, then written packed by its
  // update.
  CHECK(packs[0] - packs[1] == 2 * steps * microbatches - 1);
  CHECK(rounds[0] - rounds[1] == 1);
  CHECK(unpacks[0] - unpacks[1] == 2 * steps * microbatches);
  CHECK(unpacks[1] == 0);
}

namespace {
/// The CPU backend claiming to capture steps: what the executor refuses
/// then is the communicator's.
class CapturingCpu : public ForwardingDevice {
public:
  using ForwardingDevice::ForwardingDevice;
  std::string name() const override { return "capturing"; }
  std::string stepCaptureRefusal() const override { return ""; }
};
} // namespace

// A step of several ranks is captured only with a communicator that queues
// its operations on the device streams (NCCL, the emulated GPU's model of
// it): with Gloo, or Gloo staged through the host (--comm gloo on CUDA),
// --step-graph on is refused when the executor is created, naming why.
TEST_CASE("executor: a plan of several ranks is captured only with a "
          "communicator ordered on the device",
          "[executor]") {
  TinyModel m;
  plan::Plan plan = singleClassPlan(m, 2, {0, 1}, 2, /*twoStreams=*/true);
  const char *base = std::getenv("TEST_TMPDIR");
  std::string store = std::string(base ? base : "/tmp") + "/capture-XXXXXX";
  REQUIRE(::mkdtemp(store.data()));
  Status made;
  auto gloo = createGlooCommunicator(0, 2, store,
                                     std::chrono::milliseconds(1000), made);
  INFO(made.message());
  REQUIRE(gloo);
  hal::StagingCommunicator staged(std::move(gloo));
  struct Case {
    Communicator *comm;
    std::string why;
  } cases[] = {
      {&staged.hostCommunicator(),
       "its operations run on the host as they are issued"},
      {&staged, "--comm gloo stages every operation through the host"},
  };
  for (const Case &c : cases) {
    INFO(c.why);
    ExecutorOptions opts;
    opts.comm = c.comm;
    opts.stepGraphs = ExecutorOptions::StepGraphs::On;
    opts.createDevice = [](Communicator *comm) {
      return std::make_unique<CapturingCpu>(comm);
    };
    Status status;
    auto exec = Executor::create(plan, opts, status);
    CHECK_FALSE(exec);
    CHECK(status.message() ==
          "rank 0: steps cannot run as graphs (--step-graph on): the plan has "
          "2 ranks and the communicator cannot be captured: " +
              c.why);
  }
}
