// The strategy of piperc's flags: `--pp --dp --microbatches --schedule --zero
// --ep --virtual-stages --tp` checked as flags, built into directives, and then
// checked by verifyStrategy like a strategy file.
#include "compiler/strategy/Strategy.h"
#include "support/ParallelLayout.h"

#include <cmath>

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir::piper;
using ::piper::Axis;
using ::piper::Degrees;
using ::piper::ParallelLayout;

/// A size in MB as people write it: "0.5", "25", "9.53674e-07" (formatv
/// would print a fixed two decimals).
static std::string megabytes(double mb) {
  return llvm::formatv("{0}", llvm::format("%g", mb)).str();
}

Strategy mlir::piper::strategyFromFlags(int64_t pp, int64_t dp,
                                        int64_t microbatches,
                                        const ScheduleBuilder &schedule,
                                        int zero, int64_t ep,
                                        int64_t virtualStages, double bucketMb,
                                        int64_t tp, int64_t cp) {
  int64_t perDevice =
      virtualStages > 0 ? virtualStages : defaultStagesPerDevice(schedule);
  int64_t stages = pp * perDevice;
  Strategy s;
  auto add = [&](Directive::Options options, std::string text,
                 Filter filter = {}) {
    Directive d(std::move(options), std::move(text), std::move(filter));
    d.index = s.directives.size();
    s.directives.push_back(std::move(d));
  };
  auto stageFilter = [](int64_t st) {
    Filter filter;
    filter.entries["PP"] = {FilterValue::Index, st, ""};
    return filter;
  };
  add(StageOptions{stages}, llvm::formatv("stage stages={0}", stages).str());
  add(SplitOptions{microbatches},
      llvm::formatv("split num_microbatches={0}", microbatches).str());
  if (tp > 1) {
    // Every transformer block: the directive's default filter.
    ShardTensorOptions st;
    st.tp = tp;
    add(st, llvm::formatv("shard_tensor tp={0}", tp).str());
  }
  if (cp > 1) {
    ContextParallelOptions c;
    c.cp = cp;
    add(c, llvm::formatv("context_parallel cp={0}", cp).str());
  }
  // The world's layout: pipeline device group g is the ranks of pipeline
  // coordinate g, dp x cp x tp of them (support/ParallelLayout.h).
  const ParallelLayout layout(Degrees{pp, dp, cp, tp, 1});
  const int64_t group = layout.stageSize();
  auto groupDevices = [&](int64_t g) { return layout.slice(Axis::pp, g); };
  auto listDevices = [](const std::vector<int64_t> &devices) {
    return llvm::formatv("[{0}]",
                         llvm::join(llvm::map_range(devices,
                                                    [](int64_t d) {
                                                      return std::to_string(d);
                                                    }),
                                    ", "))
        .str();
  };
  // Data parallelism for the tasks of stage st on `devices`.
  auto replicate = [&](int64_t st, std::vector<int64_t> devices) {
    ReplicateOptions rep;
    rep.devices = std::move(devices);
    rep.gatherStream = zero == 3 ? "gather_stream" : "dp_stream";
    rep.zero = zero;
    rep.bucketMb = bucketMb;
    std::string text = llvm::formatv(
        "replicate PP={0} devices={1}{2}{3}", st, listDevices(rep.devices),
        zero ? llvm::formatv(" zero={0}", zero).str() : std::string(),
        bucketMb != kDefaultBucketMb ? " bucket_size=" + megabytes(bucketMb)
                                     : std::string());
    add(rep, text, stageFilter(st));
  };
  // Expert parallelism for every stage on `devices` (one device group, or
  // the two groups holding DualPipe's copies of the same stages), once
  // those stages are placed; a group whose stages have no MoE layer (the
  // LM head alone) is left alone.
  std::vector<std::vector<int64_t>> sharded;
  auto shard = [&](std::vector<int64_t> devices) {
    if (ep <= 1 || llvm::is_contained(sharded, devices))
      return;
    sharded.push_back(devices);
    ShardOptions sh;
    sh.devices = std::move(devices);
    sh.ep = ep;
    std::string text =
        llvm::formatv("shard devices={0} ep={1}", listDevices(sh.devices), ep);
    Filter experts;
    experts.entries["EP"] = {FilterValue::Any, 0, ""};
    add(sh, text, experts);
  };
  std::vector<std::vector<int64_t>> toShard;
  for (int64_t st = 0; st < stages; ++st) {
    if (schedule.layout == StageLayout::Bidirectional) {
      // Two copies of the model: microbatch m of stage st runs on the group
      // of its direction; each copy is replicated on its own group, and
      // tieSharedParams sums the copies' gradients (over every replica of
      // both). The copies share the stage's segments: one shard directive
      // splits the experts of both.
      std::vector<int64_t> copies;
      for (int64_t m = 0; m < microbatches; ++m) {
        int64_t g = deviceOfTask(schedule.layout, st, m, pp, microbatches);
        if (!llvm::is_contained(copies, g))
          copies.push_back(g);
        PlaceOptions place;
        place.devices = groupDevices(g);
        Filter filter = stageFilter(st);
        filter.entries["MB"] = {FilterValue::Index, m, ""};
        add(place,
            llvm::formatv("place PP={0} MB={1} devices={2}", st, m,
                          listDevices(place.devices))
                .str(),
            filter);
      }
      if (group > 1)
        for (int64_t g : copies)
          replicate(st, groupDevices(g));
      std::vector<int64_t> both;
      for (int64_t g : copies)
        llvm::append_range(both, groupDevices(g));
      llvm::sort(both);
      toShard.push_back(both);
      continue;
    }
    // Stage st runs on pipeline device group g: ranks [g*dp, (g+1)*dp).
    int64_t g = deviceOfStage(schedule.layout, st, pp);
    std::vector<int64_t> devices = groupDevices(g);
    PlaceOptions place;
    place.devices = devices;
    add(place,
        llvm::formatv("place PP={0} devices={1}", st, listDevices(devices))
            .str(),
        stageFilter(st));
    replicate(st, devices);
    toShard.push_back(devices);
  }
  for (std::vector<int64_t> &devices : toShard)
    shard(devices);
  for (Directive &d : buildSchedule(schedule, pp, perDevice, microbatches))
    add(std::move(d.options), d.text, d.filter);
  s.worldSize = layout.worldSize();
  s.summary = llvm::formatv("pp={0} dp={1} microbatches={2} schedule={3}", pp,
                            dp, microbatches, schedule.name)
                  .str();
  if (cp > 1)
    s.summary += llvm::formatv(" cp={0}", cp).str();
  if (tp > 1)
    s.summary += llvm::formatv(" tp={0}", tp).str();
  if (perDevice > 1)
    s.summary += llvm::formatv(" stages={0}", stages).str();
  if (zero)
    s.summary += llvm::formatv(" zero={0}", zero).str();
  if (ep > 1)
    s.summary += llvm::formatv(" ep={0}", ep).str();
  if (bucketMb != kDefaultBucketMb)
    s.summary += " bucket_mb=" + megabytes(bucketMb);
  return s;
}

