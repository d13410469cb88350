// Unit tests of strategy parsing and the schedule builders.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include <map>

#include "compiler/strategy/Strategy.h"

using namespace mlir::piper;

namespace {
/// Renders one order directive as "F0 F1 B0 ..." (single-filter groups).
std::string render(const Directive &d) {
  std::string out;
  for (const auto &group : d.get<OrderOptions>().groups) {
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
  std::vector<Directive> order = buildSchedule(*findSchedule("1f1b"), 4, 1, 6);
  REQUIRE(order.size() == 4);
  CHECK(render(order[0]) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  CHECK(render(order[1]) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  CHECK(render(order[2]) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  CHECK(render(order[3]) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  for (int s = 0; s < 4; ++s)
    CHECK(order[s]
              .get<OrderOptions>()
              .groups.front()
              .front()
              .entries.at("PP")
              .index == s);
}

TEST_CASE("1f1b with fewer microbatches than stages still runs every pass") {
  std::vector<Directive> order = buildSchedule(*findSchedule("1f1b"), 4, 1, 2);
  CHECK(render(order[0]) == "F0 F1 B0 B1");
  CHECK(render(order[3]) == "F0 B0 F1 B1");
}

TEST_CASE("gpipe runs every forward, then every backward") {
  std::vector<Directive> order = buildSchedule(*findSchedule("gpipe"), 2, 1, 3);
  CHECK(render(order[0]) == "F0 F1 F2 B0 B1 B2");
  CHECK(render(order[1]) == "F0 F1 F2 B0 B1 B2");
}

TEST_CASE("flags become stage, split, place, replicate and order directives") {
  Strategy s = strategyFromFlags(2, 2, 4, *findSchedule("1f1b"));
  REQUIRE(s.worldSize == 4);
  int places = 0, replicates = 0, orders = 0;
  for (const Directive &d : s.directives) {
    if (d.kind() == Directive::Place) {
      int64_t pp = d.filter.entries.at("PP").index;
      CHECK(d.get<PlaceOptions>().devices ==
            std::vector<int64_t>{2 * pp, 2 * pp + 1});
      ++places;
    }
    replicates += d.kind() == Directive::Replicate;
    orders += d.kind() == Directive::Order;
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
  CHECK(s->directives[1].get<ReplicateOptions>().bucketMb == 10);
  CHECK(s->directives[2].get<SplitOptions>().microbatches == 2);
  CHECK(
      s->directives[3].get<OrderOptions>().groups[1][0].entries.at("MB").kind ==
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
  CHECK(s->directives[0].get<ReplicateOptions>().zero == 0);
  CHECK(s->directives[1].get<ReplicateOptions>().zero == 1);
  CHECK(s->directives[2].get<ReplicateOptions>().zero == 2);
  CHECK(s->directives[2].get<ReplicateOptions>().gatherStream == "g");
  CHECK(s->directives[1].get<ReplicateOptions>().gatherStream == "dp_stream");
  CHECK(s->directives[3].get<ReplicateOptions>().zero == 3);
  CHECK(s->directives[4].get<ReplicateOptions>().zero == 3);
  Strategy flags = strategyFromFlags(2, 2, 4, *findSchedule("1f1b"), 2);
  for (const Directive &d : flags.directives)
    if (d.kind() == Directive::Replicate)
      CHECK(d.get<ReplicateOptions>().zero == 2);
  CHECK(flags.summary.find("zero=2") != std::string::npos);
}

TEST_CASE(
    "shard: the original Piper's form, an expert-parallel degree and --ep") {
  llvm::Expected<Strategy> s = parseStrategy(R"([
    {"op": "shard", "filter": {"EP": "*"}, "devices": [0, 1], "stream": "ep"},
    {"op": "shard", "filter": {"EP": "*", "PP": 1}, "devices": [4, 5, 6, 7],
     "ep": 2}])");
  REQUIRE(bool(s));
  CHECK(s->directives[0].kind() == Directive::Shard);
  CHECK(s->directives[0].get<ShardOptions>().ep == 2);
  CHECK(s->directives[0].get<ShardOptions>().stream == "ep");
  CHECK(s->directives[1].get<ShardOptions>().ep == 2);
  CHECK(s->directives[1].get<ShardOptions>().stream == "ep_stream");
  Strategy flags = strategyFromFlags(2, 4, 4, *findSchedule("1f1b"), 0, 2);
  int shards = 0;
  for (const Directive &d : flags.directives)
    if (d.kind() == Directive::Shard) {
      CHECK(d.get<ShardOptions>().ep == 2);
      CHECK(d.get<ShardOptions>().devices.size() == 4);
      ++shards;
    }
  CHECK(shards == 2);
  CHECK(flags.summary.find("ep=2") != std::string::npos);
}

TEST_CASE("recompute: blocks by filter, full or selective, and --recompute") {
  llvm::Expected<Strategy> s = parseStrategy(R"([
    {"op": "recompute"},
    {"op": "recompute", "filter": {"block": 3}, "granularity": "selective"},
    {"op": "recompute", "filter": {"block": "*"}, "granularity": "full"}])");
  REQUIRE(bool(s));
  CHECK(s->directives[0].kind() == Directive::Recompute);
  CHECK(s->directives[0].get<RecomputeOptions>().granularity ==
        RecomputeGranularity::Full);
  CHECK(s->directives[0].filter.entries.empty());
  CHECK(s->directives[1].get<RecomputeOptions>().granularity ==
        RecomputeGranularity::Selective);
  CHECK(s->directives[1].filter.entries.at("block").index == 3);
  CHECK(s->directives[2].filter.entries.at("block").kind == FilterValue::Any);
  // A recompute filter names model blocks; other directives' filters do not.
  CHECK(parseError(R"([{"op": "recompute", "filter": {"PP": 0}}])")
            .find("recompute selects forward regions by model block "
                  "(\"block\"), not \"PP\"") != std::string::npos);
  CHECK(
      parseError(R"([{"op": "place", "filter": {"block": 0}, "devices": [0]}])")
          .find("unknown filter key \"block\" (expected PP, EP, MB or "
                "PASS)") != std::string::npos);
  CHECK(parseError(R"([{"op": "recompute", "granularity": "layers"}])")
            .find("\"granularity\" must be \"full\"") != std::string::npos);
  CHECK(parseError(R"([{"op": "recompute", "granularity": 1}])")
            .find("\"granularity\" must be a string") != std::string::npos);

  StrategyFlags f;
  f.pp = 2;
  f.microbatches = 4;
  f.recompute = "selective";
  llvm::Expected<Strategy> flags = buildStrategy(f);
  REQUIRE(bool(flags));
  const Directive &last = flags->directives.back();
  CHECK(last.kind() == Directive::Recompute);
  CHECK(last.get<RecomputeOptions>().granularity ==
        RecomputeGranularity::Selective);
  CHECK(last.filter.entries.empty());
  CHECK(flags->summary.find("recompute=selective") != std::string::npos);
  f.recompute = "none";
  llvm::Expected<Strategy> none = buildStrategy(f);
  REQUIRE(bool(none));
  for (const Directive &d : none->directives)
    CHECK(d.kind() != Directive::Recompute);
  f.recompute = "some";
  llvm::Expected<Strategy> bad = buildStrategy(f);
  REQUIRE(!bad);
  CHECK(llvm::toString(bad.takeError()) ==
        "--recompute must be none, full (every transformer block) or "
        "selective (their attention core), got 'some'");
}

TEST_CASE("bad strategies name the directive and the problem") {
  CHECK(parseError(R"([{"op": "teleport"}])").find("directive #0") !=
        std::string::npos);
  CHECK(parseError(R"([{"op": "teleport"}])")
            .find("unknown directive \"teleport\"") != std::string::npos);
  CHECK(
      parseError(R"([{"op": "place", "filter": {"LAYER": 0}, "devices": [0]}])")
          .find("unknown filter key \"LAYER\"") != std::string::npos);
  CHECK(
      parseError(
          R"([{"op": "place", "filter": {"PP": 0}, "devices": [0], "colour": 1}])")
          .find("unknown key \"colour\" for place") != std::string::npos);
  CHECK(parseError(R"([{"op": "place", "filter": {"PP": 0}, "devices": []}])")
            .find("non-empty list") != std::string::npos);
  CHECK(
      parseError(R"([{"op": "place", "filter": {"PP": 0}, "devices": [1, 1]}])")
          .find("listed twice") != std::string::npos);
  CHECK(parseError(
            R"([{"op": "place", "filter": {"PASS": "X"}, "devices": [0]}])")
            .find("PASS must be one of") != std::string::npos);
  CHECK(
      parseError(
          R"([{"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1], "zero": 4}])")
          .find("\"zero\" must be the ZeRO stage: 0, 1, 2 or 3") !=
      std::string::npos);
  CHECK(
      parseError(
          R"([{"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1], "zero": "two"}])")
          .find("\"zero\" must be the ZeRO stage") != std::string::npos);
  CHECK(
      parseError(
          R"([{"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1], "zero": 1, "shard_grads": true}])")
          .find("\"zero\": 1 contradicts \"shard_grads\": true") !=
      std::string::npos);
  CHECK(
      parseError(
          R"([{"op": "replicate", "filter": {"PP": 0}, "devices": [0, 1], "shard_grads": 1}])")
          .find("shard_grads") != std::string::npos);
  CHECK(
      parseError(
          R"([{"op": "shard", "filter": {"EP": "*"}, "devices": [0, 1, 2], "ep": 2}])")
          .find("\"ep\" must divide the 3 devices") != std::string::npos);
  CHECK(
      parseError(R"([{"op": "shard", "filter": {"MB": 0}, "devices": [0, 1]}])")
          .find("not \"MB\"") != std::string::npos);
  CHECK(parseError(R"([{"op": "split", "num_microbatches": 0}])")
            .find("must be positive") != std::string::npos);
  CHECK(parseError(R"([{"op": "split", "num_microbatches": 2147483648}])")
            .find("\"num_microbatches\" must be at most 8192") !=
        std::string::npos);
  CHECK(parseError(R"([{"op": "split", "num_microbatches": 2, "dim_name": 3}])")
            .find("\"dim_name\" must be a string") != std::string::npos);
  CHECK(
      parseError(
          R"([{"op": "replicate", "filter": {"PP": 0}, "devices": [0], "reduce_stream": 5}])")
          .find("\"reduce_stream\" must be a string") != std::string::npos);
  CHECK(
      parseError(
          R"([{"op": "replicate", "filter": {"PP": 0}, "devices": [0], "shard_grads": 1}])")
          .find("\"shard_grads\" must be true or false") != std::string::npos);
  CHECK(
      parseError(
          R"([{"op": "place", "filter": {"PP": 0}, "devices": [0], "stream": []}])")
          .find("\"stream\" must be a string") != std::string::npos);
  CHECK(
      parseError(
          R"([{"op": "place", "filter": {"PP": 0}, "devices": [0], "stream": ""}])")
          .find("\"stream\" must not be empty") != std::string::npos);
  CHECK(parseError(std::string(100000, '[') + std::string(100000, ']'))
            .find("more than 64 levels deep") != std::string::npos);
  CHECK(parseError(R"([{"op": "stage", "stages": 100000}])")
            .find("\"stages\" must be at most 16384") != std::string::npos);
  CHECK(parseError(R"([{"op": "order", "filters": []}])")
            .find("must not be empty") != std::string::npos);
  CHECK(parseError("[{").find("not valid JSON") != std::string::npos);
  CHECK(
      parseError(R"({"world_size": 0, "directives": []})").find("world_size") !=
      std::string::npos);
  CHECK(parseError(R"({"nodes": []})").find("unknown top-level key") !=
        std::string::npos);
  CHECK(parseError(R"([{"op": "split", "num_microbatches": 2}, 3])")
            .find("directive #1") != std::string::npos);
}

