#include "proto/PlanShards.h"

#include <algorithm>

namespace piper::plan {

ShardRange shardRange(int64_t elements, int64_t members, int64_t index) {
  members = std::max<int64_t>(1, members);
  int64_t base = elements / members, extra = elements % members;
  ShardRange r;
  r.count = base + (index < extra ? 1 : 0);
  r.start = index * base + std::min(index, extra);
  return r;
}

int64_t shardCapacity(int64_t elements, int64_t members) {
  members = std::max<int64_t>(1, members);
  return (elements + members - 1) / members;
}

int64_t paramElements(const Parameter &param) {
  int64_t n = 1;
  for (int64_t d : param.type().shape())
    n *= d;
  return n;
}

bool stateSharded(const Parameter &param, int kind) {
  if (!param.has_sharding())
    return false;
  const ParamSharding &s = param.sharding();
  switch (kind) {
  case 0:
    return s.parameter();
  case 1:
    return s.gradient();
  case 2:
  case 3:
    return s.optimizer();
  default:
    return false;
  }
}

int64_t shardMembers(const Plan &plan, const Parameter &param) {
  if (!param.has_sharding())
    return 1;
  int g = param.sharding().group();
  if (g < 0 || g >= plan.groups_size())
    return 1;
  return std::max(1, plan.groups(g).ranks_size());
}

int64_t stateElements(const Plan &plan, const Parameter &param, int kind) {
  // ZeRO-3 keeps no bf16 compute copy: kernels read gathered parameters.
  if (kind == 4 && stateSharded(param, 0))
    return 0;
  int64_t n = paramElements(param);
  return stateSharded(param, kind) ? shardCapacity(n, shardMembers(plan, param))
                                   : n;
}

std::string checkSharding(const Plan &plan) {
  for (const Parameter &p : plan.params()) {
    if (!p.has_sharding())
      continue;
    const ParamSharding &s = p.sharding();
    std::string who = "parameter '" + p.name() + "': sharding ";
    if (s.group() < 0 || s.group() >= plan.groups_size())
      return who + "group " + std::to_string(s.group()) +
             " is out of range (the plan has " +
             std::to_string(plan.groups_size()) + " groups)";
    const DeviceGroup &g = plan.groups(s.group());
    if (!std::equal(g.ranks().begin(), g.ranks().end(), plan.ranks().begin(),
                    plan.ranks().end()))
      return who + "group " + std::to_string(s.group()) +
             " is not the plan's ranks (a shard group is the data-parallel "
             "replicas of the class, in order)";
    if (!std::is_sorted(g.ranks().begin(), g.ranks().end()) ||
        std::adjacent_find(g.ranks().begin(), g.ranks().end()) !=
            g.ranks().end())
      return who + "group " + std::to_string(s.group()) +
             " does not list its ranks in increasing order";
    if (!s.optimizer())
      return who + "shards nothing, or not the optimizer state (ZeRO shards "
                   "the AdamW moments first)";
    if (s.parameter() && !s.gradient())
      return who + "shards the value but not the gradient";
  }
  return "";
}

} // namespace piper::plan
