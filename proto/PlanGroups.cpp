#include "proto/PlanGroups.h"

#include <algorithm>
#include <set>

namespace piper::plan {

namespace {
bool validId(const Plan &plan, int id) {
  return id >= 0 && id < plan.groups_size();
}
} // namespace

std::string checkCollectiveGroups(const Plan &plan, const Instruction &inst) {
  if (!validId(plan, inst.group()))
    return "group " + std::to_string(inst.group()) +
           " is out of range (the plan has " +
           std::to_string(plan.groups_size()) + " groups)";
  if (inst.subgroups_size() == 0)
    return "";
  const DeviceGroup &whole = plan.groups(inst.group());
  std::set<int> all(whole.ranks().begin(), whole.ranks().end());
  std::set<int> covered;
  int size = -1;
  for (int id : inst.subgroups()) {
    if (!validId(plan, id))
      return "subgroup " + std::to_string(id) + " is out of range (the plan "
             "has " + std::to_string(plan.groups_size()) + " groups)";
    const DeviceGroup &g = plan.groups(id);
    if (g.ranks_size() == 0)
      return "subgroup " + std::to_string(id) + " is empty";
    if (size < 0)
      size = g.ranks_size();
    if (g.ranks_size() != size)
      return "subgroups " + std::to_string(inst.subgroups(0)) + " and " +
             std::to_string(id) + " differ in size (" + std::to_string(size) +
             " vs " + std::to_string(g.ranks_size()) + " ranks)";
    if (!std::is_sorted(g.ranks().begin(), g.ranks().end()) ||
        std::adjacent_find(g.ranks().begin(), g.ranks().end()) !=
            g.ranks().end())
      return "subgroup " + std::to_string(id) +
             " does not list its ranks in increasing order";
    for (int r : g.ranks()) {
      if (!all.count(r))
        return "subgroup " + std::to_string(id) + " has rank " +
               std::to_string(r) + ", which is not in group " +
               std::to_string(inst.group());
      if (!covered.insert(r).second)
        return "rank " + std::to_string(r) + " is in two subgroups";
    }
  }
  if (covered.size() != all.size())
    return "the subgroups do not cover group " + std::to_string(inst.group());
  return "";
}

const DeviceGroup *memberGroup(const Plan &plan, const Instruction &inst,
                               int rank) {
  if (inst.subgroups_size() == 0)
    return validId(plan, inst.group()) ? &plan.groups(inst.group()) : nullptr;
  for (int id : inst.subgroups()) {
    if (!validId(plan, id))
      return nullptr;
    const DeviceGroup &g = plan.groups(id);
    if (std::find(g.ranks().begin(), g.ranks().end(), rank) != g.ranks().end())
      return &g;
  }
  return nullptr;
}

bool isGroupCollective(Instruction::Kind kind) {
  switch (kind) {
  case Instruction::ALL_REDUCE:
  case Instruction::REDUCE_SCATTER:
  case Instruction::ALL_GATHER:
  case Instruction::ALL_TO_ALL:
  case Instruction::REDUCE_SCATTER_GRADS:
  case Instruction::ALL_GATHER_PARAMS:
    return true;
  default:
    return false;
  }
}

bool isCollective(Instruction::Kind kind) {
  return isGroupCollective(kind) || kind == Instruction::CLIP_GRADS;
}

bool isCommunication(Instruction::Kind kind) {
  return isCollective(kind) || kind == Instruction::SEND ||
         kind == Instruction::RECV;
}

} // namespace piper::plan
