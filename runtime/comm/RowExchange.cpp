// The counts protocol of an all-to-all with run-time counts.
#include "runtime/comm/RowExchange.h"

#include <algorithm>

namespace piper::runtime {

Status exchangeRowCounts(Communicator *comm, const CommKey &key, int rank,
                         int64_t inputRows, int64_t outputRows,
                         std::vector<int32_t> sendCounts,
                         std::vector<int32_t> &recvCounts,
                         const std::string &what) {
  const size_t members = key.ranks.size();
  if (sendCounts.size() != members)
    return Status::error(what + ": " + std::to_string(sendCounts.size()) +
                         " send counts for a group of " +
                         std::to_string(members));
  std::string sendError;
  int64_t sendRows = 0;
  for (size_t j = 0; j < members; ++j) {
    if (sendCounts[j] < 0 && sendError.empty())
      sendError = "has a negative send count (" +
                  std::to_string(sendCounts[j]) + ") for rank " +
                  std::to_string(key.ranks[j]);
    sendRows += std::max<int32_t>(0, sendCounts[j]);
  }
  if (sendError.empty() && sendRows > inputRows)
    sendError = "sends " + std::to_string(sendRows) +
                " rows but its input holds " + std::to_string(inputRows);
  if (!sendError.empty())
    std::fill(sendCounts.begin(), sendCounts.end(), -1);

  recvCounts.assign(members, 0);
  if (members < 2) {
    recvCounts = sendCounts;
  } else {
    if (!comm)
      return Status::error(what + ": no communicator for a group of " +
                           std::to_string(members));
    std::vector<size_t> ones(members, 1);
    PIPER_RETURN_IF_ERROR(comm->allToAll(key, sendCounts.data(), ones,
                                         recvCounts.data(), ones,
                                         CommDType::I32)
                              ->wait()
                              .withContext(what + " (counts)"));
  }
  if (!sendError.empty())
    return Status::error(what + ": rank " + std::to_string(rank) + " " +
                         sendError);
  int64_t recvRows = 0;
  for (size_t j = 0; j < members; ++j) {
    if (recvCounts[j] < 0)
      return Status::error(what + ": rank " + std::to_string(key.ranks[j]) +
                           " has invalid send counts (its own error says why)");
    recvRows += recvCounts[j];
  }
  // Every member learns whether any member would overflow its output.
  float overflow = recvRows > outputRows ? 1.0f : 0.0f;
  if (members >= 2)
    PIPER_RETURN_IF_ERROR(comm->allReduce(key, &overflow, 1, CommDType::F32)
                              ->wait()
                              .withContext(what + " (capacity check)"));
  if (recvRows > outputRows)
    return Status::error(what + ": rank " + std::to_string(rank) +
                         " receives " + std::to_string(recvRows) +
                         " rows but its output holds " +
                         std::to_string(outputRows));
  if (overflow > 0)
    return Status::error(what + ": another member receives more rows than its "
                                "output holds (its own error says how many)");
  return Status::ok();
}

} // namespace piper::runtime
