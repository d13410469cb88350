// memberGroup and checkCollectiveGroups: which ranks a rank runs a
// collective with when a data-parallel class is split into subgroups.
#include "proto/PlanGroups.h"

#include <vector>

#include <catch2/catch.hpp>

using namespace piper::plan;

namespace {
int addGroup(Plan &p, std::vector<int> ranks) {
  DeviceGroup *g = p.add_groups();
  g->set_id(p.groups_size() - 1);
  for (int r : ranks)
    g->add_ranks(r);
  return g->id();
}

std::vector<int> ranksOf(const DeviceGroup *g) {
  REQUIRE(g != nullptr);
  return {g->ranks().begin(), g->ranks().end()};
}
} // namespace

TEST_CASE("without subgroups every rank runs with the whole group") {
  Plan p;
  Instruction inst;
  inst.set_group(addGroup(p, {0, 1, 2, 3}));
  CHECK(checkCollectiveGroups(p, inst).empty());
  CHECK(ranksOf(memberGroup(p, inst, 2)) == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("consecutive and strided subgroups pick the rank's own") {
  Plan p;
  Instruction consecutive, strided;
  int whole = addGroup(p, {0, 1, 2, 3});
  consecutive.set_group(whole);
  consecutive.add_subgroups(addGroup(p, {0, 1}));
  consecutive.add_subgroups(addGroup(p, {2, 3}));
  strided.set_group(whole);
  strided.add_subgroups(addGroup(p, {0, 2}));
  strided.add_subgroups(addGroup(p, {1, 3}));
  CHECK(checkCollectiveGroups(p, consecutive).empty());
  CHECK(checkCollectiveGroups(p, strided).empty());
  CHECK(ranksOf(memberGroup(p, consecutive, 1)) == std::vector<int>{0, 1});
  CHECK(ranksOf(memberGroup(p, consecutive, 2)) == std::vector<int>{2, 3});
  CHECK(ranksOf(memberGroup(p, strided, 1)) == std::vector<int>{1, 3});
  CHECK(ranksOf(memberGroup(p, strided, 2)) == std::vector<int>{0, 2});
  CHECK(memberGroup(p, strided, 7) == nullptr);
}

TEST_CASE("bad subgroups are named") {
  Plan p;
  Instruction inst;
  inst.set_group(addGroup(p, {0, 1, 2, 3}));
  auto error = [&](std::vector<std::vector<int>> groups) {
    inst.clear_subgroups();
    for (auto &g : groups)
      inst.add_subgroups(addGroup(p, g));
    return checkCollectiveGroups(p, inst);
  };
  CHECK(error({{0, 1}, {2}}).find("differ in size") != std::string::npos);
  CHECK(error({{0, 1}, {}}).find("is empty") != std::string::npos);
  CHECK(error({{0, 1}, {1, 2}}).find("rank 1 is in two subgroups") !=
        std::string::npos);
  CHECK(error({{0, 1}, {2, 5}}).find("rank 5, which is not in group") !=
        std::string::npos);
  CHECK(error({{0, 1}}).find("do not cover group") != std::string::npos);
  CHECK(error({{1, 0}, {2, 3}}).find("increasing order") != std::string::npos);
  inst.clear_subgroups();
  inst.add_subgroups(99);
  CHECK(checkCollectiveGroups(p, inst).find("subgroup 99 is out of range") !=
        std::string::npos);
  inst.set_group(-1);
  CHECK(checkCollectiveGroups(p, inst).find("group -1 is out of range") !=
        std::string::npos);
}

TEST_CASE("group collectives, collectives and communication nest") {
  for (int k = 0; k <= Instruction::Kind_MAX; ++k) {
    if (!Instruction::Kind_IsValid(k))
      continue;
    auto kind = static_cast<Instruction::Kind>(k);
    INFO(Instruction::Kind_Name(kind));
    bool group = kind == Instruction::ALL_REDUCE ||
                 kind == Instruction::REDUCE_SCATTER ||
                 kind == Instruction::ALL_GATHER ||
                 kind == Instruction::ALL_TO_ALL ||
                 kind == Instruction::REDUCE_SCATTER_GRADS ||
                 kind == Instruction::ALL_GATHER_PARAMS;
    CHECK(isGroupCollective(kind) == group);
    CHECK(isCollective(kind) == (group || kind == Instruction::CLIP_GRADS));
    CHECK(isCommunication(kind) ==
          (isCollective(kind) || kind == Instruction::SEND ||
           kind == Instruction::RECV));
  }
}