TEST_CASE("schedules are found by name in one registry") {
  CHECK(findSchedule("gpipe"));
  CHECK(findSchedule("1f1b"));
  CHECK_FALSE(findSchedule("dualpipe-x"));
  CHECK(scheduleNames() == "gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, "
                           "zbv, dualpipe, dualpipev");
  CHECK(findSchedule("dualpipe")
            ->check(3, 1, 6)
            .find("even number of "
                  "pipeline") != std::string::npos);
  CHECK(findSchedule("dualpipe")->check(2, 1, 5).find("at least 2P = 4") !=
        std::string::npos);
  CHECK(findSchedule("dualpipe")->check(2, 1, 4) == "");
  CHECK(findSchedule("1f1b")->check(2, 1, 0) != "");
  CHECK(findSchedule("1f1b")->check(2, 1, 1) == "");
  CHECK(findSchedule("1f1b")->check(2, 2, 1).find("needs 1 stage per") !=
        std::string::npos);
  CHECK(findSchedule("zb-h2")->check(4, 1, 6).find("at least 2P-1 = 7") !=
        std::string::npos);
  CHECK(findSchedule("zb-h2")->check(4, 1, 7) == "");
  CHECK(findSchedule("zbv")->check(4, 2, 6).find("at least 7") !=
        std::string::npos);
  CHECK(findSchedule("zbv")->check(4, 1, 8).find("needs 2 stages") !=
        std::string::npos);
  CHECK(findSchedule("dualpipev")->check(4, 2, 7).find("at least 8") !=
        std::string::npos);
  CHECK(findSchedule("interleaved-1f1b")->check(4, 2, 6).find("multiple") !=
        std::string::npos);
  CHECK(findSchedule("interleaved-1f1b")->check(4, 1, 8).find("at least 2") !=
        std::string::npos);
  CHECK(formatScheduleTable().find("dualpipev") != std::string::npos);
}

