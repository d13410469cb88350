// Unit tests of the CPU HAL backend: stream order and persistence, events
// between streams (and their abort), allocator accounting and reuse, and
// the kernel registry.
#include "runtime/hal/cpu/CpuDevice.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

using namespace piper::runtime;
using namespace piper::runtime::hal;

TEST_CASE("a stream runs its work in order on one persistent thread", "[hal]") {
  auto device = createCpuDevice(nullptr);
  auto stream = device->createStream("compute");
  CHECK(stream->name() == "compute");
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 100; ++i)
    stream->enqueue([&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    });
  stream->synchronize();
  REQUIRE(order.size() == 100);
  for (int i = 0; i < 100; ++i) {
    CHECK(order[i] == i);
    CHECK(threads[i] == threads[0]);
  }
  CHECK(threads[0] != std::this_thread::get_id());
}

TEST_CASE("events order work across streams, step after step", "[hal]") {
  auto device = createCpuDevice(nullptr);
  auto a = device->createStream("a"), b = device->createStream("b");
  auto event = device->createEvent();
  std::atomic<bool> abort{false};
  for (uint64_t step = 1; step <= 50; ++step) {
    int produced = 0, consumed = -1;
    bool waited = false;
    b->enqueue([&] {
      waited = event->wait(step, abort);
      consumed = produced;
    });
    a->enqueue([&] {
      produced = int(step);
      event->signal(step);
    });
    a->synchronize();
    b->synchronize();
    CHECK(waited);
    CHECK(consumed == int(step));
    CHECK(event->value() == step);
  }
}

TEST_CASE("an aborted wait returns false once woken", "[hal]") {
  auto device = createCpuDevice(nullptr);
  auto stream = device->createStream("s");
  auto event = device->createEvent();
  std::atomic<bool> abort{false};
  bool result = true;
  stream->enqueue([&] { result = event->wait(1, abort); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  abort = true;
  event->wake();
  stream->synchronize();
  CHECK_FALSE(result);
}

TEST_CASE("the allocator counts live and peak bytes and reuses blocks",
          "[hal]") {
  auto device = createCpuDevice(nullptr);
  Allocator &mem = device->allocator();
  void *x = mem.allocate(1000);
  void *y = mem.allocate(24);
  REQUIRE(x);
  REQUIRE(y);
  CHECK(reinterpret_cast<uintptr_t>(x) % 64 == 0);
  CHECK(mem.liveBytes() == 1024);
  mem.zero(x, 1000);
  CHECK(static_cast<char *>(x)[999] == 0);
  mem.deallocate(x, 1000);
  CHECK(mem.liveBytes() == 24);
  CHECK(mem.peakBytes() == 1024);
  void *again = mem.allocate(1000); // same block size: reused
  CHECK(again == x);
  mem.deallocate(again, 1000);
  mem.deallocate(y, 24);
  CHECK(mem.liveBytes() == 0);
}

TEST_CASE("kernels are resolved by name once", "[hal]") {
  auto device = createCpuDevice(nullptr);
  const KernelInfo *add = device->findKernel("add");
  REQUIRE(add);
  CHECK(std::string(add->name) == "add");
  CHECK(kernelNames().at(add->index) == "add");
  CHECK(device->findKernel("no_such_kernel") == nullptr);
}
