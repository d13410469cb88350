// The CUDA device on a GPU (tag gpu): the arena from one cudaMalloc, copies
// host -> device -> device -> host on two streams ordered by an event, and
// zeroing, with the bytes checked after the round trip; an allocation the
// GPU cannot hold is an error, not the end of the process.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <vector>

#include "runtime/hal/cuda/CudaBackend.h"

using namespace piper;

using namespace piper::runtime;
using namespace piper::runtime::hal;

namespace {
std::unique_ptr<Device> gpu() {
  Status st;
  std::unique_ptr<Device> device = createCudaDevice(0, nullptr, st);
  INFO(st.message());
  REQUIRE(st);
  REQUIRE(device);
  return device;
}

std::unique_ptr<Stream> stream(Device &device, const std::string &name) {
  std::unique_ptr<Stream> s;
  Status st = device.createStream(name, s);
  INFO(st.message());
  REQUIRE(st);
  return s;
}

std::unique_ptr<Event> event(Device &device) {
  std::unique_ptr<Event> e;
  Status st = device.createEvent(e);
  INFO(st.message());
  REQUIRE(st);
  return e;
}
} // namespace

TEST_CASE("the arena is one device allocation, counted to the byte",
          "[cuda][gpu]") {
  auto device = gpu();
  Allocator &a = device->allocator();
  const size_t bytes = (64 << 20) + 4; // an odd size
  void *arena = nullptr;
  REQUIRE(a.allocate(bytes, arena));
  REQUIRE(arena);
  CHECK(reinterpret_cast<uintptr_t>(arena) % 64 == 0);
  CHECK(a.liveBytes() == static_cast<int64_t>(bytes));
  CHECK(a.peakBytes() == static_cast<int64_t>(bytes));
  a.deallocate(arena, bytes);
  CHECK(a.liveBytes() == 0);
  CHECK(a.peakBytes() == static_cast<int64_t>(bytes));
}

TEST_CASE("bytes round-trip through the arena on two streams ordered by an "
          "event",
          "[cuda][gpu]") {
  auto device = gpu();
  Allocator &a = device->allocator();
  const size_t n = (1 << 20) + 3; // floats, an odd count
  const size_t bytes = 3 * n * sizeof(float);
  void *block = nullptr;
  REQUIRE(a.allocate(bytes, block));
  auto *arena = static_cast<char *>(block);
  REQUIRE(arena);
  // Three regions at offsets, as a plan places its tensors.
  float *x = reinterpret_cast<float *>(arena);
  float *y = reinterpret_cast<float *>(arena + n * sizeof(float));
  float *z = reinterpret_cast<float *>(arena + 2 * n * sizeof(float));

  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 0.5f);
  REQUIRE(a.copyFromHost(x, host.data(), n * sizeof(float))); // host thread
  REQUIRE(a.zero(z, n * sizeof(float)));

  auto producer = stream(*device, "producer");
  auto consumer = stream(*device, "consumer");
  auto ready = event(*device);
  std::atomic<bool> abort{false};
  std::vector<float> back(n, -1.0f), zeros(n, -1.0f);
  Status waited, consumed, produced;
  for (uint64_t step = 1; step <= 3; ++step) {
    std::fill(back.begin(), back.end(), -1.0f);
    // The consumer is enqueued first: it must wait for the producer's copy.
    consumer->enqueue([&] {
      waited = ready->wait(step, abort);
      consumed = a.copyToHost(back.data(), y, n * sizeof(float));
    });
    producer->enqueue([&] {
      produced = a.zero(y, n * sizeof(float));
      if (produced)
        produced = a.copy(y, x, n * sizeof(float));
      if (produced)
        produced = ready->signal(step);
    });
    REQUIRE(producer->synchronize());
    REQUIRE(consumer->synchronize());
    INFO(produced.message() << " | " << waited.message() << " | "
                            << consumed.message());
    CHECK(produced);
    CHECK(waited);
    CHECK(consumed);
    CHECK(ready->value() == step);
    CHECK(std::memcmp(back.data(), host.data(), n * sizeof(float)) == 0);
  }
  REQUIRE(a.copyToHost(zeros.data(), z, n * sizeof(float)));
  CHECK(std::all_of(zeros.begin(), zeros.end(),
                    [](float v) { return v == 0.0f; }));
  a.deallocate(arena, bytes);
}

TEST_CASE("an event wait fails when the step aborts", "[cuda][gpu]") {
  auto device = gpu();
  auto s = stream(*device, "s");
  auto never = event(*device);
  std::atomic<bool> abort{false};
  std::atomic<int> result{-1};
  s->enqueue([&] { result = never->wait(1, abort) ? 1 : 0; });
  abort = true;
  never->wake();
  REQUIRE(s->synchronize());
  CHECK(result == 0);
}

TEST_CASE("a device allocation larger than the GPU is an error naming "
          "cudaMalloc",
          "[cuda][gpu]") {
  auto device = gpu();
  Allocator &a = device->allocator();
  void *p = nullptr;
  Status st = a.allocate(size_t(1) << 50, p); // 1 PiB
  CHECK_FALSE(st);
  CHECK(p == nullptr);
  CHECK(st.message().find("cudaMalloc(&ptr, 1125899906842624 bytes): "
                          "cudaErrorMemoryAllocation") == 0);
  CHECK(a.liveBytes() == 0);
  // Not sticky: the device still works.
  void *q = nullptr;
  REQUIRE(a.allocate(256, q));
  a.deallocate(q, 256);
}