/// Every (stage, microbatch) of the device groups' stages appears once with
/// F and once as B or as BI then BW; every slot's tasks are on the group.
static void checkComplete(const ScheduleBuilder &b, int64_t p, int64_t v,
                          int64_t m) {
  for (int64_t d = 0; d < p; ++d) {
    std::map<std::pair<int64_t, int64_t>, std::string> seen;
    for (const ScheduleSlot &slot : b.build(d, p, v, m))
      for (const ScheduledTask &t : slot) {
        INFO(b.name.str() << " P=" << p << " M=" << m << " group " << d);
        CHECK(deviceOfTask(b.layout, t.stage, t.mb, p, m) == d);
        std::string &passes = seen[{t.stage, t.mb}];
        if (t.pass == "BW")
          CHECK(passes == "F BI");
        passes += (passes.empty() ? "" : " ") + t.pass;
      }
    for (int64_t s = 0; s < p * v; ++s) {
      for (int64_t mb = 0; mb < m; ++mb) {
        if (deviceOfTask(b.layout, s, mb, p, m) != d)
          continue;
        INFO(b.name.str() << " P=" << p << " M=" << m << " stage " << s
                          << " mb " << mb);
        std::string passes = seen[{s, mb}];
        CHECK((passes == "F B" || passes == "F BI BW"));
      }
    }
  }
}

