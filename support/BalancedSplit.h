// The balanced split of n items over m members, in order: member i holds
// n / m items, plus one when i < n % m. ZeRO shards of parameter state
// (PlanShards.h) and the per-member counts of a reduce-scatter or
// all-gather (the dialect's balancedSlices, written into plans by the
// lowering) both follow it. Header only and free of protobuf and MLIR, so
// the dialect and the runtime can share it.
#ifndef PIPER_SUPPORT_BALANCEDSPLIT_H
#define PIPER_SUPPORT_BALANCEDSPLIT_H

#include <algorithm>
#include <cstdint>

namespace piper {

/// The consecutive elements [start, start + count) of a flattened tensor of
/// `elements` that member `index` of `members` holds: elements / members,
/// plus one for the first elements % members members (`members` below 1
/// counts as 1).
struct ShardRange {
  int64_t start = 0;
  int64_t count = 0;
};

inline ShardRange shardRange(int64_t elements, int64_t members,
                             int64_t index) {
  members = std::max<int64_t>(1, members);
  int64_t base = elements / members, extra = elements % members;
  ShardRange r;
  r.count = base + (index < extra ? 1 : 0);
  r.start = index * base + std::min(index, extra);
  return r;
}

/// Elements of the largest range (a shard buffer, a slice buffer):
/// ceil(elements / members).
inline int64_t shardCapacity(int64_t elements, int64_t members) {
  members = std::max<int64_t>(1, members);
  return (elements + members - 1) / members;
}

} // namespace piper

#endif // PIPER_SUPPORT_BALANCEDSPLIT_H
