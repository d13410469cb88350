// Gloo (TCP) implementation of the Communicator: one Gloo context per
// (stream, ranks) key plus a world control context, met through a file store.
// Point-to-point operations are Gloo's own asynchronous unbound buffers;
// collectives run in issue order on one worker thread per key.
#include "runtime/comm/GlooCommunicator.h"

#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/attr.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <cctype>
#include <csignal>
#include <filesystem>
#include <utility>

namespace piper::runtime {
namespace gloo_comm {

namespace {

/// Gloo's tcp transport writes with writev(2), so writing to a peer that died
/// raises SIGPIPE, whose default action kills this process before the error
/// can be reported. Ignores it unless the program installed its own handler.
void ignoreSigpipe() {
  struct sigaction current = {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL)
    std::signal(SIGPIPE, SIG_IGN);
}

} // namespace

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

/// A started send or receive: Gloo's unbound buffer completes it.
class PointToPointWork final : public CommWork {
public:
  PointToPointWork(GlooCommunicator &comm, Group &group, std::string op,
                   std::unique_ptr<gloo::transport::UnboundBuffer> buffer,
                   bool isSend)
      : comm(comm), group(group), op(std::move(op)), buffer(std::move(buffer)),
        isSend(isSend) {}
  Status wait() override {
    if (waited)
      return status;
    waited = true;
    std::string failure = group.failureText();
    if (!failure.empty() && isSend) {
      status = comm.unusable(op, group, failure);
      return status;
    }
    try {
      bool ok = isSend ? buffer->waitSend(comm.opTimeout())
                       : buffer->waitRecv(comm.opTimeout());
      if (!ok)
        status = comm.opError(op, std::string("the ") +
                                      (isSend ? "send" : "receive") +
                                      " was aborted");
    } catch (const std::exception &e) {
      status = comm.fail(group, op, e);
    }
    return status;
  }

private:
  GlooCommunicator &comm;
  Group &group;
  std::string op;
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer;
  bool isSend;
  bool waited = false;
  Status status;
};

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
    return opError(fmt::format("connecting communicator '{}'", prefix),
                   describe(e));
  }
  return Status::ok();
}

Status GlooCommunicator::connect(std::vector<CommKey> keys) {
  if (connected)
    return opError("connect", "the communicator is already connected");
  // Validate everything before meeting anyone, so a bad plan fails at once.
  std::map<std::string, CommKey> sortedKeys;
  for (CommKey &key : keys) {
    PIPER_RETURN_IF_ERROR(normalizeCommKey(key, myRank, size));
    sortedKeys.emplace(key.str(), std::move(key));
  }
  connected = true;

  world.key.stream = kWorldPrefix;
  for (int r = 0; r < size; ++r)
    world.key.ranks.push_back(r);
  PIPER_RETURN_IF_ERROR(connectGroup(world, kWorldPrefix));

  for (auto &[name, key] : sortedKeys) {
    auto group = std::make_unique<Group>();
    group->key = std::move(key);
    Group &g = *group;
    groups.emplace(name, std::move(group));
    PIPER_RETURN_IF_ERROR(connectGroup(g, name));
  }
  return Status::ok();
}

Status GlooCommunicator::findGroup(const CommKey &key, const std::string &op,
                                   Group *&group) {
  auto it = groups.find(key.str());
  if (it == groups.end())
    return opError(
        op, fmt::format("no communicator connected for key '{}'", key.str()));
  group = it->second.get();
  std::string failure = group->failureText();
  if (!failure.empty())
    return unusable(op, *group, failure);
  return Status::ok();
}

Status GlooCommunicator::pointToPointGroup(const std::string &stream, int peer,
                                           const std::string &op,
                                           Group *&group) {
  if (peer < 0 || peer >= size)
    return opError(
        op, fmt::format("the peer is outside the world of {} ranks", size));
  if (peer == myRank)
    return opError(op, "the peer is this rank");
  return findGroup(
      CommKey{stream, {std::min(myRank, peer), std::max(myRank, peer)}}, op,
      group);
}

