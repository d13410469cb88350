// Gloo (TCP) implementation of the Communicator: one Gloo context per
// (stream, ranks) key plus a world control context, met through a file store.
#include "runtime/comm/Communicator.h"

#include <gloo/allreduce.h>
#include <gloo/context.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <utility>

namespace piper::runtime {

std::string CommKey::str() const {
  std::string s = stream + "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i != 0)
      s += ',';
    s += std::to_string(ranks[i]);
  }
  return s + "]";
}

namespace {

/// Store prefix of the world control context; never equal to a key's str(),
/// which always ends in ']'.
constexpr const char *kWorldPrefix = "__world__";

using ReduceFn = void (*)(void *, const void *, const void *, size_t);

/// Gloo's tcp transport writes with writev(2), so writing to a peer that died
/// raises SIGPIPE, whose default action kills this process before the error
/// can be reported. Ignores it unless the program installed its own handler.
void ignoreSigpipe() {
  struct sigaction current = {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL)
    std::signal(SIGPIPE, SIG_IGN);
}

std::string rankList(const std::vector<int> &ranks) {
  return CommKey{"", ranks}.str();
}

/// Gloo's messages start with "[file.cc:line] " locations (sometimes twice);
/// drops them and lowercases the first letter to match Status messages.
std::string describe(const std::exception &e) {
  std::string msg = e.what();
  while (msg.size() > 1 && msg[0] == '[') {
    size_t close = msg.find("] ");
    if (close == std::string::npos ||
        msg.substr(0, close).find("gloo/") == std::string::npos)
      break;
    msg.erase(0, close + 2);
  }
  if (!msg.empty())
    msg[0] =
        static_cast<char>(std::tolower(static_cast<unsigned char>(msg[0])));
  return msg.empty() ? "unknown gloo error" : msg;
}

/// One connected communicator. `context` is null for a single-rank key,
/// which needs no connection.
struct Group {
  CommKey key;
  std::shared_ptr<gloo::Context> context;
  /// Collective tag; advances identically on every rank of the group.
  uint32_t nextTag = 0;
  /// Set when an operation failed; the context is closed from then on.
  std::string failure;

  int contextRank(int worldRank) const {
    auto it = std::lower_bound(key.ranks.begin(), key.ranks.end(), worldRank);
    return static_cast<int>(it - key.ranks.begin());
  }
};

/// A started send whose buffer stays alive until waitSends.
struct PendingSend {
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  Group *group;
  int peer;
};

class GlooCommunicator final : public Communicator {
public:
  GlooCommunicator(int rank, int worldSize, std::chrono::milliseconds timeout,
                   std::shared_ptr<gloo::transport::Device> device,
                   std::unique_ptr<gloo::rendezvous::FileStore> store)
      : myRank(rank), size(worldSize), timeout(timeout),
        device(std::move(device)), store(std::move(store)) {}

  int rank() const override { return myRank; }
  int worldSize() const override { return size; }

  Status connect(std::vector<CommKey> keys) override;
  Status send(const std::string &stream, const void *data, size_t bytes,
              int peer, uint32_t tag) override;
  Status recv(const std::string &stream, void *data, size_t bytes, int peer,
              uint32_t tag) override;
  Status waitSends(const std::string &stream) override;
  Status allReduceSum(const std::string &stream, const std::vector<int> &ranks,
                      float *data, size_t count) override;
  Status allReduceSumWorld(double *data, size_t count) override;

private:
  Status opError(const std::string &op, const std::string &detail) const {
    return Status::error("rank " + std::to_string(myRank) + ": " + op +
                         " failed: " + detail);
  }
  Status checkKey(CommKey &key) const;
  Status connectGroup(Group &group, const std::string &prefix);
  /// Finds the usable group of `key` or returns an error for `op`.
  Status findGroup(const CommKey &key, const std::string &op, Group *&group);
  Status pointToPointGroup(const std::string &stream, int peer,
                           const std::string &op, Group *&group);
  /// Records the failure of `op` on `group` and closes its connections, so
  /// that its other ranks fail promptly instead of waiting for the timeout.
  Status fail(Group &group, const std::string &op, const std::exception &e);
  Status allReduce(Group &group, const std::string &op, void *data,
                   size_t count, size_t elementSize, ReduceFn reduce);

