// Unit tests of --standby's launcher side that need no process: which state
// a generation after a failure starts from (planRecovery), and the check
// before any rank starts (checkStandbyState).
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include <catch2/catch.hpp>

#include "runtime/launch/rank/Standby.h"
#include "runtime/launch/supervision/StandbyLauncher.h"

using namespace piper;

using namespace piper::runtime;
namespace fs = std::filesystem;

namespace {

/// A pp2 x dp2 manifest: class 0 = ranks 0, 2; class 1 = ranks 1, 3 (piperc
/// numbers stages first; planRecovery takes any layout).
piper::plan::Manifest pp2dp2() {
  piper::plan::Manifest m;
  m.set_world_size(4);
  for (int c = 0; c < 2; ++c) {
    auto *cls = m.add_classes();
    cls->set_device_class(c);
    cls->add_ranks(c);
    cls->add_ranks(c + 2);
  }
  return m;
}

/// A fresh folder under $TEST_TMPDIR (else /tmp).
std::string freshDir() {
  const char *tmp = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") +
                    "/standby-unit-XXXXXX";
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  return dir;
}

/// What a rank hands off: DIR/rank-R/step-S/ with the marker unless
/// `complete` is false.
void handoff(const std::string &dir, int rank, int step,
             bool complete = true) {
  fs::path d = fs::path(dir) / ("rank-" + std::to_string(rank)) /
               ("step-" + std::to_string(step));
  fs::create_directories(d);
  std::ofstream(d / "model.safetensors") << "m";
  if (complete)
    std::ofstream(d / kHandoffCompleteFile) << step << "\n";
}

} // namespace

TEST_CASE("planRecovery: the newest step every class holds", "[standby]") {
  std::string dir = freshDir();
  std::string handoffs = dir + "/gen-0";
  // Rank 3 failed in step 5. Rank 1 had finished step 5 (its copies: 4, 5);
  // ranks 0 and 2 only step 4 (3, 4). Step 5 of rank 1 is not enough:
  // class 0 does not hold it.
  handoff(handoffs, 0, 3);
  handoff(handoffs, 0, 4);
  handoff(handoffs, 2, 3);
  handoff(handoffs, 2, 4);
  handoff(handoffs, 1, 4);
  handoff(handoffs, 1, 5);
  handoff(handoffs, 3, 6); // the failed rank's, never used
  Recovery r;
  REQUIRE(planRecovery(pp2dp2(), {}, handoffs, {3}, dir + "/recovery-1", r));
  CHECK(r.fromReplicas);
  CHECK(r.step == 4);
  CHECK(r.sourceOf == std::map<int, int>{{0, 0}, {1, 1}, {2, 0}, {3, 1}});
  CHECK(fs::equivalent(dir + "/recovery-1/class-1-member-0",
                       handoffs + "/rank-1/step-4"));
  CHECK(fs::exists(dir + "/recovery-1/class-0-member-0/" +
                   std::string(kHandoffCompleteFile)));
  fs::remove_all(dir);
}

TEST_CASE("planRecovery: incomplete handoffs and lost ranks are left out",
          "[standby]") {
  std::string dir = freshDir();
  std::string handoffs = dir + "/gen-0";
  handoff(handoffs, 0, 2);
  handoff(handoffs, 2, 2);
  handoff(handoffs, 1, 2, /*complete=*/false); // cut off while writing
  handoff(handoffs, 3, 2);
  Recovery r;
  // Rank 3 is lost: class 1 has only rank 1's incomplete copy.
  REQUIRE(planRecovery(pp2dp2(), {}, handoffs, {3}, dir + "/recovery-1", r));
  CHECK_FALSE(r.fromReplicas);
  CHECK(r.why ==
        "no surviving rank of device class 1 (ranks 1, 3) holds its state");
  // Rank 1 lost instead: rank 3's copy serves class 1.
  REQUIRE(planRecovery(pp2dp2(), {}, handoffs, {1}, dir + "/recovery-1", r));
  CHECK(r.fromReplicas);
  CHECK(r.step == 2);
  CHECK(r.sourceOf.at(1) == 3);
  // Nothing handed off at all (a failure before any rank's watchdog ran).
  REQUIRE(
      planRecovery(pp2dp2(), {}, dir + "/none", {0}, dir + "/recovery-2", r));
  CHECK_FALSE(r.fromReplicas);
  CHECK(r.why ==
        "no surviving rank of device class 0 (ranks 0, 2) holds its state");
  fs::remove_all(dir);
}

