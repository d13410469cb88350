// Internal to runtime/comm: the Gloo communicator's class, its connected
// groups (each with a worker thread running its collectives in issue order)
// and its works. Shared by GlooCommunicator.cpp and GlooCollectives.cpp.
#ifndef PIPER_RUNTIME_COMM_GLOOCOMMUNICATOR_H
#define PIPER_RUNTIME_COMM_GLOOCOMMUNICATOR_H

#include "runtime/comm/Communicator.h"

#include <gloo/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/device.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

namespace piper::runtime::gloo_comm {

/// Store prefix of the world control context; never equal to a key's str(),
/// which always ends in ']'.
inline constexpr const char *kWorldPrefix = "__world__";

using ReduceFn = void (*)(void *, const void *, const void *, size_t);

inline std::string rankList(const std::vector<int> &ranks) {
  return CommKey{"", ranks}.str();
}

/// Gloo's messages start with "[file.cc:line] " locations (sometimes twice);
/// drops them and lowercases the first letter to match Status messages.
std::string describe(const std::exception &e);

/// A work completed by another thread: per-work lock and condition, so
/// waiters on different operations never contend.
class AsyncWork final : public CommWork {
public:
  void complete(Status result) {
    {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(result);
      done = true;
    }
    cv.notify_all();
  }
  Status wait() override {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return status;
  }

private:
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
};

/// One connected communicator. `context` is null for a single-rank key,
/// which needs no connection. Collectives run on `worker`, in issue order.
struct Group {
  CommKey key;
  std::shared_ptr<gloo::Context> context;
  /// Collective tag; advances identically on every rank of the group. Only
  /// the worker thread (or the world lock's holder) touches it.
  uint32_t nextTag = 0;

  std::mutex mu; // guards the fields below
  /// Set when an operation failed; the context is closed from then on.
  std::string failure;
  std::deque<std::function<void()>> queue;
  bool stopping = false;
  std::condition_variable wake;
  std::thread worker;

  int contextRank(int worldRank) const {
    auto it = std::lower_bound(key.ranks.begin(), key.ranks.end(), worldRank);
    return static_cast<int>(it - key.ranks.begin());
  }
  std::string failureText() {
    std::lock_guard<std::mutex> lock(mu);
    return failure;
  }
  /// Runs `job` on the worker thread after every job issued before it.
  void enqueue(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!worker.joinable())
        worker = std::thread([this] { work(); });
      queue.push_back(std::move(job));
    }
    wake.notify_one();
  }
  void work() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mu);
        wake.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty())
          return;
        job = std::move(queue.front());
        queue.pop_front();
      }
      job();
    }
  }
  /// Stops the worker after the queued jobs; a job blocked on a dead peer
  /// ends at the timeout or when the connections are closed.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    wake.notify_one();
    if (worker.joinable())
      worker.join();
  }
};

class GlooCommunicator final : public Communicator {
public:
  GlooCommunicator(int rank, int worldSize, std::chrono::milliseconds timeout,
                   std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::rendezvous::Store> store)
      : myRank(rank), size(worldSize), timeout(timeout),
        device(std::move(device)), store(std::move(store)) {}
  ~GlooCommunicator() override {
    for (auto &[name, group] : groups)
      group->stop();
  }

  int rank() const override { return myRank; }
  int worldSize() const override { return size; }

  Status connect(std::vector<CommKey> keys) override;
  CommWorkPtr isend(const std::string &stream, const void *data, size_t bytes,
                    int peer, uint32_t tag) override;
  CommWorkPtr irecv(const std::string &stream, void *data, size_t bytes,
                    int peer, uint32_t tag) override;
  CommWorkPtr allReduce(const CommKey &key, void *data, size_t count,
                        CommDType type) override;
  CommWorkPtr reduceScatter(const CommKey &key, const void *input, void *output,
                            const std::vector<size_t> &counts,
                            CommDType type) override;
  CommWorkPtr allGather(const CommKey &key, const void *input, void *output,
                        const std::vector<size_t> &counts,
                        CommDType type) override;
  CommWorkPtr allToAll(const CommKey &key, const void *input,
                       const std::vector<size_t> &sendCounts, void *output,
                       const std::vector<size_t> &recvCounts,
                       CommDType type) override;
  Status allReduceSumWorld(double *data, size_t count) override;

  Status opError(const std::string &op, const std::string &detail) const {
    return Status::error(
        fmt::format("rank {}: {} failed: {}", myRank, op, detail));
  }
  /// The error of `op` on `group` after an earlier `failure` closed it.
  Status unusable(const std::string &op, const Group &group,
                  const std::string &failure) const {
    return opError(op, fmt::format("communicator '{}' is unusable after an "
                                   "earlier error: {}",
                                   group.key.str(), failure));
  }
  /// Records the failure of `op` on `group` and closes its connections, so
  /// that its other ranks fail promptly instead of waiting for the timeout.
  Status fail(Group &group, const std::string &op, const std::exception &e);
  std::chrono::milliseconds opTimeout() const { return timeout; }

private:
  Status connectGroup(Group &group, const std::string &prefix);
  /// Finds the usable group of `key` or returns an error for `op`.
  Status findGroup(const CommKey &key, const std::string &op, Group *&group);
  Status pointToPointGroup(const std::string &stream, int peer,
                           const std::string &op, Group *&group);
  /// The group of a collective `what` over `key` with per-member `counts`
  /// (empty: not checked), or an error.
  Status collectiveGroup(const CommKey &key, const std::string &op,
                         const std::vector<size_t> *counts, Group *&group);
  /// Runs `body` on `group`'s worker; its exceptions fail the group.
  CommWorkPtr launch(Group &group, const std::string &op,
                     std::function<Status(Group &)> body);
  Status runAllReduce(Group &group, const std::string &op, void *data,
                      size_t count, size_t elementSize, ReduceFn reduce);

  const int myRank;
  const int size;
  const std::chrono::milliseconds timeout;
  // Members are destroyed bottom-up: groups (and their workers) before the
  // store and the device.
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::rendezvous::Store> store;
  bool connected = false;
  std::mutex worldMutex;
  Group world;
  /// Keyed by CommKey::str(); fixed after connect, so lookups from
  /// concurrent streams need no lock.
  std::map<std::string, std::unique_ptr<Group>> groups;
};

} // namespace piper::runtime::gloo_comm

#endif // PIPER_RUNTIME_COMM_GLOOCOMMUNICATOR_H
