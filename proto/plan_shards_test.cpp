#include "proto/PlanShards.h"

#include <algorithm>

#include <catch2/catch.hpp>

using namespace piper::plan;

TEST_CASE("shard ranges are balanced, consecutive and cover the tensor") {
  for (int64_t n : {0, 1, 5, 16, 17, 1000, 1003})
    for (int64_t g : {1, 2, 3, 4, 7, 8}) {
      int64_t next = 0, most = 0, least = n;
      for (int64_t i = 0; i < g; ++i) {
        ShardRange r = shardRange(n, g, i);
        CHECK(r.start == next);
        next += r.count;
        most = std::max(most, r.count);
        least = std::min(least, r.count);
      }
      CHECK(next == n);
      CHECK(most - least <= 1);
      CHECK(shardCapacity(n, g) == most);
    }
  CHECK(shardRange(10, 4, 0).count == 3);
  CHECK(shardRange(10, 4, 2).start == 6);
  CHECK(shardRange(10, 4, 3).count == 2);
}

TEST_CASE("state pieces are sharded as the ZeRO stage says") {
  Plan plan;
  plan.add_ranks(4);
  plan.add_ranks(5);
  plan.add_ranks(6);
  DeviceGroup *g = plan.add_groups();
  g->set_id(0);
  for (int r : {4, 5, 6})
    g->add_ranks(r);
  Parameter *p = plan.add_params();
  p->set_name("w");
  p->mutable_type()->add_shape(10);
  p->mutable_type()->add_shape(3);
  CHECK(stateElements(plan, *p, 2) == 30);
  CHECK(checkSharding(plan).empty());
  p->mutable_sharding()->set_optimizer(true);
  CHECK(checkSharding(plan).empty());
  CHECK(stateElements(plan, *p, 0) == 30);
  CHECK(stateElements(plan, *p, 1) == 30);
  CHECK(stateElements(plan, *p, 2) == 10);
  p->mutable_sharding()->set_parameter(true);
  CHECK(checkSharding(plan).find("value but not the gradient") !=
        std::string::npos);
  p->mutable_sharding()->set_gradient(true);
  CHECK(checkSharding(plan).empty());
  CHECK(stateElements(plan, *p, 0) == 10);
  CHECK(stateElements(plan, *p, 4) == 0); // ZeRO-3: no bf16 compute copy
  p->mutable_sharding()->set_group(3);
  CHECK(checkSharding(plan).find("out of range") != std::string::npos);
  DeviceGroup *h = plan.add_groups();
  h->set_id(1);
  h->add_ranks(4);
  h->add_ranks(5);
  p->mutable_sharding()->set_group(1);
  CHECK(checkSharding(plan).find("not the plan's ranks") != std::string::npos);
  p->mutable_sharding()->set_group(0);
  p->mutable_sharding()->set_optimizer(false);
  CHECK(checkSharding(plan).find("not the optimizer state") !=
        std::string::npos);
}

TEST_CASE("expert blocks: global shape, start and group, and their checks") {
  Plan plan;
  for (int r : {2, 3, 4, 5})
    plan.add_ranks(r);
  Parameter *p = plan.add_params();
  p->set_name("experts.w");
  p->mutable_type()->add_shape(2); // 2 of 4 experts
  p->mutable_type()->add_shape(3);
  p->set_expert_members(2);
  CHECK(expertMembers(*p) == 2);
  CHECK(globalShape(*p) == std::vector<int64_t>{4, 3});
  CHECK(sliceMember(plan, *p, 0) == 0);
  CHECK(sliceMember(plan, *p, 1) == 1);
  CHECK(sliceMember(plan, *p, 2) == 0);
  CHECK(sliceGroup(plan, *p, 3) == std::vector<int>{4, 5});
  CHECK(sliceRuns(*p, 1) == std::vector<SliceRun>{{6, 0, 6}});
  // Under tensor parallelism of 2 the 4 ranks are 2 data replicas of 2
  // members: the expert group of member 1 is data replicas 0 and 1, ranks
  // 3 and 5 (replicas 1 and 3).
  plan.mutable_training()->set_tensor_parallel(2);
  CHECK(checkSharding(plan).find("does not divide the plan's 2 data "
                                 "replicas") == std::string::npos);
  CHECK(sliceMember(plan, *p, 3) == 1);
  CHECK(sliceMember(plan, *p, 1) == 0);
  CHECK(sliceGroup(plan, *p, 3) == std::vector<int>{3, 5});
  CHECK(sliceGroup(plan, *p, 0) == std::vector<int>{2, 4});
  plan.mutable_training()->clear_tensor_parallel();
  CHECK(checkSharding(plan).empty());
  p->set_expert_members(3);
  CHECK(checkSharding(plan).find("does not divide the plan's 4 data replicas") !=
        std::string::npos);
  p->set_expert_members(2);
  p->mutable_sharding()->set_optimizer(true);
  CHECK(checkSharding(plan).find("cannot also be ZeRO-sharded") !=
        std::string::npos);
  p->clear_sharding();
  plan.set_ranks(0, 9);
  CHECK(checkSharding(plan).find("increasing order") != std::string::npos);
}

