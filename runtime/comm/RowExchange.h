// The counts protocol of an all-to-all whose per-peer row counts are decided
// at run time (MoE token routing): every member learns how many rows it
// receives from each member, and every member fails together, with a clear
// error, when any member's counts are invalid or overflow its buffers.
#ifndef PIPER_RUNTIME_COMM_ROWEXCHANGE_H
#define PIPER_RUNTIME_COMM_ROWEXCHANGE_H

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/comm/Communicator.h"

namespace piper::runtime {

/// Exchanges the row counts of an all-to-all over `key` (this rank is
/// `rank`): `sendCounts[i]` rows go to member i (members in key order); on
/// success `recvCounts[i]` is the number of rows member i sends here. This
/// rank sends from `inputRows` rows and receives into `outputRows` rows.
/// Negative counts or more rows than `inputRows` are this rank's error; it
/// is announced to every member through the exchange (as -1 counts). More
/// rows than `outputRows` to receive is found by the receiver and agreed on
/// by a one-float all-reduce, so every member returns an error and none
/// waits for data that never comes. `what` prefixes the messages. A group
/// of one needs no communicator (`comm` may be null).
Status exchangeRowCounts(Communicator *comm, const CommKey &key, int rank,
                         int64_t inputRows, int64_t outputRows,
                         std::vector<int32_t> sendCounts,
                         std::vector<int32_t> &recvCounts,
                         const std::string &what);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_COMM_ROWEXCHANGE_H
