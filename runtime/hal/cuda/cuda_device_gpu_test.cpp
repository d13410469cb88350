// The CUDA device on a GPU (tag gpu): the arena from one cudaMalloc, copies
// host -> device -> device -> host on two streams ordered by an event, and
// zeroing, with the bytes checked after the round trip.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <vector>

#include "runtime/hal/cuda/CudaBackend.h"

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
} // namespace

TEST_CASE("the arena is one device allocation, counted to the byte",
          "[cuda][gpu]") {
  auto device = gpu();
  Allocator &a = device->allocator();
  const size_t bytes = (64 << 20) + 4; // an odd size
  void *arena = a.allocate(bytes);
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
  auto *arena = static_cast<char *>(a.allocate(bytes));
  REQUIRE(arena);
  // Three regions at offsets, as a plan places its tensors.
  float *x = reinterpret_cast<float *>(arena);
  float *y = reinterpret_cast<float *>(arena + n * sizeof(float));
  float *z = reinterpret_cast<float *>(arena + 2 * n * sizeof(float));

  std::vector<float> host(n);
  std::iota(host.begin(), host.end(), 0.5f);
  a.copyFromHost(x, host.data(), n * sizeof(float)); // from the host thread
  a.zero(z, n * sizeof(float));

  auto producer = device->createStream("producer");
  auto consumer = device->createStream("consumer");
  auto ready = device->createEvent();
  std::atomic<bool> abort{false};
  std::vector<float> back(n, -1.0f), zeros(n, -1.0f);
  bool waited = false;
  for (uint64_t step = 1; step <= 3; ++step) {
    std::fill(back.begin(), back.end(), -1.0f);
    // The consumer is enqueued first: it must wait for the producer's copy.
    consumer->enqueue([&] {
      waited = ready->wait(step, abort);
      a.copyToHost(back.data(), y, n * sizeof(float));
    });
    producer->enqueue([&] {
      a.zero(y, n * sizeof(float));
      a.copy(y, x, n * sizeof(float));
      ready->signal(step);
    });
    producer->synchronize();
    consumer->synchronize();
    CHECK(waited);
    CHECK(ready->value() == step);
    CHECK(std::memcmp(back.data(), host.data(), n * sizeof(float)) == 0);
  }
  a.copyToHost(zeros.data(), z, n * sizeof(float));
  CHECK(std::all_of(zeros.begin(), zeros.end(),
                    [](float v) { return v == 0.0f; }));
  a.deallocate(arena, bytes);
}

TEST_CASE("an event wait returns false when the step aborts", "[cuda][gpu]") {
  auto device = gpu();
  auto stream = device->createStream("s");
  auto never = device->createEvent();
  std::atomic<bool> abort{false};
  std::atomic<int> result{-1};
  stream->enqueue([&] { result = never->wait(1, abort) ? 1 : 0; });
  abort = true;
  never->wake();
  stream->synchronize();
  CHECK(result == 0);
}
