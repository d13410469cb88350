// Unit tests of strategy parsing and the schedule builders.
#include <catch2/catch.hpp>

#include "compiler/strategy/Strategy.h"

using namespace mlir::piper;

namespace {
/// Renders one order directive as "F0 F1 B0 ..." (single-filter groups).
std::string render(const Directive &d) {
  std::string out;
  for (const auto &group : d.groups) {
    REQUIRE(group.size() == 1);
    const Filter &f = group.front();
    out += (out.empty() ? "" : " ") + f.entries.at("PASS").pass +
           std::to_string(f.entries.at("MB").index);
  }
  return out;
}

std::string parseError(const std::string &json) {
  llvm::Expected<Strategy> s = parseStrategy(json);
  if (s)
    return "";
  return llvm::toString(s.takeError());
}
} // namespace

TEST_CASE("1f1b warms up with (stages - 1 - stage) forwards") {
  std::vector<Directive> order = buildSchedule(*findSchedule("1f1b"), 4, 6);
  REQUIRE(order.size() == 4);
  CHECK(render(order[0]) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  CHECK(render(order[1]) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  CHECK(render(order[2]) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  CHECK(render(order[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  for (int s = 0; s < 4; ++s)
    CHECK(order[s].groups.front().front().entries.at("PP").index == s);
}

TEST_CASE("1f1b with fewer microbatches than stages still runs every pass") {
  std::vector<Directive> order = buildSchedule(*findSchedule("1f1b"), 4, 2);
  CHECK(render(order[0]) == "F0 F1 B0 B1");
  CHECK(render(order[3]) == "F0 B0 F1 B1");
}

TEST_CASE("gpipe runs every forward, then every backward") {
  std::vector<Directive> order = buildSchedule(*findSchedule("gpipe"), 2, 3);
  CHECK(render(order[0]) == "F0 F1 F2 B0 B1 B2");
  CHECK(render(order[1]) == "F0 F1 F2 B0 B1 B2");
}

TEST_CASE("flags become stage, split, place, replicate and order directives") {
  Strategy s = strategyFromFlags(2, 2, 4, *findSchedule("1f1b"));
  REQUIRE(s.worldSize == 4);
  int places = 0, replicates = 0, orders = 0;
  for (const Directive &d : s.directives) {
    if (d.kind == Directive::Place) {
      int64_t pp = d.filter.entries.at("PP").index;
      CHECK(d.devices == std::vector<int64_t>{2 * pp, 2 * pp + 1});
      ++places;
    }
    replicates += d.kind == Directive::Replicate;
    orders += d.kind == Directive::Order;
  }
  CHECK(places == 2);
  CHECK(replicates == 2);
  CHECK(orders == 2);
}

TEST_CASE("the original Piper JSON form parses") {
  llvm::Expected<Strategy> s = parseStrategy(R"([
    {"op": "place", "filter": {"PP": 0}, "devices": [0, 1]},
    {"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1],
     "reduce_stream": "dp_stream", "bucket_size": 10},
    {"op": "split", "filter": {}, "dim_name": "MB", "num_microbatches": 2},
    {"op": "order", "filters": [[{"PP": 0, "MB": 0, "PASS": "F"}],
                                [{"PP": 0, "MB": "*", "PASS": "B"}]]}])");
  REQUIRE(bool(s));
  REQUIRE(s->directives.size() == 4);
  CHECK(s->directives[1].bucketSizeMb == 10);
  CHECK(s->directives[2].numMicrobatches == 2);
  CHECK(s->directives[3].groups[1][0].entries.at("MB").kind ==
        FilterValue::Any);
  CHECK_FALSE(s->worldSize);
}

TEST_CASE("ZeRO: the original Piper's booleans, the stage key and --zero") {
  llvm::Expected<Strategy> s = parseStrategy(R"([
    {"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1]},
    {"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1], "zero": 1},
    {"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1],
     "shard_grads": true, "gather_stream": "g"},
    {"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1],
     "shard_grads": true, "shard_params": true},
    {"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1],
     "shard_params": true, "zero": 3}])");
  REQUIRE(bool(s));
  CHECK(s->directives[0].zero == 0);
  CHECK(s->directives[1].zero == 1);
  CHECK(s->directives[2].zero == 2);
  CHECK(s->directives[2].gatherStream == "g");
  CHECK(s->directives[1].gatherStream == "dp_stream");
  CHECK(s->directives[3].zero == 3);
  CHECK(s->directives[4].zero == 3);
  Strategy flags = strategyFromFlags(2, 2, 4, *findSchedule("1f1b"), 2);
  for (const Directive &d : flags.directives)
    if (d.kind == Directive::Replicate)
      CHECK(d.zero == 2);
  CHECK(flags.summary.find("zero=2") != std::string::npos);
}

TEST_CASE("bad strategies name the directive and the problem") {
  CHECK(parseError(R"([{"op": "teleport"}])").find(
            "directive #0") != std::string::npos);
  CHECK(parseError(R"([{"op": "teleport"}])").find(
            "unknown directive \"teleport\"") != std::string::npos);
  CHECK(parseError(R"([{"op": "place", "filter": {"LAYER": 0}, "devices": [0]}])")
            .find("unknown filter key \"LAYER\"") != std::string::npos);
  CHECK(parseError(R"([{"op": "place", "filter": {"PP": 0}, "devices": [0], "colour": 1}])")
            .find("unknown key \"colour\" for place") != std::string::npos);
  CHECK(parseError(R"([{"op": "place", "filter": {"PP": 0}, "devices": []}])")
            .find("non-empty list") != std::string::npos);
  CHECK(parseError(R"([{"op": "place", "filter": {"PP": 0}, "devices": [1, 1]}])")
            .find("listed twice") != std::string::npos);
  CHECK(parseError(R"([{"op": "place", "filter": {"PASS": "X"}, "devices": [0]}])")
            .find("PASS must be one of") != std::string::npos);
  CHECK(parseError(R"([{"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1], "zero": 4}])")
            .find("\"zero\" must be the ZeRO stage: 0, 1, 2 or 3") !=
        std::string::npos);
  CHECK(parseError(R"([{"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1], "zero": "two"}])")
            .find("\"zero\" must be the ZeRO stage") != std::string::npos);
  CHECK(parseError(R"([{"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1], "zero": 1, "shard_grads": true}])")
            .find("\"zero\": 1 contradicts \"shard_grads\": true") !=
        std::string::npos);
  CHECK(parseError(R"([{"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1], "shard_grads": 1}])")
            .find("shard_grads") != std::string::npos);
  CHECK(parseError(R"([{"op": "shard", "filter": {"EP": "*"}, "devices": [0, 1]}])")
            .find("not implemented yet") != std::string::npos);
  CHECK(parseError(R"([{"op": "split", "num_microbatches": 0}])")
            .find("must be positive") != std::string::npos);
  CHECK(parseError(R"([{"op": "split", "num_microbatches": 2147483648}])")
            .find("\"num_microbatches\" must be at most 8192") !=
        std::string::npos);
  CHECK(parseError(R"([{"op": "split", "num_microbatches": 2, "dim_name": 3}])")
            .find("\"dim_name\" must be a string") != std::string::npos);
  CHECK(parseError(R"([{"op": "replicate", "filter": {"PP": 0}, "devices": [0], "reduce_stream": 5}])")
            .find("\"reduce_stream\" must be a string") != std::string::npos);
  CHECK(parseError(R"([{"op": "replicate", "filter": {"PP": 0}, "devices": [0], "shard_grads": 1}])")
            .find("\"shard_grads\" must be true or false") != std::string::npos);
  CHECK(parseError(R"([{"op": "place", "filter": {"PP": 0}, "devices": [0], "stream": []}])")
            .find("\"stream\" must be a string") != std::string::npos);
  CHECK(parseError(R"([{"op": "place", "filter": {"PP": 0}, "devices": [0], "stream": ""}])")
            .find("\"stream\" must not be empty") != std::string::npos);
  CHECK(parseError(std::string(100000, '[') + std::string(100000, ']'))
            .find("more than 64 levels deep") != std::string::npos);
  CHECK(parseError(R"([{"op": "stage", "stages": 100000}])")
            .find("\"stages\" must be at most 16384") != std::string::npos);
  CHECK(parseError(R"([{"op": "order", "filters": []}])")
            .find("must not be empty") != std::string::npos);
  CHECK(parseError("[{").find("not valid JSON") != std::string::npos);
  CHECK(parseError(R"({"world_size": 0, "directives": []})")
            .find("world_size") != std::string::npos);
  CHECK(parseError(R"({"nodes": []})").find("unknown top-level key") !=
        std::string::npos);
  CHECK(parseError(R"([{"op": "split", "num_microbatches": 2}, 3])")
            .find("directive #1") != std::string::npos);
}

TEST_CASE("schedules are found by name in one registry") {
  CHECK(findSchedule("gpipe"));
  CHECK(findSchedule("1f1b"));
  CHECK_FALSE(findSchedule("zb-h1"));
  CHECK(scheduleNames() == "gpipe, 1f1b");
  CHECK(findSchedule("1f1b")->check(2, 0) != "");
  CHECK(findSchedule("1f1b")->check(2, 1) == "");
}

TEST_CASE("a schedule directive names a registered schedule") {
  CHECK(parseError(R"([{"op": "schedule", "name": "1f1b"}])") == "");
  CHECK(parseError(R"([{"op": "schedule", "name": "dualpipe"}])")
            .find("unknown schedule \"dualpipe\" (expected gpipe, 1f1b)") !=
        std::string::npos);
  CHECK(parseError(R"([{"op": "schedule"}])")
            .find("missing string key \"name\"") != std::string::npos);
}
