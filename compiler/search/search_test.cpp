// piperc search: the facts it reads of a model, its rules and bound on the
// state, and the whole search on tiny models (deterministic, every printed
// strategy a file that parses back).
#include <catch2/catch.hpp>

#include "compiler/frontend/Presets.h"
#include "compiler/search/Search.h"
#include "dialects/piper/PiperDialect.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::piper;
using namespace mlir::piper::search;

namespace {
/// The text of preset `name` with `layers` blocks (0: the preset's).
std::string presetText(const std::string &name, int64_t layers = 0) {
  GptConfig cfg = findPreset(name)->config;
  if (layers)
    cfg.layers = layers;
  MLIRContext ctx;
  OwningOpRef<ModuleOp> module = buildGptModel(&ctx, cfg);
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  return text;
}

ModelFacts factsOf(const std::string &name) {
  GptConfig cfg = findPreset(name)->config;
  MLIRContext ctx;
  OwningOpRef<ModuleOp> module = buildGptModel(&ctx, cfg);
  std::string error;
  FailureOr<ModelFacts> facts = scanModel(*module, error);
  INFO(error);
  REQUIRE(succeeded(facts));
  CHECK(facts->denseParams + facts->expertParams == countParameters(cfg));
  return *facts;
}

SearchOptions tinyOptions(int64_t devices) {
  SearchOptions o;
  o.devices = devices;
  o.deviceMemory = int64_t(1) << 30;
  o.globalBatch = 16;
  o.maxCompiles = 1 << 20;
  o.top = 1 << 20;
  return o;
}
} // namespace

TEST_CASE("the search reads a model's sizes from its ops") {
  ModelFacts llama = factsOf("llama-tiny");
  CHECK(llama.batch == 4);
  CHECK(llama.seq == 32);
  CHECK(llama.layers == 2);
  CHECK(llama.heads == 4);
  CHECK(llama.kvHeads == 2);
  CHECK(llama.hidden == 64);
  CHECK(llama.vocab == 256);
  CHECK(llama.experts == 0);
  CHECK(llama.expertParams == 0);
  CHECK(llama.attentionFlops > 0);
  CHECK(llama.forwardFlops > llama.attentionFlops);
  ModelFacts moe = factsOf("qwen3-moe-tiny");
  CHECK(moe.experts == 4);
  // Two layers of 4 experts, w13 (64 x 128) and w2 (64 x 64) each.
  CHECK(moe.expertParams == 2 * 4 * (64 * 128 + 64 * 64));
  CHECK(moe.dispatchRows > 0);
}

TEST_CASE("a model without a token input or attention is refused") {
  MLIRContext ctx;
  ctx.loadDialect<PiperDialect>();
  OwningOpRef<ModuleOp> module = ModuleOp::create(UnknownLoc::get(&ctx));
  std::string error;
  CHECK(failed(scanModel(*module, error)));
  CHECK(error.find("no token input") != std::string::npos);
}

TEST_CASE("the rules prune what cannot split the model, each counted") {
  ModelFacts m = factsOf("llama-tiny");
  SearchOptions o = tinyOptions(8);
  SearchCounts counts;
  std::vector<Candidate> candidates = enumerateCandidates(m, o, counts);
  REQUIRE(!candidates.empty());
  CHECK(counts.enumerated == int64_t(candidates.size()) + counts.prunedByRule +
                                 counts.prunedByMemory);
  // 4 heads, 2 key/value heads: tp 4 and 8 cannot split them; 2 blocks
  // cannot fill 4 pipeline device groups.
  CHECK(counts.rules.at("tp must divide the heads and key/value heads") > 0);
  CHECK(counts.rules.at("more pipeline device groups than transformer "
                        "blocks") > 0);
  for (const Candidate &c : candidates) {
    const StrategyFlags &f = c.flags;
    CHECK(f.pp * f.dp * f.tp * f.cp == 8);
    CHECK(f.tp <= 2);
    CHECK(f.dp * f.microbatches * m.batch == o.globalBatch);
    // Every candidate is a strategy the flags accept.
    llvm::Expected<Strategy> s = buildStrategy(f);
    INFO(layoutName(f) << " " << f.schedule);
    CHECK(static_cast<bool>(s));
    if (!s)
      llvm::consumeError(s.takeError());
  }
  // A device too small for the smallest state prunes everything by the
  // bound, before any compile.
  o.deviceMemory = 1000;
  SearchCounts none;
  CHECK(enumerateCandidates(m, o, none).empty());
  CHECK(none.prunedByMemory > 0);
}

