#include "proto/PlanShards.h"

#include <algorithm>

namespace piper::plan {

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

int64_t expertMembers(const Parameter &param) {
  return std::max<int64_t>(1, param.expert_members());
}

std::vector<int64_t> globalShape(const Parameter &param) {
  std::vector<int64_t> shape(param.type().shape().begin(),
                             param.type().shape().end());
  if (!shape.empty())
    shape[0] *= expertMembers(param);
  return shape;
}

int64_t expertStart(const Parameter &param, int64_t replica) {
  return (replica % expertMembers(param)) * paramElements(param);
}

std::vector<int> expertGroup(const Plan &plan, const Parameter &param,
                             int64_t replica) {
  int64_t m = expertMembers(param), first = replica / m * m;
  std::vector<int> ranks;
  for (int64_t r = first; r < first + m && r < plan.ranks_size(); ++r)
    ranks.push_back(plan.ranks(static_cast<int>(r)));
  return ranks;
}

std::string checkSharding(const Plan &plan) {
  for (const Parameter &p : plan.params()) {
    if (p.expert_members() < 0 || p.expert_members() > 1) {
      std::string who = "parameter '" + p.name() + "': ";
      if (p.expert_members() < 0)
        return who + "negative expert_members";
      if (plan.ranks_size() % p.expert_members() != 0)
        return who + "expert_members " + std::to_string(p.expert_members()) +
               " does not divide the plan's " +
               std::to_string(plan.ranks_size()) + " replicas";
      if (p.type().shape_size() == 0)
        return who + "an expert parameter needs a first dimension";
      if (p.has_sharding())
        return who + "an expert parameter cannot also be ZeRO-sharded";
      if (!std::is_sorted(plan.ranks().begin(), plan.ranks().end()))
        return who + "expert-parallel groups need the plan's ranks in "
                     "increasing order";
    }
  }
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
