// The warp code of the GPU kernels on the host, with 32 lanes: an Exec whose
// rows run on 32 threads that meet at every lanes.sum/max and combine in a
// warp's butterfly order (Simt.h's WarpLanes), and whose forEach visits the
// indices in reverse order. The emulation (HostExec) runs one lane; the
// *_lanes_test binaries compile a group's *Launch.inl with this Exec (in a
// namespace of their own, PIPER_GPU_NS) to exercise the lane striding and
// the cross-lane reductions before a GPU does. A lane left waiting at a
// reduction (a divergent lanes.sum, undefined on a GPU) aborts the test.
#ifndef PIPER_RUNTIME_HAL_GPU_TEST_LANESEXEC_H
#define PIPER_RUNTIME_HAL_GPU_TEST_LANESEXEC_H

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
                             "lanes.sum/max\n");
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

private:
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
  explicit LanesExec(const Context &) {}
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
};

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_TEST_LANESEXEC_H