TEST_CASE("every schedule runs every pass of its stages once") {
  for (const ScheduleBuilder &b : getScheduleBuilders())
    for (int64_t p : {2, 3, 4})
      for (int64_t m = 1; m <= 3 * p + 1; ++m) {
        int64_t v = b.layout == StageLayout::Linear ||
                            b.layout == StageLayout::Bidirectional
                        ? 1
                        : 2;
        if (b.check(p, v, m).empty())
          checkComplete(b, p, v, m);
      }
}

TEST_CASE("zb-h1 defers stage d's weight gradients by d") {
  std::vector<Directive> order = buildSchedule(*findSchedule("zb-h1"), 3, 1, 4);
  CHECK(render(order[0]) == "F0 F1 F2 BI0 BW0 F3 BI1 BW1 BI2 BW2 BI3 BW3");
  CHECK(render(order[2]) == "F0 BI0 F1 BI1 F2 BI2 BW0 F3 BI3 BW1 BW2 BW3");
}

TEST_CASE("the V layout pairs stage d with 2P-1-d") {
  CHECK(deviceOfStage(StageLayout::V, 0, 4) == 0);
  CHECK(deviceOfStage(StageLayout::V, 7, 4) == 0);
  CHECK(deviceOfStage(StageLayout::V, 4, 4) == 3);
  CHECK(deviceOfStage(StageLayout::Interleaved, 6, 4) == 2);
  Strategy s = strategyFromFlags(2, 1, 4, *findSchedule("zbv"));
  std::map<int64_t, std::vector<int64_t>> placed;
  for (const Directive &d : s.directives)
    if (d.kind() == Directive::Place)
      placed[d.filter.entries.at("PP").index] = d.get<PlaceOptions>().devices;
  CHECK(placed[0] == std::vector<int64_t>{0});
  CHECK(placed[1] == std::vector<int64_t>{1});
  CHECK(placed[2] == std::vector<int64_t>{1});
  CHECK(placed[3] == std::vector<int64_t>{0});
}

TEST_CASE("dualpipev overlaps a forward and a backward in one slot") {
  std::vector<Directive> order =
      buildSchedule(*findSchedule("dualpipev"), 2, 2, 4);
  int slots = 0;
  for (const Directive &d : order)
    for (const std::vector<Filter> &g : d.get<OrderOptions>().groups)
      if (g.size() == 2) {
        ++slots;
        CHECK(g[0].entries.at("PASS").pass == "F");
        CHECK(g[1].entries.at("PASS").pass == "B");
      }
  CHECK(slots > 0);
}