/// Why the flags cannot make a strategy, in the flags' own words, or "".
static std::string checkFlags(const StrategyFlags &f,
                              const ScheduleBuilder &schedule,
                              int64_t perDevice) {
  if (f.pp < 1 || f.dp < 1 || f.microbatches < 1 || f.tp < 1 || f.cp < 1)
    return "--pp, --dp, --tp, --cp and --microbatches must be positive";
  struct Bound {
    const char *flag;
    int64_t value, limit;
  };
  for (Bound b :
       {Bound{"--pp", f.pp, kMaxStages}, Bound{"--dp", f.dp, kMaxWorldSize},
        Bound{"--tp", f.tp, kMaxWorldSize}, Bound{"--cp", f.cp, kMaxWorldSize},
        Bound{"--microbatches", f.microbatches, kMaxMicrobatches}})
    if (b.value > b.limit)
      return llvm::formatv("{0} must be at most {1}, got {2}", b.flag, b.limit,
                           b.value)
          .str();
  // Each is at most 2^20 here: the product cannot overflow.
  if (f.pp * f.dp > kMaxWorldSize || f.pp * f.dp * f.tp > kMaxWorldSize ||
      f.pp * f.dp * f.tp > kMaxWorldSize / f.cp)
    return llvm::formatv("--pp {0} times --dp {1}{2}{3} is more than the "
                         "limit of {4} devices",
                         f.pp, f.dp,
                         f.cp > 1 ? llvm::formatv(" times --cp {0}", f.cp).str()
                                  : std::string(),
                         f.tp > 1 ? llvm::formatv(" times --tp {0}", f.tp).str()
                                  : std::string(),
                         kMaxWorldSize)
        .str();
  if (f.virtualStages < 0 || f.virtualStages > kMaxStages)
    return llvm::formatv("--virtual-stages must be from 1 to {0} (0: the "
                         "schedule's default), got {1}",
                         kMaxStages, f.virtualStages)
        .str();
  if (f.pp * perDevice > kMaxStages)
    return llvm::formatv("--pp {0} times {1} stages per device group is more "
                         "than the limit of {2} stages",
                         f.pp, perDevice, kMaxStages)
        .str();
  if (std::string err =
          checkStageMicrobatches(f.pp * perDevice, f.microbatches);
      !err.empty())
    return err;
  if (std::string err = schedule.check(f.pp, perDevice, f.microbatches);
      !err.empty())
    return "schedule '" + f.schedule + "' " + err;
  // A layout with one device per pipeline group has no replicate
  // directive, whose verifier would check it.
  if (!(f.bucketMb > 0) || !std::isfinite(f.bucketMb))
    return "--bucket-mb must be a positive number of MB (2^20 bytes), got " +
           megabytes(f.bucketMb);
  if (f.zero > 0 && f.dp * f.cp < 2)
    return llvm::formatv("--zero {0} shards state over the data-parallel "
                         "replicas of a stage, but --dp is {1}; use --dp 2 or "
                         "more",
                         f.zero, f.dp)
        .str();
  if (!f.cpKind.empty() && !parseContextParallelKind(f.cpKind))
    return "--cp-kind must be ring (ring attention) or ulysses (all-to-alls "
           "from the sequence to the heads), got '" +
           f.cpKind + "'";
  if (!f.cpKind.empty() && f.cp < 2)
    return "--cp-kind " + f.cpKind +
           " needs --cp of at least 2 (it picks how context parallelism "
           "splits attention)";
  if (f.recompute != "none" && !parseRecomputeGranularity(f.recompute))
    return "--recompute must be none, full (every transformer block) or "
           "selective (their attention core), got '" +
           f.recompute + "'";
  if (f.sp && f.tp < 2)
    return llvm::formatv("--sp (sequence parallelism) needs --tp of at least "
                         "2: it splits the rows of what tensor parallelism "
                         "leaves whole on every member, got --tp {0}",
                         f.tp)
        .str();
  if (f.cpNoOverlap && f.cp < 2)
    return "--cp-no-overlap needs --cp of at least 2 with --cp-kind ring (it "
           "orders the ring's exchanges after the steps before them)";
  if (f.noVocabParallel && f.tp < 2)
    return "--no-vocab-parallel needs --tp of at least 2 (it keeps the "
           "embedding and LM head whole on every tensor-parallel member)";
  if (f.ep < 1 || !dividesDevices(f.ep, f.dp * f.cp))
    return f.cp > 1
               ? llvm::formatv("--ep {0} must divide --dp {1} x --cp {2} = "
                               "{3}: expert-parallel groups are carved out of "
                               "a stage's data- and context-parallel replicas",
                               f.ep, f.dp, f.cp, f.dp * f.cp)
                     .str()
               : llvm::formatv("--ep {0} must divide --dp {1}: expert-parallel "
                               "groups are carved out of a stage's "
                               "data-parallel replicas",
                               f.ep, f.dp)
                     .str();
  return "";
}

