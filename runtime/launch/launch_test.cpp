// Unit tests of piper-run's pieces that need no process of their own: the
// step and --metrics lines, the rank environment and the BLAS core choice.
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "runtime/launch/BlasCore.h"
#include "runtime/launch/Rendezvous.h"
#include "runtime/launch/Reporting.h"

using namespace piper::runtime;

TEST_CASE("step and metrics lines", "[launch]") {
  StepReport r;
  r.step = 3;
  r.loss = 2.901320343017578;
  r.tokensPerS = 15389.4567;
  r.stepSeconds = 0.0123456789;
  r.lr = 6e-4;
  r.gradNorm = 1.28591234567;
  r.peakBytes = 17356800;
  r.maxRssBytes = 35328000;
  CHECK(stepLine(r) == "step 3 | loss 2.90132034 | 15389 tokens/s");
  CHECK(metricsLine(r) ==
        "{\"step\": 3, \"loss\": 2.901320343017578, \"tokens_per_s\": "
        "15389.457, \"step_time_s\": 0.012346, \"lr\": 0.0006, "
        "\"grad_norm\": 1.28591235, \"peak_bytes\": 17356800, "
        "\"max_rss_bytes\": 35328000}");
  // The loss reads back exactly.
  auto parsed = nlohmann::json::parse(metricsLine(r));
  CHECK(parsed["loss"].get<double>() == r.loss);

  // No clipping (no norm) and a diverged loss are null.
  r.gradNorm = -1;
  r.loss = std::nan("");
  parsed = nlohmann::json::parse(metricsLine(r));
  CHECK(parsed["loss"].is_null());
  CHECK(parsed["grad_norm"].is_null());
  CHECK(stepLine(r) == "step 3 | loss nan | 15389 tokens/s");
}

TEST_CASE("the environment of a spawned rank", "[launch]") {
  std::vector<std::string> env =
      rankEnvironment({"HOME=/root"}, 2, 4, "/tmp/store", 7);
  CHECK(env == std::vector<std::string>{
                   "HOME=/root", "PIPER_RANK=2", "PIPER_WORLD_SIZE=4",
                   "PIPER_STORE_DIR=/tmp/store", "PIPER_FAILURE_FD=7"});

  ::setenv("PIPER_RANK", "1", 1);
  ::setenv("PIPER_WORLD_SIZE", "2", 1);
  ::setenv("PIPER_STORE_DIR", "/tmp/s", 1);
  // A launcher never passes its own protocol variables on.
  for (const std::string &e : inheritedEnvironment(2))
    CHECK(e.rfind("PIPER_RANK=", 0) != 0);
  bool isRank = false;
  RankEnv rank;
  REQUIRE(readRankEnv(0, isRank, rank));
  CHECK(isRank);
  CHECK(rank.rank == 1);
  CHECK(rank.worldSize == 2);
  CHECK(rank.storeDir == "/tmp/s");
  CHECK(readRankEnv(3, isRank, rank).message() ==
        "--nproc is 3 but PIPER_WORLD_SIZE is 2");
  ::setenv("PIPER_RANK", "2", 1);
  CHECK(readRankEnv(0, isRank, rank).message() ==
        "PIPER_RANK 2 is out of range for PIPER_WORLD_SIZE 2");
  ::setenv("PIPER_RANK", "x", 1);
  CHECK(readRankEnv(0, isRank, rank).message() ==
        "PIPER_RANK='x' is not an integer");
  ::unsetenv("PIPER_RANK");
  REQUIRE(readRankEnv(0, isRank, rank));
  CHECK_FALSE(isRank);
  ::unsetenv("PIPER_WORLD_SIZE");
  ::unsetenv("PIPER_STORE_DIR");
}

TEST_CASE("the BLAS core for CPUs OpenBLAS does not recognise", "[launch]") {
  CHECK(fallbackBlasCore("Prescott", true, true) == "SkylakeX");
  CHECK(fallbackBlasCore("Prescott", false, true) == "Haswell");
  CHECK(fallbackBlasCore("Prescott", false, false) == "");
  CHECK(fallbackBlasCore("Cooperlake", true, true) == "");
  CHECK(fallbackBlasCore("Haswell", true, true) == "");
}