TEST_CASE("an order's split backward needs BI then BW for one filter") {
  auto order = [](const std::string &groups) {
    return parseError(R"([{"op": "order", "filters": [)" + groups + "]}]");
  };
  CHECK(
      order(
          R"([{"PP": 0, "MB": 0, "PASS": "BI"}], [{"PP": 0, "MB": 0, "PASS": "BW"}])") ==
      "");
  CHECK(order(R"([{"PP": 0, "MB": 0, "PASS": "BI"}])")
            .find("names PASS \"BI\" for {\"MB\": 0, \"PP\": 0} without "
                  "\"BW\"") != std::string::npos);
  CHECK(order(R"([{"PP": 0, "MB": 0, "PASS": "BW"}])").find("without \"BI\"") !=
        std::string::npos);
  CHECK(
      order(
          R"([{"PP": 0, "MB": 0, "PASS": "BW"}], [{"PP": 0, "MB": 0, "PASS": "BI"}])")
          .find("in group 0, not after its \"BI\" in group 1") !=
      std::string::npos);
  CHECK(
      order(
          R"([{"PP": 0, "MB": 0, "PASS": "BI"}, {"PP": 0, "MB": 0, "PASS": "BW"}])")
          .find("not after its") != std::string::npos);
  CHECK(
      order(
          R"([{"PP": 0, "MB": 0, "PASS": "BI"}], [{"PP": 0, "MB": 0, "PASS": "BI"}], [{"PP": 0, "MB": 0, "PASS": "BW"}])")
          .find("twice") != std::string::npos);
  CHECK(
      order(
          R"([{"PP": 0, "MB": 0, "PASS": "B"}], [{"PP": 0, "MB": 0, "PASS": "BI"}], [{"PP": 0, "MB": 0, "PASS": "BW"}])")
          .find("both fused") != std::string::npos);
}

TEST_CASE("a schedule directive names a registered schedule") {
  CHECK(parseError(R"([{"op": "schedule", "name": "1f1b"}])") == "");
  CHECK(parseError(R"([{"op": "schedule", "name": "dualpipe-x"}])")
            .find("unknown schedule \"dualpipe-x\" (expected gpipe, 1f1b, "
                  "interleaved-1f1b") != std::string::npos);
  CHECK(parseError(R"([{"op": "schedule"}])")
            .find("missing string key \"name\"") != std::string::npos);
}

TEST_CASE("dualpipe sends each half of the microbatches one way") {
  // Group 0 runs stage 0 of microbatches 0-3 and stage 3 of 4-7.
  std::vector<Directive> order =
      buildSchedule(*findSchedule("dualpipe"), 4, 1, 8);
  for (const std::vector<Filter> &g : order[0].get<OrderOptions>().groups)
    for (const Filter &f : g)
      CHECK(f.entries.at("PP").index == (f.entries.at("MB").index < 4 ? 0 : 3));
  Strategy s = strategyFromFlags(4, 1, 8, *findSchedule("dualpipe"));
  int places = 0;
  for (const Directive &d : s.directives)
    if (d.kind() == Directive::Place) {
      ++places;
      int64_t st = d.filter.entries.at("PP").index;
      int64_t mb = d.filter.entries.at("MB").index;
      CHECK(d.get<PlaceOptions>().devices ==
            std::vector<int64_t>{mb < 4 ? st : 3 - st});
    }
  CHECK(places == 32);
}

TEST_CASE("a key an object repeats is an error naming it") {
  // llvm::json keeps the last value: "num_microbatches": 2 silently became 4.
  CHECK(parseError(R"([{"op": "split", "filter": {}, "dim_name": "MB",
                       "num_microbatches": 2, "num_microbatches": 4}])") ==
        "key \"num_microbatches\" appears twice in one object (line 2)");
  CHECK(parseError(R"({"world_size": 2, "directives": [], "world_size": 1})") ==
        "key \"world_size\" appears twice in one object (line 1)");
  CHECK(parseError(R"([{"op": "place", "filter": {"PP": 0, "PP": 1},
                       "devices": [0]}])") ==
        "key \"PP\" appears twice in one object (line 1)");
  // Escapes spell the same key.
  CHECK(parseError(R"([{"op": "stage", "stages": 1, "st\u0061ges": 2}])") ==
        "key \"stages\" appears twice in one object (line 1)");
  // The same key in different objects, and a key's text as a value, are
  // fine.
  CHECK(parseError(R"([{"op": "stage", "stages": 2},
                       {"op": "split", "filter": {}, "dim_name": "MB",
                        "num_microbatches": 2}])") == "");
  // Malformed JSON is reported as such, not as a repeated key; a key cut
  // off at the end of the text (found by the fuzzer: the scan read past it)
  // too.
  CHECK(parseError(R"([{"op": "stage", "op": )").find("not valid JSON") !=
        std::string::npos);
  CHECK(parseError(R"([{"op": "stage", ")").find("not valid JSON") !=
        std::string::npos);
}