TEST_CASE("checkStandbyState: a class without a full replica needs "
          "checkpoints",
          "[standby]") {
  piper::plan::Manifest pp2;
  pp2.set_world_size(2);
  for (int c = 0; c < 2; ++c) {
    auto *cls = pp2.add_classes();
    cls->set_device_class(c);
    cls->add_ranks(c);
  }
  std::vector<piper::plan::Plan> plans(2);
  RunOptions options;
  CHECK(checkStandbyState(options, pp2, plans)); // no --standby
  options.standby = 1;
  Status st = checkStandbyState(options, pp2, plans);
  REQUIRE_FALSE(st);
  CHECK(st.message().find("device class 0 is rank 0 alone") !=
        std::string::npos);
  CHECK(checkStandbyState(options, pp2dp2(), plans));
  // ZeRO: replicas hold only their shards.
  plans[1].set_device_class(1);
  plans[1].add_params()->mutable_sharding()->set_optimizer(true);
  CHECK(shardedStateNote(plans) ==
        "device class 1 shards its state over its replicas (ZeRO), so no "
        "rank holds a copy of another's shard");
  st = checkStandbyState(options, pp2dp2(), plans);
  REQUIRE_FALSE(st);
  CHECK(st.message().find("(ZeRO)") != std::string::npos);
  options.checkpointDir = "ckpt";
  CHECK(checkStandbyState(options, pp2, plans));
  CHECK(checkStandbyState(options, pp2dp2(), plans));
}

namespace {

/// One class of `ranks` ranks (tensor parallelism within it).
piper::plan::Manifest oneClass(int ranks) {
  piper::plan::Manifest m;
  m.set_world_size(ranks);
  auto *cls = m.add_classes();
  for (int r = 0; r < ranks; ++r)
    cls->add_ranks(r);
  return m;
}

} // namespace

TEST_CASE("planRecovery: a tensor-parallel member's state from the same "
          "member of another data replica",
          "[standby]") {
  // tp2 x dp2: replica r is member r mod 2, so ranks 0, 2 hold member 0's
  // slices and ranks 1, 3 member 1's.
  std::string dir = freshDir();
  std::string handoffs = dir + "/gen-0";
  for (int r : {0, 1, 2})
    for (int step : {2, 3})
      handoff(handoffs, r, step);
  Recovery r;
  REQUIRE(
      planRecovery(oneClass(4), {2}, handoffs, {3}, dir + "/recovery-1", r));
  CHECK(r.fromReplicas);
  CHECK(r.step == 3);
  CHECK(r.sourceOf == std::map<int, int>{{0, 0}, {1, 1}, {2, 0}, {3, 1}});
  CHECK(fs::equivalent(dir + "/recovery-1/class-0-member-1",
                       handoffs + "/rank-1/step-3"));
  CHECK(fs::equivalent(dir + "/recovery-1/class-0-member-0",
                       handoffs + "/rank-0/step-3"));
  // Both replicas of member 1 lost: member 0's state is no substitute.
  REQUIRE(
      planRecovery(oneClass(4), {2}, handoffs, {1, 3}, dir + "/recovery-2", r));
  CHECK_FALSE(r.fromReplicas);
  CHECK(r.why == "no surviving rank of device class 0's tensor-parallel "
                 "member 1 (ranks 1, 3) holds its state");
  fs::remove_all(dir);
}

TEST_CASE("checkStandbyState: tensor parallelism without data parallelism "
          "needs checkpoints",
          "[standby]") {
  std::vector<piper::plan::Plan> plans(1);
  plans[0].mutable_training()->set_tensor_parallel(2);
  RunOptions options;
  options.standby = 1;
  Status st = checkStandbyState(options, oneClass(2), plans);
  REQUIRE_FALSE(st);
  CHECK(st.message() ==
        "--standby needs --checkpoint-dir (with --checkpoint-every) for this "
        "strategy: device class 0's tensor-parallel member 0 is rank 0 alone "
        "(tensor parallelism without data parallelism), so when it fails no "
        "data-parallel replica holds its slices; only a checkpoint does");
  CHECK(checkStandbyState(options, oneClass(4), plans)); // tp2 x dp2
  options.checkpointDir = "ckpt";
  CHECK(checkStandbyState(options, oneClass(2), plans));
}