  const int myRank;
  const int size;
  const std::chrono::milliseconds timeout;
  // Members are destroyed bottom-up: pending buffers before their contexts,
  // contexts before the store and the device.
  std::shared_ptr<gloo::transport::Device> device;
  std::unique_ptr<gloo::rendezvous::FileStore> store;
  bool connected = false;
  std::mutex worldMutex;
  Group world;
  /// Keyed by CommKey::str(); fixed after connect, so lookups from
  /// concurrent streams need no lock.
  std::map<std::string, Group> groups;
  /// Keyed by stream; entries are created by connect, and each one is only
  /// touched by the thread of its stream.
  std::map<std::string, std::vector<PendingSend>> pendingSends;
};

Status GlooCommunicator::checkKey(CommKey &key) const {
  std::sort(key.ranks.begin(), key.ranks.end());
  std::string op = "connecting communicator '" + key.str() + "'";
  if (key.ranks.empty())
    return opError(op, "it has no ranks");
  if (std::adjacent_find(key.ranks.begin(), key.ranks.end()) != key.ranks.end())
    return opError(op, "it lists a rank twice");
  if (key.ranks.front() < 0 || key.ranks.back() >= size)
    return opError(op, "it has a rank outside the world of " +
                           std::to_string(size) + " ranks");
  if (!std::binary_search(key.ranks.begin(), key.ranks.end(), myRank))
    return opError(op, "it does not contain this rank");
  return Status::ok();
}

Status GlooCommunicator::connectGroup(Group &group, const std::string &prefix) {
  if (group.key.ranks.size() < 2)
    return Status::ok();
  try {
    auto context = std::make_shared<gloo::rendezvous::Context>(
        group.contextRank(myRank), static_cast<int>(group.key.ranks.size()));
    context->setTimeout(timeout);
    gloo::rendezvous::PrefixStore prefixStore(prefix, *store);
    context->connectFullMesh(prefixStore, device);
    group.context = std::move(context);
  } catch (const std::exception &e) {
    return opError("connecting communicator '" + prefix + "'", describe(e));
  }
  return Status::ok();
}

Status GlooCommunicator::connect(std::vector<CommKey> keys) {
  if (connected)
    return opError("connect", "the communicator is already connected");
  // Validate everything before meeting anyone, so a bad plan fails at once.
  std::map<std::string, CommKey> sortedKeys;
  for (CommKey &key : keys) {
    PIPER_RETURN_IF_ERROR(checkKey(key));
    sortedKeys.emplace(key.str(), std::move(key));
  }
  connected = true;

  world.key.stream = kWorldPrefix;
  for (int r = 0; r < size; ++r)
    world.key.ranks.push_back(r);
  PIPER_RETURN_IF_ERROR(connectGroup(world, kWorldPrefix));

  for (auto &[name, key] : sortedKeys) {
    pendingSends[key.stream];
    Group &group = groups[name];
    group.key = std::move(key);
    PIPER_RETURN_IF_ERROR(connectGroup(group, name));
  }
  return Status::ok();
}

Status GlooCommunicator::findGroup(const CommKey &key, const std::string &op,
                                   Group *&group) {
  auto it = groups.find(key.str());
  if (it == groups.end())
    return opError(op, "no communicator connected for key '" + key.str() + "'");
  group = &it->second;
  if (!group->failure.empty())
    return opError(
        op, "communicator '" + key.str() +
                "' is unusable after an earlier error: " + group->failure);
  return Status::ok();
}

Status GlooCommunicator::pointToPointGroup(const std::string &stream, int peer,
                                           const std::string &op,
                                           Group *&group) {
  if (peer < 0 || peer >= size)
    return opError(op, "the peer is outside the world of " +
                           std::to_string(size) + " ranks");
  if (peer == myRank)
    return opError(op, "the peer is this rank");
  return findGroup(
      CommKey{stream, {std::min(myRank, peer), std::max(myRank, peer)}}, op,
      group);
}

Status GlooCommunicator::fail(Group &group, const std::string &op,
                              const std::exception &e) {
  std::string detail = describe(e);
  if (group.failure.empty()) {
    group.failure = detail;
    try {
      group.context->closeConnections();
    } catch (const std::exception &) {
      // Already closed or broken; nothing more to release.
    }
  }
  return opError(op, detail);
}

Status GlooCommunicator::send(const std::string &stream, const void *data,
                              size_t bytes, int peer, uint32_t tag) {
  std::string op =
      "send to rank " + std::to_string(peer) + " on stream '" + stream + "'";
  Group *group = nullptr;
  PIPER_RETURN_IF_ERROR(pointToPointGroup(stream, peer, op, group));
  try {
    // Gloo only reads from the buffer; the const_cast is for its API.
    auto buffer =
        group->context->createUnboundBuffer(const_cast<void *>(data), bytes);
    buffer->send(group->contextRank(peer), tag);
    pendingSends.find(stream)->second.push_back(
        PendingSend{std::move(buffer), group, peer});
  } catch (const std::exception &e) {
    return fail(*group, op, e);
  }
  return Status::ok();
}

Status GlooCommunicator::recv(const std::string &stream, void *data,
                              size_t bytes, int peer, uint32_t tag) {
  std::string op =
      "recv from rank " + std::to_string(peer) + " on stream '" + stream + "'";
  Group *group = nullptr;
  PIPER_RETURN_IF_ERROR(pointToPointGroup(stream, peer, op, group));
  try {
    auto buffer = group->context->createUnboundBuffer(data, bytes);
    buffer->recv(group->contextRank(peer), tag);
    if (!buffer->waitRecv(timeout))
      return opError(op, "the receive was aborted");
  } catch (const std::exception &e) {
    return fail(*group, op, e);
  }
  return Status::ok();
}

Status GlooCommunicator::waitSends(const std::string &stream) {
  auto it = pendingSends.find(stream);
  if (it == pendingSends.end())
    return Status::ok();
  std::vector<PendingSend> sends = std::move(it->second);
  it->second.clear();
  // Waits for every send, even after a failure, so that no buffer is still
  // in use when this returns; reports the first error.
  Status first;
  for (PendingSend &pending : sends) {
    std::string op = "send to rank " + std::to_string(pending.peer) +
                     " on stream '" + stream + "'";
    Status status;
    if (!pending.group->failure.empty()) {
      status = opError(op, "communicator '" + pending.group->key.str() +
                               "' is unusable after an earlier error: " +
                               pending.group->failure);
    } else {
      try {
        if (!pending.buffer->waitSend(timeout))
          status = opError(op, "the send was aborted");
      } catch (const std::exception &e) {
        status = fail(*pending.group, op, e);
      }
    }
    if (first.isOk() && !status.isOk())
      first = status;
  }
  return first;
}

Status GlooCommunicator::allReduce(Group &group, const std::string &op,
                                   void *data, size_t count, size_t elementSize,
                                   ReduceFn reduce) {
  if (!group.context || count == 0)
    return Status::ok();
  try {
    gloo::AllreduceOptions opts(group.context);
    if (elementSize == sizeof(double))
      opts.setOutput(static_cast<double *>(data), count);
    else
      opts.setOutput(static_cast<float *>(data), count);
    opts.setReduceFunction(reduce);
    opts.setTag(group.nextTag++);
    opts.setTimeout(timeout);
    gloo::allreduce(opts);
  } catch (const std::exception &e) {
    return fail(group, op, e);
  }
  return Status::ok();
}

Status GlooCommunicator::allReduceSum(const std::string &stream,
                                      const std::vector<int> &ranks,
                                      float *data, size_t count) {
  CommKey key{stream, ranks};
  std::sort(key.ranks.begin(), key.ranks.end());
  std::string op = "all-reduce over ranks " + rankList(key.ranks) +
                   " on stream '" + stream + "'";
  Group *group = nullptr;
  PIPER_RETURN_IF_ERROR(findGroup(key, op, group));
  return allReduce(*group, op, data, count, sizeof(float),
                   static_cast<ReduceFn>(&gloo::sum<float>));
}

Status GlooCommunicator::allReduceSumWorld(double *data, size_t count) {
  std::lock_guard<std::mutex> lock(worldMutex);
  std::string op = "world all-reduce over " + std::to_string(size) + " ranks";
  if (!connected)
    return opError(op, "the communicator is not connected");
  if (!world.failure.empty())
    return opError(op, "the world communicator is unusable after an earlier "
                       "error: " +
                           world.failure);
  return allReduce(world, op, data, count, sizeof(double),
                   static_cast<ReduceFn>(&gloo::sum<double>));
}

} // namespace

std::unique_ptr<Communicator>
createGlooCommunicator(int rank, int worldSize, const std::string &storeDir,
                       std::chrono::milliseconds timeout, Status &status,
                       const std::string &hostname) {
  std::string what = "rank " + std::to_string(rank) +
                     ": creating the gloo communicator failed: ";
  if (worldSize < 1 || rank < 0 || rank >= worldSize) {
    status = Status::error(what + "rank outside the world of " +
                           std::to_string(worldSize) + " ranks");
    return nullptr;
  }
  if (timeout <= std::chrono::milliseconds::zero()) {
    // Gloo reads a zero timeout as "wait forever".
    status = Status::error(what + "the timeout must be positive");
    return nullptr;
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(storeDir, ec)) {
    status = Status::error(what + "store directory '" + storeDir +
                           "' does not exist");
    return nullptr;
  }
  ignoreSigpipe();
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto store = std::make_unique<gloo::rendezvous::FileStore>(storeDir);
    status = Status::ok();
    return std::make_unique<GlooCommunicator>(
        rank, worldSize, timeout, std::move(device), std::move(store));
  } catch (const std::exception &e) {
    status = Status::error(what + "host '" + hostname + "': " + describe(e));
    return nullptr;
  }
}

} // namespace piper::runtime