TEST_CASE("tensor-parallel slices: runs of fused parts, global shape, checks") {
  Plan plan;
  for (int r : {0, 1, 2, 3})
    plan.add_ranks(r);
  plan.mutable_training()->set_tensor_parallel(2);
  plan.mutable_training()->set_num_replicas(2);
  CHECK(tensorParallel(plan) == 2);
  CHECK(dataReplica(plan, 3) == 1);
  // A fused [2, 4 | 2 | 2] weight (q, k, v columns) split over 2 members:
  // member 1 holds q columns 2..3, k column 5 and v column 7.
  Parameter *p = plan.add_params();
  p->set_name("wqkv");
  p->mutable_type()->add_shape(2);
  p->mutable_type()->add_shape(4);
  TensorSlice *ts = p->mutable_tensor_slice();
  ts->set_dim(1);
  ts->set_members(2);
  for (int64_t part : {4, 2, 2})
    ts->add_parts(part);
  CHECK(globalShape(*p) == std::vector<int64_t>{2, 8});
  CHECK(sliceMembers(*p) == 2);
  CHECK(sliceGroup(plan, *p, 2) == std::vector<int>{2, 3});
  // Row 0: global columns 2,3 | 5 | 7; row 1 the same plus 8.
  CHECK(sliceRuns(*p, 1) == std::vector<SliceRun>{{2, 0, 2},
                                                  {5, 2, 1},
                                                  {7, 3, 1},
                                                  {10, 4, 2},
                                                  {13, 6, 1},
                                                  {15, 7, 1}});
  // Member 0 of replica 2: columns 0,1 | 4 | 6, merged where adjacent.
  CHECK(sliceRuns(*p, 2).front() == SliceRun{0, 0, 2});
  // Every global element exactly once over the members.
  std::vector<int> seen(16, 0);
  for (int m = 0; m < 2; ++m)
    for (const SliceRun &r : sliceRuns(*p, m))
      for (int64_t i = 0; i < r.count; ++i)
        ++seen[r.global + i];
  CHECK(std::count(seen.begin(), seen.end(), 1) == 16);
  CHECK(checkSharding(plan).empty());
  // A row slice (dim 0, one part) is one contiguous run per member.
  Parameter *w = plan.add_params();
  w->set_name("wo");
  w->mutable_type()->add_shape(3);
  w->mutable_type()->add_shape(5);
  w->mutable_tensor_slice()->set_dim(0);
  w->mutable_tensor_slice()->set_members(2);
  CHECK(sliceRuns(*w, 1) == std::vector<SliceRun>{{15, 0, 15}});
  CHECK(globalShape(*w) == std::vector<int64_t>{6, 5});

  ts->set_members(4);
  CHECK(checkSharding(plan).find("tensor_parallel is 2") != std::string::npos);
  ts->set_members(2);
  ts->set_parts(0, 3);
  CHECK(checkSharding(plan).find("not a positive multiple") !=
        std::string::npos);
  ts->set_parts(0, 6);
  CHECK(checkSharding(plan).find("parts sum to 10") != std::string::npos);
  ts->set_parts(0, 4);
  ts->set_dim(2);
  CHECK(checkSharding(plan).find("not a dimension") != std::string::npos);
  ts->set_dim(1);
  p->set_expert_members(2);
  CHECK(checkSharding(plan).find("cannot be combined") != std::string::npos);
}