TEST_CASE("a device list of 2^20 entries parses in linear time") {
  // Each device was searched for in the list before it: 2^20 entries took
  // hours.
  std::string devices;
  for (int i = 0; i < (1 << 20); ++i)
    devices += (i ? "," : "") + std::to_string(i);
  llvm::Expected<Strategy> s =
      parseStrategy(R"([{"op": "place", "filter": {"PP": 0}, "devices": [)" +
                    devices + "]}]");
  bool parsed = static_cast<bool>(s);
  REQUIRE(parsed);
  CHECK(s->directives.front().get<PlaceOptions>().devices.size() == size_t(1)
                                                                        << 20);
  std::string err =
      parseError(R"([{"op": "place", "filter": {"PP": 0}, "devices": [)" +
                 devices + ",0]}]");
  CHECK(err.find("\"devices\" lists more devices than the world may have") !=
        std::string::npos);
  // The message quotes the start of the directive, not all 8 MB of it.
  CHECK(err.size() < 400);
}

TEST_CASE("flags build a strategy that passes the file's rules") {
  StrategyFlags f;
  f.pp = 2;
  f.dp = 4;
  f.microbatches = 4;
  f.ep = 2;
  f.zero = 1;
  llvm::Expected<Strategy> s = buildStrategy(f);
  REQUIRE(bool(s));
  CHECK(s->worldSize == 8);
  CHECK(!verifyStrategy(*s));

  // Flag errors name the flags.
  f.ep = 3;
  llvm::Expected<Strategy> bad = buildStrategy(f);
  REQUIRE(!bad);
  CHECK(llvm::toString(bad.takeError()) ==
        "--ep 3 must divide --dp 4: expert-parallel groups are carved out of "
        "a stage's data-parallel replicas");
  f.ep = 1;

  // --bucket-mb reaches every replicate directive and the summary; the
  // default (25, DDP's) is said by neither.
  for (Directive &d : s->directives)
    if (d.kind() == Directive::Replicate)
      CHECK(d.get<ReplicateOptions>().bucketMb == kDefaultBucketMb);
  CHECK(s->summary.find("bucket_mb") == std::string::npos);
  f.bucketMb = 0.5;
  llvm::Expected<Strategy> small = buildStrategy(f);
  REQUIRE(bool(small));
  int replicates = 0;
  for (Directive &d : small->directives)
    if (d.kind() == Directive::Replicate) {
      ++replicates;
      CHECK(d.get<ReplicateOptions>().bucketMb == 0.5);
      CHECK(d.text.find(" bucket_size=0.5") != std::string::npos);
    }
  CHECK(replicates == 2);
  CHECK(small->summary.find(" bucket_mb=0.5") != std::string::npos);
  for (double wrong : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    f.bucketMb = wrong;
    bad = buildStrategy(f);
    REQUIRE(!bad);
    CHECK(llvm::toString(bad.takeError())
              .find("--bucket-mb must be a positive number of MB (2^20 "
                    "bytes), got ") == 0);
  }
  f.bucketMb = kDefaultBucketMb;
  f.schedule = "nope";
  bad = buildStrategy(f);
  REQUIRE(!bad);
  CHECK(llvm::toString(bad.takeError()).find("unknown schedule 'nope'") == 0);

  // A strategy built in C++ that breaks a rule is caught by the same check a
  // file goes through, naming the directive.
  Strategy built = strategyFromFlags(1, 4, 2, *findSchedule("1f1b"));
  ShardOptions options;
  options.devices = {0, 1, 2, 3};
  options.ep = 3;
  Directive shard(options, "shard ep=3");
  shard.index = static_cast<int>(built.directives.size());
  built.directives.push_back(shard);
  llvm::Error err = verifyStrategy(built);
  REQUIRE(bool(err));
  CHECK(llvm::toString(std::move(err)) ==
        "directive #" + std::to_string(shard.index) +
            " (shard ep=3): \"ep\" must divide the 4 devices (expert groups "
            "are carved out of them)");
}

