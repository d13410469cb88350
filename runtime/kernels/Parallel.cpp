// A minimal fork-aware thread pool behind parallelFor (see Parallel.h).
// Workers sleep on a condition variable between loops (no spinning: on a
// small machine they would steal the cores of OpenBLAS's own threads).
#include "runtime/kernels/Parallel.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace piper::runtime::detail {

namespace {

class Pool {
public:
  explicit Pool(int workers) {
    for (int w = 0; w < workers; ++w)
      threads.emplace_back([this] { work(); });
  }
  // Never destroyed (see pool()): threads may be blocked at exit.

  int size() const { return static_cast<int>(threads.size()); }

  /// Runs the loop if no other loop is running; false otherwise.
  bool tryRun(int64_t n, int64_t grain,
              const std::function<void(int64_t, int64_t)> &body) {
    std::unique_lock<std::mutex> busy(runMu, std::try_to_lock);
    if (!busy.owns_lock())
      return false;
    {
      std::lock_guard<std::mutex> lock(mu);
      job = &body;
      jobN = n;
      jobGrain = grain;
      chunks = (n + grain - 1) / grain;
      next.store(0);
      finished = 0;
      ++generation;
    }
    wake.notify_all();
    runChunks(body, n, grain, chunks);
    std::unique_lock<std::mutex> lock(mu);
    done.wait(lock, [&] { return finished == size(); });
    job = nullptr;
    return true;
  }

private:
  void runChunks(const std::function<void(int64_t, int64_t)> &body, int64_t n,
                 int64_t grain, int64_t count) {
    for (int64_t c = next.fetch_add(1); c < count; c = next.fetch_add(1)) {
      int64_t begin = c * grain;
      body(begin, std::min(n, begin + grain));
    }
  }

  void work() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t, int64_t)> *body;
      int64_t n, grain, count;
      {
        std::unique_lock<std::mutex> lock(mu);
        wake.wait(lock, [&] { return generation != seen; });
        seen = generation;
        body = job;
        n = jobN;
        grain = jobGrain;
        count = chunks;
      }
      runChunks(*body, n, grain, count);
      {
        std::lock_guard<std::mutex> lock(mu);
        ++finished;
      }
      done.notify_one();
    }
  }

  std::vector<std::thread> threads;
  std::mutex runMu; // one loop at a time
  std::mutex mu;
  std::condition_variable wake, done;
  const std::function<void(int64_t, int64_t)> *job = nullptr;
  int64_t jobN = 0, jobGrain = 1, chunks = 0;
  std::atomic<int64_t> next{0};
  int finished = 0;
  uint64_t generation = 0;
};

std::mutex poolMu;
Pool *currentPool = nullptr;
pid_t poolPid = 0;

/// The pool of this process with `workers` threads. A forked child (whose
/// copy has no threads) and a larger thread count get a new pool; old ones
/// are leaked on purpose, since their threads cannot be joined.
Pool *pool(int workers) {
  std::lock_guard<std::mutex> lock(poolMu);
  pid_t pid = ::getpid();
  if (!currentPool || poolPid != pid || currentPool->size() < workers) {
    currentPool = new Pool(workers);
    poolPid = pid;
  }
  return currentPool;
}

} // namespace

int parallelThreads() {
  int threads = openblas_get_num_threads();
  return threads < 1 ? 1 : threads;
}

void parallelFor(int64_t n, int64_t grain,
                 const std::function<void(int64_t, int64_t)> &body) {
  if (n <= 0)
    return;
  if (grain < 1)
    grain = 1;
  int threads = parallelThreads();
  if (threads > 1 && n > grain && pool(threads - 1)->tryRun(n, grain, body))
    return;
  for (int64_t begin = 0; begin < n; begin += grain)
    body(begin, std::min(n, begin + grain));
}

} // namespace piper::runtime::detail
