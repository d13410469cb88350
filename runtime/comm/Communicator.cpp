// The backend-independent part of the Communicator: keys, element types,
// completed works and the blocking conveniences over the asynchronous API.
#include "runtime/comm/Communicator.h"

#include <algorithm>

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

Status normalizeCommKey(CommKey &key, int rank, int worldSize) {
  std::sort(key.ranks.begin(), key.ranks.end());
  auto fail = [&](const std::string &detail) {
    return Status::error("rank " + std::to_string(rank) +
                         ": connecting communicator '" + key.str() +
                         "' failed: " + detail);
  };
  if (key.ranks.empty())
    return fail("it has no ranks");
  if (std::adjacent_find(key.ranks.begin(), key.ranks.end()) != key.ranks.end())
    return fail("it lists a rank twice");
  if (key.ranks.front() < 0 || key.ranks.back() >= worldSize)
    return fail("it has a rank outside the world of " +
                std::to_string(worldSize) + " ranks");
  if (!std::binary_search(key.ranks.begin(), key.ranks.end(), rank))
    return fail("it does not contain this rank");
  return Status::ok();
}

size_t commDTypeSize(CommDType type) {
  switch (type) {
  case CommDType::BF16:
    return 2;
  case CommDType::F64:
    return 8;
  case CommDType::F32:
  case CommDType::I32:
    break;
  }
  return 4;
}

const char *commDTypeName(CommDType type) {
  switch (type) {
  case CommDType::F32:
    return "f32";
  case CommDType::BF16:
    return "bf16";
  case CommDType::I32:
    return "i32";
  case CommDType::F64:
    return "f64";
  }
  return "?";
}

namespace {

class CompletedWork final : public CommWork {
public:
  explicit CompletedWork(Status status) : status(std::move(status)) {}
  Status wait() override { return status; }

private:
  Status status;
};

} // namespace

CommWorkPtr completedWork(Status status) {
  return std::make_shared<CompletedWork>(std::move(status));
}

Status Communicator::send(const std::string &stream, const void *data,
                          size_t bytes, int peer, uint32_t tag) {
  CommWorkPtr work = isend(stream, data, bytes, peer, tag);
  // An error found at issue time is reported now.
  if (auto *done = dynamic_cast<CompletedWork *>(work.get()))
    return done->wait();
  std::vector<CommWorkPtr> *list;
  {
    std::lock_guard<std::mutex> lock(pendingMu);
    list = &pendingSends[stream]; // std::map: the address stays valid
  }
  list->push_back(std::move(work));
  return Status::ok();
}

Status Communicator::recv(const std::string &stream, void *data, size_t bytes,
                          int peer, uint32_t tag) {
  return irecv(stream, data, bytes, peer, tag)->wait();
}

Status Communicator::waitSends(const std::string &stream) {
  std::vector<CommWorkPtr> sends;
  {
    std::lock_guard<std::mutex> lock(pendingMu);
    auto it = pendingSends.find(stream);
    if (it == pendingSends.end())
      return Status::ok();
    sends.swap(it->second);
  }
  Status first;
  for (const CommWorkPtr &work : sends) {
    Status status = work->wait();
    if (first.isOk() && !status.isOk())
      first = status;
  }
  return first;
}

Status Communicator::allReduceSum(const std::string &stream,
                                  const std::vector<int> &ranks, float *data,
                                  size_t count) {
  CommKey key{stream, ranks};
  std::sort(key.ranks.begin(), key.ranks.end());
  return allReduce(key, data, count, CommDType::F32)->wait();
}

} // namespace piper::runtime