TEST_CASE("the state bound is below every compiled plan's arena; the search "
          "is deterministic and its strategies parse back") {
  // A 4-block Llama on 4 devices, every candidate compiled.
  std::string text = presetText("llama-tiny", 4);
  SearchOptions o = tinyOptions(4);
  o.maxCompiles = 160;
  std::string error;
  FailureOr<SearchResult> one = runSearch(text, o, nullptr, error);
  INFO(error);
  REQUIRE(succeeded(one));
  CHECK(one->counts.compiled == int64_t(one->compiled.size()));
  CHECK(one->counts.fitting ==
        llvm::count_if(one->compiled, [](const Evaluated &e) {
          return e.outcome == Evaluated::Outcome::Fits;
        }));
  REQUIRE(one->ranked.size() > 10);
  for (const Evaluated &e : one->compiled) {
    INFO(layoutName(e.candidate.flags)
         << " " << e.candidate.flags.schedule << " zero "
         << e.candidate.flags.zero << ": " << e.why);
    CHECK(e.outcome == Evaluated::Outcome::Fits);
    CHECK(e.candidate.stateLowerBound <= e.stateBytes);
    CHECK(e.stateBytes <= e.peakBytes);
  }
  for (size_t i = 1; i < one->ranked.size(); ++i)
    CHECK(one->ranked[i - 1].stepSeconds <= one->ranked[i].stepSeconds);
  for (const Evaluated &e : one->ranked) {
    llvm::Expected<Strategy> parsed = parseStrategy(e.strategyJson);
    REQUIRE(static_cast<bool>(parsed));
    CHECK(parsed->worldSize == 4);
  }
  o.jobs = 2;
  FailureOr<SearchResult> two = runSearch(text, o, nullptr, error);
  REQUIRE(succeeded(two));
  REQUIRE(two->ranked.size() == one->ranked.size());
  for (size_t i = 0; i < one->ranked.size(); ++i) {
    CHECK(two->ranked[i].strategyJson == one->ranked[i].strategyJson);
    CHECK(two->ranked[i].stepSeconds == one->ranked[i].stepSeconds);
    CHECK(two->ranked[i].peakBytes == one->ranked[i].peakBytes);
  }
  // A device below the smallest plan: every compiled plan is too big.
  o.deviceMemory = one->ranked.front().stateBytes;
  o.maxCompiles = 8;
  FailureOr<SearchResult> small = runSearch(text, o, nullptr, error);
  REQUIRE(succeeded(small));
  CHECK(small->counts.tooBig + small->counts.fitting == small->counts.compiled);
  for (const Evaluated &e : small->ranked)
    CHECK(e.peakBytes <= o.deviceMemory);
}

TEST_CASE("a long candidate is screened through a proxy of fewer "
          "microbatches; the table's rows are compiled whole") {
  // The proxy: the smallest count from pp (at least 2) the schedule
  // accepts, when the candidate has at least twice that.
  auto proxy = [](int64_t pp, int64_t m, const char *schedule, int64_t v = 0) {
    StrategyFlags f;
    f.pp = pp;
    f.microbatches = m;
    f.schedule = schedule;
    f.virtualStages = v;
    return proxyMicrobatches(f);
  };
  CHECK(proxy(2, 3, "1f1b") == 0);
  CHECK(proxy(2, 4, "1f1b") == 2);
  CHECK(proxy(4, 13, "zb-h2") == 0);
  CHECK(proxy(4, 14, "zb-h2") == 7);
  CHECK(proxy(1, 64, "1f1b") == 2);
  CHECK(proxy(4, 64, "zb-h2") == 7);
  CHECK(proxy(3, 64, "interleaved-1f1b", 2) == 3);
  CHECK(proxy(4, 64, "dualpipe") == 8);
  CHECK(proxy(4, 64, "zbv") == 7);

  // A 4-block Llama, one sequence per microbatch: pp 2 runs 16 or 32.
  GptConfig cfg = findPreset("llama-tiny")->config;
  cfg.layers = 4;
  cfg.batch = 1;
  MLIRContext ctx;
  OwningOpRef<ModuleOp> module = buildGptModel(&ctx, cfg);
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  SearchOptions o = tinyOptions(2);
  o.globalBatch = 32;
  o.maxCompiles = 40;
  o.top = 6;
  std::string error;
  FailureOr<SearchResult> r = runSearch(text, o, nullptr, error);
  INFO(error);
  REQUIRE(succeeded(r));
  REQUIRE(r->ranked.size() == 6);
  int64_t proxies = 0;
  for (const Evaluated &e : r->compiled)
    proxies += e.proxyMicrobatches > 0;
  CHECK(proxies > 0);
  // Every row is exact: its own microbatches, compiled whole; the same
  // result on 1 and 2 threads.
  for (const Evaluated &e : r->ranked)
    CHECK(e.proxyMicrobatches == 0);
  CHECK(r->counts.confirmed > 0);
  o.jobs = 2;
  FailureOr<SearchResult> two = runSearch(text, o, nullptr, error);
  REQUIRE(succeeded(two));
  REQUIRE(two->ranked.size() == r->ranked.size());
  for (size_t i = 0; i < r->ranked.size(); ++i)
    CHECK(two->ranked[i].strategyJson == r->ranked[i].strategyJson);
}