llvm::Expected<Strategy> mlir::piper::buildStrategy(const StrategyFlags &f) {
  const ScheduleBuilder *schedule = findSchedule(f.schedule);
  if (!schedule)
    return llvm::createStringError("unknown schedule '" + f.schedule + "' (" +
                                   scheduleNames() + "; see --schedule help)");
  int64_t perDevice =
      f.virtualStages ? f.virtualStages : defaultStagesPerDevice(*schedule);
  if (std::string err = checkFlags(f, *schedule, perDevice); !err.empty())
    return llvm::createStringError(err);
  Strategy s = strategyFromFlags(f.pp, f.dp, f.microbatches, *schedule, f.zero,
                                 f.ep, perDevice, f.bucketMb, f.tp, f.cp);
  for (Directive &d : s.directives) {
    if (d.kind() == Directive::ContextParallel) {
      auto &o = d.get<ContextParallelOptions>();
      if (!f.cpKind.empty()) {
        o.kind = *parseContextParallelKind(f.cpKind);
        d.text += " kind=" + f.cpKind;
      }
      if (f.cpNoOverlap) {
        o.overlap = false;
        d.text += " overlap=false";
      }
    }
    if (d.kind() == Directive::ShardTensor) {
      auto &o = d.get<ShardTensorOptions>();
      if (f.noVocabParallel) {
        o.vocabParallel = false;
        d.text += " vocab_parallel=false";
      }
      if (f.sp) {
        o.sequenceParallel = true;
        d.text += " sequence_parallel";
      }
    }
  }
  if (f.sp)
    s.summary += " sp";
  if (f.recompute != "none") {
    // Every transformer block: the recompute directive's default filter.
    RecomputeOptions rc;
    rc.granularity = *parseRecomputeGranularity(f.recompute);
    Directive d(rc, "recompute granularity=" + f.recompute);
    d.index = s.directives.size();
    s.directives.push_back(std::move(d));
    s.summary += " recompute=" + f.recompute;
  }
  // The one verifier of directives (Strategy.cpp) checks what the flags
  // built, as it checks a file's: the rules on a directive's values (the
  // ZeRO stage, --cp-kind ulysses without overlap, ...) live there only.
  if (llvm::Error err = verifyStrategy(s))
    return std::move(err);
  return s;
}