TEST_CASE("ZeRO under tensor parallelism: each member's data replicas") {
  // 6 ranks = 3 data replicas x 2 members; a [2, 4 | 2 | 2] fused slice
  // (8 local elements) sharded over the 3 replicas of each member.
  Plan plan;
  for (int r : {0, 1, 2, 3, 4, 5})
    plan.add_ranks(r);
  plan.mutable_training()->set_tensor_parallel(2);
  plan.mutable_training()->set_num_replicas(3);
  DeviceGroup *g = plan.add_groups();
  for (int r : {0, 1, 2, 3, 4, 5})
    g->add_ranks(r);
  Parameter *p = plan.add_params();
  p->set_name("wqkv");
  p->mutable_type()->add_shape(2);
  p->mutable_type()->add_shape(4);
  TensorSlice *ts = p->mutable_tensor_slice();
  ts->set_dim(1);
  ts->set_members(2);
  for (int64_t part : {4, 2, 2})
    ts->add_parts(part);
  p->mutable_sharding()->set_optimizer(true);
  p->mutable_sharding()->set_gradient(true);
  p->mutable_sharding()->set_parameter(true);
  CHECK(checkSharding(plan).empty());
  CHECK(shardMembers(plan, *p) == 3);
  CHECK(stateElements(plan, *p, 0) == 3); // ceil(8 / 3)
  CHECK(shardMember(plan, *p, 5) == 2);
  CHECK(shardGroup(plan, *p, 3) == std::vector<int>{1, 3, 5});
  CHECK(shardGroup(plan, *p, 4) == std::vector<int>{0, 2, 4});
  // Member 1's slice is runs {2,0,2} {5,2,1} {7,3,1} {10,4,2} {13,6,1}
  // {15,7,1}; data replica 1 holds local elements 3..5.
  ShardRange r = shardRange(8, 3, 1);
  CHECK(r.start == 3);
  CHECK(r.count == 3);
  CHECK(rangeRuns(*p, 1, r.start, r.count) ==
        std::vector<SliceRun>{{7, 0, 1}, {10, 1, 2}});
  // The ranges of every member's replicas cover every element once.
  std::vector<int> seen(16, 0);
  for (int m = 0; m < 2; ++m)
    for (int d = 0; d < 3; ++d) {
      ShardRange s = shardRange(8, 3, d);
      for (const SliceRun &run : rangeRuns(*p, m, s.start, s.count))
        for (int64_t i = 0; i < run.count; ++i)
          ++seen[run.global + i];
    }
  CHECK(std::count(seen.begin(), seen.end(), 1) == 16);
  // A whole tensor's range is one run.
  Parameter *w = plan.add_params();
  w->set_name("norm");
  w->mutable_type()->add_shape(7);
  CHECK(rangeRuns(*w, 1, 3, 3) == std::vector<SliceRun>{{3, 0, 3}});
  // The shard group must be whole tensor-parallel groups.
  g->add_ranks(6);
  plan.add_ranks(6);
  CHECK(checkSharding(plan).find("not whole tensor-parallel groups of 2") !=
        std::string::npos);
}

TEST_CASE("context parallelism: members, batch replicas, positions") {
  Plan plan;
  for (int r = 0; r < 8; ++r)
    plan.add_ranks(r);
  // 8 ranks = TP2 x CP2 x DP2 (tp innermost): replica r is tensor member
  // r % 2, context member (r / 2) % 2, batch replica r / 4.
  plan.mutable_training()->set_tensor_parallel(2);
  plan.mutable_training()->set_num_replicas(4);
  plan.mutable_training()->set_num_microbatches(3);
  CHECK(contextParallel(plan) == 1);
  CHECK(globalMicrobatches(plan.training()) == 12);
  plan.mutable_training()->set_context_parallel(2);
  CHECK(contextParallel(plan) == 2);
  CHECK(globalMicrobatches(plan.training()) == 6);
  const int64_t member[8] = {0, 0, 1, 1, 0, 0, 1, 1};
  const int64_t batch[8] = {0, 0, 0, 0, 1, 1, 1, 1};
  for (int r = 0; r < 8; ++r) {
    CHECK(contextMember(plan, r) == member[r]);
    CHECK(batchReplica(plan, r) == batch[r]);
    CHECK(dataReplica(plan, r) == r / 2);
  }
  // S = 8 over 2 members: chunks of 2; member 0 holds chunks 0 and 3,
  // member 1 chunks 1 and 2.
  const int64_t want[2][4] = {{0, 1, 6, 7}, {2, 3, 4, 5}};
  for (int m = 0; m < 2; ++m)
    for (int t = 0; t < 4; ++t)
      CHECK(contextPosition(8, 2, m, t) == want[m][t]);
  CHECK(contextPosition(8, 1, 0, 5) == 5);
  // Every position once over the members, for several sizes.
  for (int64_t n : {2, 3, 4, 8})
    for (int64_t s : {2 * n, 6 * n}) {
      std::vector<int> seen(s, 0);
      for (int64_t m = 0; m < n; ++m)
        for (int64_t t = 0; t < s / n; ++t)
          ++seen[contextPosition(s, n, m, t)];
      CHECK(std::count(seen.begin(), seen.end(), 1) == s);
    }
}
