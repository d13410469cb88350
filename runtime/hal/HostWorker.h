// The host side of a HAL stream: one thread that runs queued work in order.
// The CPU backend's streams are just this; the CUDA backend's streams issue
// their device work from it.
#ifndef PIPER_RUNTIME_HAL_HOSTWORKER_H
#define PIPER_RUNTIME_HAL_HOSTWORKER_H

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace piper::runtime::hal {

class HostWorker {
public:
  /// Starts the thread; `onStart` (if any) runs on it before any work (e.g.
  /// selecting the thread's GPU).
  explicit HostWorker(std::function<void()> onStart = {})
      : onStart(std::move(onStart)), worker([this] { run(); }) {}
  /// Runs the work already queued, then stops the thread.
  ~HostWorker() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    wakeWorker.notify_one();
    worker.join();
  }
  HostWorker(const HostWorker &) = delete;
  HostWorker &operator=(const HostWorker &) = delete;

  void enqueue(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(work));
      ++enqueued;
    }
    wakeWorker.notify_one();
  }

  /// Waits until everything enqueued before the call has run.
  void synchronize() {
    std::unique_lock<std::mutex> lock(mu);
    uint64_t target = enqueued;
    idle.wait(lock, [&] { return completed >= target; });
  }

private:
  void run() {
    if (onStart)
      onStart();
    for (;;) {
      std::function<void()> work;
      {
        std::unique_lock<std::mutex> lock(mu);
        wakeWorker.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty())
          return;
        work = std::move(queue.front());
        queue.pop_front();
      }
      work();
      {
        std::lock_guard<std::mutex> lock(mu);
        ++completed;
      }
      idle.notify_all();
    }
  }

  std::function<void()> onStart;
  std::mutex mu;
  std::condition_variable wakeWorker, idle;
  std::deque<std::function<void()>> queue;
  uint64_t enqueued = 0, completed = 0;
  bool stopping = false;
  std::thread worker; // last: starts once the rest is constructed
};

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_HOSTWORKER_H
