// The warp code of the GPU kernels on the host, with 32 lanes: an Exec whose
// rows run on 32 lanes (fibers) that meet at every cross-lane operation (sum,
// max, shuffles, match, sync) and combine in a warp's order (Simt.h's
// WarpLanes), and whose forEach visits the indices in reverse order. The
// emulation (HostExec) runs one lane; built with PIPER_GPU_LANES32,
// HostExec is this Exec (//runtime/hal/gpu:emulation_lanes32, namespace
// gpu_lanes32), so gpu_kernels_lanes_test runs the kernel cases with the
// lane striding and the cross-lane operations a GPU has. A lane left
// waiting at a meeting (a divergent reduction, undefined on a GPU) aborts
// the test. For tests only: the 32 lanes are fibers on the calling thread.
#ifndef PIPER_RUNTIME_HAL_GPU_HOST_LANESEXEC_H
#define PIPER_RUNTIME_HAL_GPU_HOST_LANESEXEC_H

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include <sys/mman.h>
#include <ucontext.h>

#include "runtime/hal/gpu/GpuApi.h"
#include "runtime/hal/gpu/Simt.h"

namespace piper::runtime::hal::PIPER_GPU_NS {

namespace {

// The 32 lanes of a row, run as fibers on the calling thread (ucontext): a
// lane runs until it reaches a cross-lane operation (it parks at the
// meeting) or ends; when all 32 are parked they go on. Switching fibers in
// user space keeps a test's millions of meetings cheap, where 32 threads
// per row made the kernel switch between them at every one (gpu_kernels_
// lanes_test spent 200 s of 2 cores in the scheduler).
class Meeting {
public:
  static constexpr int kLanes = 32;
  // Parks the running lane until every lane has arrived.
  void wait() {
    ++arrived;
    parked[running] = true;
    swapcontext(&lanes[running], &main);
  }
  double doubles[kLanes];
  int64_t ints[kLanes];

  // Runs body(lane) on every lane, meeting by wait(); aborts when lanes
  // diverge (some ended while others wait at a cross-lane operation).
  template <class Body> void run(Body &body) {
    Stacks &stacks = Stacks::forThread();
    struct Start {
      Meeting *meeting;
      Body *body;
    } start{this, &body};
    for (int l = 0; l < kLanes; ++l) {
      getcontext(&lanes[l]);
      lanes[l].uc_stack.ss_sp = stacks.stack(l);
      lanes[l].uc_stack.ss_size = Stacks::kBytes;
      lanes[l].uc_link = &main;
      // makecontext passes ints: the pointer in two halves.
      auto bits = reinterpret_cast<uintptr_t>(&start);
      makecontext(&lanes[l], reinterpret_cast<void (*)()>(&enter<Start>), 3,
                  static_cast<unsigned>(bits),
                  static_cast<unsigned>(uint64_t(bits) >> 32), l);
    }
    int ended = 0;
    bool done[kLanes] = {};
    while (ended < kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        if (done[l] || parked[l])
          continue;
        running = l;
        finished = false;
        swapcontext(&main, &lanes[l]);
        if (finished) {
          done[l] = true;
          ++ended;
        }
      }
      if (arrived == 0)
        continue; // every lane ended
      if (arrived + ended != kLanes || ended > 0) {
        // A lane left waiting: the others skipped a lanes.sum (divergent
        // reductions, undefined on a GPU).
        std::fprintf(stderr, "lanes diverged: not every lane reached a "
                             "cross-lane operation\n");
        std::abort();
      }
      arrived = 0;
      for (bool &p : parked)
        p = false;
    }
  }

private:
  // Per thread: 32 stacks with a guard page below each, mapped once.
  struct Stacks {
    static constexpr size_t kBytes = size_t(256) << 10, kGuard = 4096;
    char *base = nullptr;
    static Stacks &forThread() {
      thread_local Stacks stacks;
      return stacks;
    }
    char *stack(int lane) {
      if (!base) {
        size_t total = kLanes * (kGuard + kBytes);
        void *p = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
          std::fprintf(stderr, "lanes: cannot map the lanes' stacks\n");
          std::abort();
        }
        base = static_cast<char *>(p);
        for (int l = 0; l < kLanes; ++l)
          mprotect(base + l * (kGuard + kBytes), kGuard, PROT_NONE);
      }
      return base + lane * (kGuard + kBytes) + kGuard;
    }
    ~Stacks() {
      if (base)
        munmap(base, kLanes * (kGuard + kBytes));
    }
  };

  template <class Start> static void enter(unsigned lo, unsigned hi, int lane) {
    auto *start =
        reinterpret_cast<Start *>(uintptr_t(lo) | (uintptr_t(hi) << 32));
    (*start->body)(lane);
    start->meeting->finished = true; // uc_link returns to run()
  }

  ucontext_t main;
  ucontext_t lanes[kLanes];
  bool parked[kLanes] = {};
  int arrived = 0;
  int running = 0;
  bool finished = false;
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
    auto body = [&](int l) {
      for (int64_t r = rows - 1; r >= 0; --r)
        f(Lanes{l, &meeting}, r);
    };
    meeting.run(body);
    return Status::ok();
  }

private:
  const Context &ctx;
};

} // namespace piper::runtime::hal::PIPER_GPU_NS

#endif // PIPER_RUNTIME_HAL_GPU_HOST_LANESEXEC_H
