// Unit tests of the CPU HAL backend: stream order and persistence, events
// between streams (and their abort), allocator accounting and reuse, and
// the kernel registry.
#include "runtime/hal/cpu/CpuDevice.h"

#include "proto/KernelIds.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

using namespace piper;

using namespace piper::runtime;
using namespace piper::runtime::hal;

namespace {

std::unique_ptr<Stream> newStream(Device &device, const std::string &name) {
  std::unique_ptr<Stream> stream;
  REQUIRE(device.createStream(name, stream));
  return stream;
}

std::unique_ptr<Event> newEvent(Device &device) {
  std::unique_ptr<Event> event;
  REQUIRE(device.createEvent(event));
  return event;
}

} // namespace

TEST_CASE("a stream runs its work in order on one persistent thread", "[hal]") {
  auto device = createCpuDevice(nullptr);
  auto stream = newStream(*device, "compute");
  CHECK(stream->name() == "compute");
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 100; ++i)
    stream->enqueue([&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    });
  REQUIRE(stream->synchronize());
  REQUIRE(order.size() == 100);
  for (int i = 0; i < 100; ++i) {
    CHECK(order[i] == i);
    CHECK(threads[i] == threads[0]);
  }
  CHECK(threads[0] != std::this_thread::get_id());
}

TEST_CASE("events order work across streams, step after step", "[hal]") {
  auto device = createCpuDevice(nullptr);
  auto a = newStream(*device, "a"), b = newStream(*device, "b");
  auto event = newEvent(*device);
  std::atomic<bool> abort{false};
  for (uint64_t step = 1; step <= 50; ++step) {
    int produced = 0, consumed = -1;
    bool waited = false, signalled = false;
    b->enqueue([&] {
      waited = event->wait(step, abort).isOk();
      consumed = produced;
    });
    a->enqueue([&] {
      produced = int(step);
      signalled = event->signal(step).isOk();
    });
    REQUIRE(a->synchronize());
    REQUIRE(b->synchronize());
    CHECK(signalled);
    CHECK(waited);
    CHECK(consumed == int(step));
    CHECK(event->value() == step);
  }
}

