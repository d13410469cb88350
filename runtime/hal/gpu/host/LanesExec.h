// The warp code of the GPU kernels on the host, with 32 lanes: an Exec whose
// rows run on 32 threads that meet at every cross-lane operation (sum, max,
// shuffles, match, sync) and combine in a warp's order (Simt.h's
// WarpLanes), and whose forEach visits the indices in reverse order. The
// emulation (HostExec) runs one lane; built with PIPER_GPU_LANES32,
// HostExec is this Exec (//runtime/hal/gpu:emulation_lanes32, namespace
// gpu_lanes32), so gpu_kernels_lanes_test runs the kernel cases with the
// lane striding and the cross-lane operations a GPU has. A lane left
// waiting at a meeting (a divergent reduction, undefined on a GPU) aborts
// the test. For tests only: 32 threads per row launch.
#ifndef PIPER_RUNTIME_HAL_GPU_HOST_LANESEXEC_H
#define PIPER_RUNTIME_HAL_GPU_HOST_LANESEXEC_H

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/Simt.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

namespace {

// 32 lanes' meeting point: a reusable barrier and one slot per lane.
class Meeting {
public:
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    uint64_t gen = generation;
    if (++arrived == 32) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      // A lane left waiting: the others skipped a lanes.sum (divergent
      // reductions, undefined on a GPU).
      if (!cv.wait_for(lock, std::chrono::seconds(20),
                       [&] { return generation != gen; })) {
        std::fprintf(stderr, "lanes diverged: not every lane reached a "
                             "cross-lane operation\n");
        std::abort();
      }
    }
  }
  double doubles[32];
  int64_t ints[32];

private:
  std::mutex mutex;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
};

struct ThreadLanes {
  static constexpr int kCount = 32;
  int id;
  Meeting *meeting;
  int lane() const { return id; }
  // The warp's butterfly order (Simt.h's WarpLanes): every lane gets the
  // same result.
  template <class T> T sum(T v) const {
    return combine(v, [](T a, T b) { return a + b; });
  }
  float max(float v) const {
    return combine(v, [](float a, float b) { return a > b ? a : b; });
  }
  template <class T> T shuffleXor(T v, int mask) const {
    return exchange(v, id ^ mask);
  }
  template <class T> T shuffleUp(T v, int delta) const {
    // A lane below delta keeps its own value, as __shfl_up_sync.
    return exchange(v, id >= delta ? id - delta : id);
  }
  template <class T> T shuffle(T v, int src) const { return exchange(v, src); }
  uint32_t match(int key) const {
    int64_t *keys = meeting->ints;
    keys[id] = key;
    meeting->wait();
    uint32_t mask = 0;
    for (int l = 0; l < 32; ++l)
      if (keys[l] == key)
        mask |= 1u << l;
    meeting->wait();
    return mask;
  }
  uint32_t maskBelow() const { return (1u << id) - 1u; }
  void sync() const { meeting->wait(); }

private:
  template <class T> T exchange(T v, int from) const {
    slot<T>()[id] = v;
    meeting->wait();
    T other = static_cast<T>(slot<T>()[from]);
    meeting->wait();
    return other;
  }
  template <class T, class Op> T combine(T v, Op op) const {
    for (int o = 16; o > 0; o >>= 1) {
      slot<T>()[id] = v;
      meeting->wait();
      T other = slot<T>()[id ^ o];
      meeting->wait();
      v = op(v, other);
    }
    return v;
  }
  template <class T> auto slot() const {
    if constexpr (std::is_integral_v<T>)
      return reinterpret_cast<int64_t *>(meeting->ints);
    else
      return reinterpret_cast<double *>(meeting->doubles);
  }
};

} // namespace

class LanesExec {
public:
  using Lanes = ThreadLanes;
  explicit LanesExec(const Context &ctx) : ctx(ctx) {}
  const Context &context() const { return ctx; }
  template <class F> Status forEach(const char *, int64_t n, F f) const {
    for (int64_t i = n - 1; i >= 0; --i)
      f(i);
    return Status::ok();
  }
  // Every lane takes every row, as CudaExec's warps.
  template <class F> Status forEachRow(const char *, int64_t rows, F f) const {
    Meeting meeting;
    std::vector<std::thread> lanes;
    for (int l = 0; l < 32; ++l)
      lanes.emplace_back([&, l] {
        for (int64_t r = rows - 1; r >= 0; --r)
          f(Lanes{l, &meeting}, r);
      });
    for (std::thread &t : lanes)
      t.join();
    return Status::ok();
  }

private:
  const Context &ctx;
};

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_HOST_LANESEXEC_H