Status GlooCommunicator::fail(Group &group, const std::string &op,
                              const std::exception &e) {
  std::string detail = describe(e);
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(group.mu);
    if (group.failure.empty()) {
      group.failure = detail;
      first = true;
    }
  }
  if (first) {
    try {
      group.context->closeConnections();
    } catch (const std::exception &) {
      // Already closed or broken; nothing more to release.
    }
  }
  return opError(op, detail);
}

CommWorkPtr GlooCommunicator::isend(const std::string &stream, const void *data,
                                    size_t bytes, int peer, uint32_t tag) {
  std::string op = fmt::format("send to rank {} on stream '{}'", peer, stream);
  Group *group = nullptr;
  Status status = pointToPointGroup(stream, peer, op, group);
  if (!status)
    return completedWork(status);
  try {
    // Gloo only reads from the buffer; the const_cast is for its API.
    auto buffer =
        group->context->createUnboundBuffer(const_cast<void *>(data), bytes);
    buffer->send(group->contextRank(peer), tag);
    return std::make_shared<PointToPointWork>(*this, *group, op,
                                              std::move(buffer), true);
  } catch (const std::exception &e) {
    return completedWork(fail(*group, op, e));
  }
}

CommWorkPtr GlooCommunicator::irecv(const std::string &stream, void *data,
                                    size_t bytes, int peer, uint32_t tag) {
  std::string op =
      fmt::format("recv from rank {} on stream '{}'", peer, stream);
  Group *group = nullptr;
  Status status = pointToPointGroup(stream, peer, op, group);
  if (!status)
    return completedWork(status);
  try {
    auto buffer = group->context->createUnboundBuffer(data, bytes);
    buffer->recv(group->contextRank(peer), tag);
    return std::make_shared<PointToPointWork>(*this, *group, op,
                                              std::move(buffer), false);
  } catch (const std::exception &e) {
    return completedWork(fail(*group, op, e));
  }
}

Status GlooCommunicator::collectiveGroup(const CommKey &key,
                                         const std::string &op,
                                         const std::vector<size_t> *counts,
                                         Group *&group) {
  CommKey sorted = key;
  std::sort(sorted.ranks.begin(), sorted.ranks.end());
  PIPER_RETURN_IF_ERROR(findGroup(sorted, op, group));
  if (counts && counts->size() != group->key.ranks.size())
    return opError(op, fmt::format("{} counts for {} ranks", counts->size(),
                                   group->key.ranks.size()));
  return Status::ok();
}

Status GlooCommunicator::allReduceSumWorld(double *data, size_t count) {
  std::lock_guard<std::mutex> lock(worldMutex);
  std::string op = fmt::format("world all-reduce over {} ranks", size);
  if (!connected)
    return opError(op, "the communicator is not connected");
  std::string failure = world.failureText();
  if (!failure.empty())
    return opError(op, "the world communicator is unusable after an earlier "
                       "error: " +
                           failure);
  return runAllReduce(world, op, data, count, sizeof(double),
                      static_cast<ReduceFn>(&gloo::sum<double>));
}

} // namespace gloo_comm

std::unique_ptr<Communicator>
createGlooCommunicator(int rank, int worldSize, const std::string &storeDir,
                       std::chrono::milliseconds timeout, Status &status,
                       const std::string &hostname) {
  std::string what = fmt::format("rank {}", rank) +
                     ": creating the gloo communicator failed: ";
  if (worldSize < 1 || rank < 0 || rank >= worldSize) {
    status = Status::error(
        fmt::format("{}rank outside the world of {} ranks", what, worldSize));
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
  gloo_comm::ignoreSigpipe();
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto store = std::make_unique<gloo::rendezvous::FileStore>(storeDir);
    status = Status::ok();
    return std::make_unique<gloo_comm::GlooCommunicator>(
        rank, worldSize, timeout, std::move(device), std::move(store));
  } catch (const std::exception &e) {
    status = Status::error(what + "host '" + hostname +
                           "': " + gloo_comm::describe(e));
    return nullptr;
  }
}

} // namespace piper::runtime