TEST_CASE("an aborted wait fails once woken", "[hal]") {
  auto device = createCpuDevice(nullptr);
  auto stream = newStream(*device, "s");
  auto event = newEvent(*device);
  std::atomic<bool> abort{false};
  Status result;
  stream->enqueue([&] { result = event->wait(1, abort); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  abort = true;
  event->wake();
  REQUIRE(stream->synchronize());
  CHECK_FALSE(result);
  CHECK(result.message() == "aborted while waiting for the event to reach 1");
}

TEST_CASE("the allocator counts live and peak bytes and reuses blocks",
          "[hal]") {
  auto device = createCpuDevice(nullptr);
  Allocator &mem = device->allocator();
  void *x = nullptr, *y = nullptr;
  REQUIRE(mem.allocate(1000, x));
  REQUIRE(mem.allocate(24, y));
  REQUIRE(x);
  REQUIRE(y);
  CHECK(reinterpret_cast<uintptr_t>(x) % 64 == 0);
  CHECK(mem.liveBytes() == 1024);
  REQUIRE(mem.zero(x, 1000));
  CHECK(static_cast<char *>(x)[999] == 0);
  mem.deallocate(x, 1000);
  CHECK(mem.liveBytes() == 24);
  CHECK(mem.peakBytes() == 1024);
  void *again = nullptr;
  REQUIRE(mem.allocate(1000, again)); // same block size: reused
  CHECK(again == x);
  mem.deallocate(again, 1000);
  mem.deallocate(y, 24);
  CHECK(mem.liveBytes() == 0);
}

TEST_CASE("an allocation that cannot be met is an error", "[hal]") {
  auto device = createCpuDevice(nullptr);
  Allocator &mem = device->allocator();
  void *p = &mem;
  Status st = mem.allocate(size_t(1) << 62, p);
  CHECK_FALSE(st);
  CHECK(p == nullptr);
  CHECK(st.message() ==
        "out of memory: cannot allocate 4611686018427387904 bytes");
  CHECK(mem.liveBytes() == 0);
}

// The gradient norm's sums of squares: one measure call over many spans
// into slots, one read; the CPU's are runtime::sumOfSquares exactly.
TEST_CASE("the CPU sums of squares are the CPU kernels' to the bit", "[hal]") {
  auto device = createCpuDevice(nullptr);
  std::vector<float> a(100003), b(7);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<float>(std::sin(double(i))) * 3.0f;
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<float>(i) - 2.5f;
  std::unique_ptr<SquareSums> squares;
  REQUIRE(device->createSquareSums(3, squares));
  REQUIRE(squares->measure({{a.data(), int64_t(a.size()), 2},
                            {b.data(), int64_t(b.size()), 0},
                            {a.data(), 0, 1}}));
  std::vector<double> sums(3, -1.0);
  REQUIRE(squares->read(sums.data(), 3));
  CHECK(sums[2] == sumOfSquares(a.data(), int64_t(a.size())));
  CHECK(sums[0] == sumOfSquares(b.data(), int64_t(b.size())));
  CHECK(sums[1] == 0.0);
  Status bad = squares->measure({{b.data(), 1, 3}});
  CHECK(bad.message() == "sum of squares: slot 3 is not one of the 3");
  CHECK_FALSE(squares->read(sums.data(), 4));
}

TEST_CASE("kernels are resolved by name once", "[hal]") {
  auto device = createCpuDevice(nullptr);
  const KernelInfo *add = device->findKernel("add");
  REQUIRE(add);
  CHECK(std::string(add->name) == "add");
  CHECK(kernelNames().at(add->index) == "add");
  CHECK(device->findKernel("no_such_kernel") == nullptr);
}

// The kernel table (proto/KernelIds.h) is the contract every backend meets:
// the CPU backend implements every kernel id and no other, and each of its
// kernels accepts exactly the table's operand counts.

TEST_CASE("the CPU backend implements exactly the kernel table", "[hal]") {
  auto device = createCpuDevice(nullptr);
  for (const piper::plan::KernelSignature &sig :
       piper::plan::kernelSignatures()) {
    INFO("table kernel " << sig.name);
    const KernelInfo *info = device->findKernel(sig.name);
    REQUIRE(info);
    CHECK(std::string(info->name) == sig.name);
  }
  std::vector<std::string> names = device->kernelNames();
  for (const std::string &name : names) {
    INFO("cpu kernel " << name);
    CHECK(piper::plan::findKernelSignature(name));
    CHECK(device->findKernel(name));
  }
  CHECK(names.size() == piper::plan::kernelSignatures().size());
  CHECK(piper::plan::checkBackendKernels(device->name(), names) == "");
}

TEST_CASE("every CPU kernel accepts exactly the table's operand counts",
          "[hal]") {
  auto device = createCpuDevice(nullptr);
  // Enough f32 [2,2] tensors for any count; the contents do not matter: only
  // whether the kernel complains about its operand counts.
  std::vector<std::vector<float>> storage(10, std::vector<float>(4, 0.5f));
  double loss = 0;
  KernelContext ctx;
  ctx.lossAccumulator = &loss;
  for (const piper::plan::KernelSignature &sig :
       piper::plan::kernelSignatures()) {
    const KernelInfo *info = device->findKernel(sig.name);
    REQUIRE(info);
    piper::plan::Kernel kernel;
    kernel.set_op(sig.name);
    for (int in = 0; in <= 5; ++in)
      for (int out = 0; out <= 4; ++out) {
        std::vector<TensorRef> ins, outs;
        for (int i = 0; i < in; ++i)
          ins.push_back(TensorRef{piper::plan::F32, {2, 2}, storage[i].data()});
        for (int i = 0; i < out; ++i)
          outs.push_back(
              TensorRef{piper::plan::F32, {2, 2}, storage[5 + i].data()});
        Status st = device->runKernel(*info, kernel, decodeKernelAttrs(kernel),
                                      ins, outs, ctx);
        const std::string &msg = st.message();
        bool countError =
            !st && msg.rfind(std::string(sig.name) + ": expected ", 0) == 0 &&
            (msg.find(" input") != std::string::npos ||
             msg.find(" output") != std::string::npos);
        bool fits =
            in >= sig.minInputs && in <= sig.maxInputs && out == sig.outputs;
        INFO(sig.name << " with " << in << " inputs, " << out
                      << " outputs: " << msg);
        CHECK(countError == !fits);
      }
  }
}