TEST_CASE("dualpipe under --dp and --ep: a replicate per copy, a shard over "
          "both copies' groups") {
  StrategyFlags f;
  f.pp = 2;
  f.dp = 4;
  f.ep = 2;
  f.microbatches = 4;
  f.schedule = "dualpipe";
  llvm::Expected<Strategy> s = buildStrategy(f);
  REQUIRE(bool(s));
  CHECK(s->worldSize == 8);
  // Stage st: microbatches 0-1 on group st, 2-3 on group 1 - st; each copy
  // replicated on its group of 4, one shard over both groups' 8 ranks.
  std::map<int64_t, std::vector<std::vector<int64_t>>> replicated;
  std::vector<std::vector<int64_t>> sharded;
  for (const Directive &d : s->directives) {
    if (d.kind() == Directive::Replicate)
      replicated[d.filter.entries.at("PP").index].push_back(
          d.get<ReplicateOptions>().devices);
    if (d.kind() == Directive::Shard) {
      CHECK(d.get<ShardOptions>().ep == 2);
      // Every stage on the devices (a group without MoE layers is left
      // alone).
      CHECK(d.filter.entries.count("PP") == 0);
      sharded.push_back(d.get<ShardOptions>().devices);
    }
  }
  std::vector<int64_t> g0 = {0, 1, 2, 3}, g1 = {4, 5, 6, 7};
  CHECK(replicated[0] == std::vector<std::vector<int64_t>>{g0, g1});
  CHECK(replicated[1] == std::vector<std::vector<int64_t>>{g1, g0});
  // One shard over both copies' groups, which hold the same two stages.
  CHECK(sharded == std::vector<std::vector<int64_t>>{{0, 1, 2, 3, 4, 5, 6, 7}});

  // ZeRO shards each copy over its own group: every replicate carries it.
  f.zero = 2;
  llvm::Expected<Strategy> z = buildStrategy(f);
  if (!z)
    FAIL(llvm::toString(z.takeError()));
  int zeroReplicates = 0;
  for (const Directive &d : z->directives)
    if (d.kind() == Directive::Replicate && d.get<ReplicateOptions>().zero == 2)
      ++zeroReplicates;
  CHECK(zeroReplicates == 4);
}

TEST_CASE("one verifier checks a directive however it was built") {
  // Built in C++ (as the flags and the typed passes build them), each
  // breaking one rule that a strategy file's parser leaves to the verifier.
  auto verify = [](Directive::Options options, Filter filter = {}) {
    Directive d(std::move(options), "built", std::move(filter));
    llvm::Error err = verifyDirective(d);
    return err ? llvm::toString(std::move(err)) : std::string();
  };
  auto replicate = [](auto edit) {
    ReplicateOptions o;
    o.devices = {0, 1};
    edit(o);
    return o;
  };
  CHECK(verify(replicate([](ReplicateOptions &) {})).empty());
  CHECK(verify(replicate([](ReplicateOptions &o) { o.zero = 4; })) ==
        "directive #0 (built): \"zero\" must be the ZeRO stage: 0, 1, 2 or 3, "
        "got 4");
  CHECK(verify(replicate([](ReplicateOptions &o) { o.bucketMb = 0; })) ==
        "directive #0 (built): \"bucket_size\" must be a positive number of "
        "MB (2^20 bytes)");
  CHECK(verify(replicate([](ReplicateOptions &o) {
          o.bucketMb = std::numeric_limits<double>::infinity();
        })).find("bucket_size") != std::string::npos);
  CHECK(verify(replicate([](ReplicateOptions &o) {
          o.devices = {1, 1};
        })) == "directive #0 (built): device 1 is listed twice");
  CHECK(verify(replicate([](ReplicateOptions &o) { o.devices = {-1}; })) ==
        "directive #0 (built): \"devices\" entries must be integers from 0 "
        "to 1048575, got -1");
  CHECK(verify(replicate([](ReplicateOptions &o) { o.devices.clear(); })) ==
        "directive #0 (built): \"devices\" must be a non-empty list of device "
        "indices");
  CHECK(verify(replicate([](ReplicateOptions &o) { o.gatherStream = ""; })) ==
        "directive #0 (built): \"reduce_stream\" and \"gather_stream\" must "
        "name streams");
  CHECK(verify(PlaceOptions{{0}, ""}) ==
        "directive #0 (built): \"stream\" must name a stream");
  Filter any;
  any.entries["PP"] = {FilterValue::Any, 0, ""};
  CHECK(verify(OrderOptions{
            std::vector<std::vector<Filter>>(kMaxOrderGroups + 1, {any})}) ==
        "directive #0 (built): \"filters\" has 32769 groups, more than the "
        "limit of 32768");
  CHECK(verify(StageOptions{0}) ==
        "directive #0 (built): \"stages\" must be positive");
  CHECK(verify(SplitOptions{kMaxMicrobatches + 1}) ==
        "directive #0 (built): \"num_microbatches\" must be at most 8192");
  CHECK(verify(ScheduleOptions{"nope"}).find("unknown schedule \"nope\"") !=
        std::string::npos);
  ContextParallelOptions ulysses;
  ulysses.cp = 2;
  ulysses.kind = ContextParallelKind::Ulysses;
  CHECK(verify(ulysses).empty());
  ulysses.overlap = false;
  CHECK(verify(ulysses) == "directive #0 (built): \"overlap\" orders the "
                           "ring's exchanges; kind \"ulysses\" has none to "
                           "order");
  ShardTensorOptions tp;
  tp.tp = 1;
  CHECK(verify(tp) ==
        "directive #0 (built): \"tp\" must be between 2 and 1048576, got 1");
  Filter negative;
  negative.entries["block"] = {FilterValue::Index, -3, ""};
  CHECK(verify(RecomputeOptions{}, negative) ==
        "directive #0 (built): filter block must be an index from 0 to "
        "1048575 or \"*\", got -3");
  // An order's split-backward stencil, in a group of filters.
  Filter bi;
  bi.entries["PP"] = {FilterValue::Index, 0, ""};
  bi.entries["PASS"] = {FilterValue::Pass, 0, "BI"};
  CHECK(verify(OrderOptions{{{bi}}}).find("without \"BW\"") !=
        std::string::npos);
  CHECK(verify(OrderOptions{{{}}}) ==
        "directive #0 (built): each entry of \"filters\" must be a non-empty "
        "list of filters");

  // The names the JSON, the flags and the pass options share.
  for (RecomputeGranularity g :
       {RecomputeGranularity::Full, RecomputeGranularity::Selective})
    CHECK(parseRecomputeGranularity(stringify(g)) == g);
  for (ContextParallelKind k :
       {ContextParallelKind::Ring, ContextParallelKind::Ulysses})
    CHECK(parseContextParallelKind(stringify(k)) == k);
  CHECK(!parseRecomputeGranularity("none"));
  CHECK(!parseContextParallelKind("mesh"));
}

TEST_CASE("strategyToJson writes a file that parses back to the same "
          "directives") {
  // Every directive kind the flags build: stage, split, place, replicate
  // (ZeRO, a bucket), shard, order, recompute, shard_tensor (SP, no vocab
  // parallelism), context_parallel (Ulysses).
  std::vector<StrategyFlags> cases(4);
  cases[0].pp = 2;
  cases[0].dp = 2;
  cases[0].microbatches = 4;
  cases[0].zero = 2;
  cases[0].bucketMb = 0.5;
  cases[0].recompute = "selective";
  cases[1].pp = 2;
  cases[1].dp = 2;
  cases[1].ep = 2;
  cases[1].microbatches = 4;
  cases[1].schedule = "dualpipe";
  cases[2].tp = 2;
  cases[2].sp = true;
  cases[2].noVocabParallel = true;
  cases[2].cp = 2;
  cases[2].cpKind = "ulysses";
  cases[2].recompute = "full";
  cases[3].pp = 2;
  cases[3].microbatches = 4;
  cases[3].schedule = "zb-h1";
  for (const StrategyFlags &flags : cases) {
    llvm::Expected<Strategy> built = buildStrategy(flags);
    REQUIRE(static_cast<bool>(built));
    std::string text = strategyToJson(*built);
    llvm::Expected<Strategy> parsed = parseStrategy(text);
    INFO(text);
    REQUIRE(static_cast<bool>(parsed));
    CHECK(parsed->worldSize == built->worldSize);
    CHECK(parsed->summary == built->summary + " (strategy file)");
    REQUIRE(parsed->directives.size() == built->directives.size());
    for (size_t i = 0; i < built->directives.size(); ++i) {
      const Directive &a = built->directives[i], &b = parsed->directives[i];
      CHECK(a.kind() == b.kind());
      CHECK(a.filter.str() == b.filter.str());
    }
    // Written again, the parsed strategy is the same file: every option
    // survived (the summary aside, which says it came from a file).
    parsed->summary = built->summary;
    CHECK(strategyToJson(*parsed) == text);
  }
  CHECK(parseError(R"({"summary": "a\nb", "directives": []})") ==
        "\"summary\" must be a non-empty string of one line");
  CHECK(parseError(R"({"summary": 3, "directives": []})") ==
        "\"summary\" must be a non-empty string of one line");
}
