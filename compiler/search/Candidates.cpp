// The search space: every strategy of the axes Piper has for a model on N
// devices, the rules that prune it for free, a lower bound on any rank's
// parameter state, and a rough estimate that orders what is compiled first.
// docs/search.md derives the bound and states what the estimate ignores.
#include "compiler/search/Search.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace mlir::piper;
using namespace mlir::piper::search;

namespace {
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0)
      out.push_back(d);
  return out;
}

int64_t stagesPerDevice(const StrategyFlags &f) {
  const ScheduleBuilder *schedule = findSchedule(f.schedule);
  return f.virtualStages > 0 ? f.virtualStages
                             : defaultStagesPerDevice(*schedule);
}

/// The time of collectives and transfers over `members` ranks `stride`
/// apart: within one node (the node's link) or across nodes.
struct Links {
  const ::piper::plan::Machine &m;
  /// `bytes` sent in `messages` latencies (the simulator's model).
  double seconds(double bytes, int64_t members, int64_t stride,
                 double messages = 1) const {
    bool withinNode =
        m.devicesPerNode > 0 && members * stride <= m.devicesPerNode;
    double bw = withinNode ? m.nodeLinkBytesPerSecond : m.linkBytesPerSecond;
    double latency =
        withinNode ? m.nodeLinkLatencySeconds : m.linkLatencySeconds;
    return messages * latency + (bw > 0 && std::isfinite(bw) ? bytes / bw : 0);
  }
  /// A ring all-reduce of `bytes`: two passes, each member sending
  /// (n-1)/n of it in each.
  double allReduce(double bytes, int64_t n, int64_t stride) const {
    return n > 1 ? seconds(2.0 * double(n - 1) / double(n) * bytes, n, stride,
                           /*messages=*/2)
                 : 0;
  }
  double allToAll(double bytes, int64_t n, int64_t stride) const {
    return n > 1 ? seconds(double(n - 1) / double(n) * bytes, n, stride) : 0;
  }
};

/// The share of (pp - 1) / v microbatch times a schedule leaves idle, a
/// prior from the schedules' papers (docs/search.md): only to order
/// compiles; the simulator runs the real schedule.
double bubblePrior(llvm::StringRef schedule) {
  if (schedule == "zb-h1")
    return 1.0 / 3;
  if (schedule == "zb-h2" || schedule == "zbv")
    return 0.1;
  if (schedule == "dualpipe" || schedule == "dualpipev")
    return 0.25;
  return 1.0; // gpipe, 1f1b, interleaved-1f1b
}

/// The rough step time and peak of `c` (docs/search.md §3).
void estimate(Candidate &c, const ModelFacts &m, const SearchOptions &o) {
  const StrategyFlags &f = c.flags;
  const Links links{o.machine};
  const double elt = o.opt.dtype == ComputeType::bf16 ? 2 : 4;
  const double rate =
      o.machine.flopsPerSecond > 0 ? o.machine.flopsPerSecond : 1e300;
  const int64_t v = stagesPerDevice(f);
  const int64_t stageSize = f.dp * f.cp * f.tp;
  double recompute = f.recompute == "full"        ? m.forwardFlops
                     : f.recompute == "selective" ? m.attentionFlops
                                                  : 0;
  double perMicrobatch =
      (3 * m.forwardFlops + recompute) / double(f.pp * f.tp * f.cp) / rate;
  double layersHere = double(m.layers) / double(f.pp);
  double tokens = double(m.batch * m.seq) / double(f.cp);
  double act = tokens * double(m.hidden) * elt;
  double perMicrobatchComm =
      layersHere * 4 * links.allReduce(act, f.tp, 1) +
      (f.cp > 1 && f.cpKind == "ulysses"
           ? layersHere * 4 * links.allToAll(2 * act, f.cp, f.tp)
           : 0) +
      (f.cp > 1 && f.cpKind != "ulysses"
           ? layersHere * 1.5 * double(f.cp - 1) *
                 links.seconds(2 * act * double(m.kvHeads) / double(m.heads),
                               f.cp, f.tp)
           : 0) +
      (m.experts > 0
           ? layersHere * 4 *
                 links.allToAll(double(m.dispatchRows) * double(m.hidden) *
                                    elt / double(f.cp),
                                f.ep, f.cp * f.tp)
           : 0) +
      (f.pp > 1 ? 2 * links.seconds(act / double(f.tp), 2, stageSize) : 0);
  double gradBytes =
      4 * (double(m.denseParams) + double(m.expertParams) / double(f.ep)) /
      double(f.pp * f.tp);
  // Half of it hidden under the backward, unless communication takes the
  // compute's time too (CPU ranks).
  double exposed = o.machine.commUsesCompute ? 1.0 : 0.5;
  double dataParallel = exposed * (f.zero == 3 ? 1.5 : 1.0) *
                        links.allReduce(gradBytes, f.dp, f.cp * f.tp);
  double bubble = bubblePrior(f.schedule) * double(f.pp - 1) / double(v) *
                  (perMicrobatch + perMicrobatchComm);
  c.estimateSeconds =
      double(f.microbatches) * (perMicrobatch + perMicrobatchComm) + bubble +
      dataParallel;
  // Activations: Megatron's 34 s b h bytes per layer in 16-bit (17
  // elements; with the input alone under full recomputation), for the
  // microbatches in flight, and the logits once.
  const ScheduleBuilder *schedule = findSchedule(f.schedule);
  int64_t inFlight =
      f.schedule == "gpipe"
          ? f.microbatches
          : std::min<int64_t>(f.microbatches,
                              schedule->layout == StageLayout::V ||
                                      schedule->layout ==
                                          StageLayout::Bidirectional
                                  ? 2 * f.pp
                                  : f.pp);
  double perLayer = (f.recompute == "full" ? 1 : 17) * tokens *
                    double(m.hidden) * elt / double(f.tp);
  double logits = tokens * double(m.vocab) * 4 / double(f.tp);
  c.estimatePeakBytes =
      c.stateLowerBound +
      static_cast<int64_t>(double(inFlight) * layersHere * perLayer + logits);
}

/// Enumerates the axes in a fixed order, calling `emit` for each candidate
/// the rules admit and `prune` with the rule of each they do not.
class Space {
public:
  Space(const ModelFacts &m, const SearchOptions &o) : m(m), o(o) {}

  template <typename Emit, typename Prune>
  void forEach(Emit emit, Prune prune) const {
    for (int64_t pp : divisors(o.devices))
      for (int64_t tp : divisors(o.devices / pp))
        for (int64_t cp : divisors(o.devices / pp / tp)) {
          StrategyFlags f;
          f.pp = pp;
          f.tp = tp;
          f.cp = cp;
          f.dp = o.devices / pp / tp / cp;
          if (std::string rule = layoutRule(f); !rule.empty()) {
            prune(rule);
            continue;
          }
          f.microbatches = o.globalBatch / (f.dp * m.batch);
          forSchedules(f, emit, prune);
        }
  }

private:
  /// Why the degrees cannot split this model, or "".
  std::string layoutRule(const StrategyFlags &f) const {
    if (o.globalBatch % (f.dp * m.batch) != 0)
      return "the global batch is not a multiple of dp x the microbatch size";
    if (m.heads % f.tp || m.kvHeads % f.tp)
      return "tp must divide the heads and key/value heads";
    if (m.vocab % f.tp)
      return "tp must divide the vocabulary (vocabulary parallelism)";
    if (m.seq % (2 * f.cp))
      return "the sequence must be a multiple of 2 x cp";
    if (f.pp > m.layers)
      return "more pipeline device groups than transformer blocks";
    return "";
  }

  template <typename Emit, typename Prune>
  void forSchedules(StrategyFlags f, Emit &emit, Prune &prune) const {
    for (const ScheduleBuilder &schedule : getScheduleBuilders()) {
      // One device group: every schedule is 1F1B's order or worse.
      if (f.pp == 1 && schedule.name != "1f1b")
        continue;
      f.schedule = schedule.name.str();
      std::vector<int64_t> perDevice = {defaultStagesPerDevice(schedule)};
      // Interleaved: 2 and 4 stages per device group, and every count up
      // to 8 that splits the blocks evenly (Megatron's rule for its virtual
      // pipeline: layers a multiple of pp x v).
      if (schedule.layout == StageLayout::Interleaved) {
        perDevice = {2, 4};
        for (int64_t v = 3; v <= 8; ++v)
          if (v != 4 && m.layers % (f.pp * v) == 0)
            perDevice.push_back(v);
      }
      for (int64_t v : perDevice) {
        f.virtualStages = v;
        if (f.pp * v > m.layers) {
          prune("more pipeline stages than transformer blocks");
          continue;
        }
        if (f.microbatches > kMaxMicrobatches ||
            !checkStageMicrobatches(f.pp * v, f.microbatches).empty()) {
          prune("more microbatches than piperc's limits");
          continue;
        }
        if (std::string err = schedule.check(f.pp, v, f.microbatches);
            !err.empty()) {
          prune(("the schedule's needs (" + schedule.name + ")").str());
          continue;
        }
        forParallel(f, emit, prune);
      }
    }
  }

  template <typename Emit, typename Prune>
  void forParallel(StrategyFlags f, Emit &emit, Prune &prune) const {
    std::vector<std::string> cpKinds = {""};
    if (f.cp > 1)
      cpKinds = {"ring", "ulysses"};
    std::vector<int64_t> eps = {1};
    if (m.experts > 0)
      eps = divisors(f.dp);
    std::vector<int> zeros = {0};
    if (f.dp > 1)
      zeros = {0, 1, 2, 3};
    std::vector<double> buckets = {kDefaultBucketMb};
    if (f.dp > 1)
      buckets = o.bucketsMb;
    for (const std::string &kind : cpKinds) {
      f.cpKind = kind;
      if (kind == "ulysses" &&
          (m.heads % (f.cp * f.tp) || m.kvHeads % (f.cp * f.tp))) {
        prune("ulysses: cp x tp must divide the heads and key/value heads");
        continue;
      }
      for (int64_t ep : eps) {
        f.ep = ep;
        if (ep > 1 && m.experts % ep) {
          prune("ep must divide the experts");
          continue;
        }
        for (bool sp : f.tp > 1 ? std::vector<bool>{false, true}
                                : std::vector<bool>{false})
          for (int zero : zeros)
            for (double bucket : buckets)
              for (const char *recompute : {"none", "selective", "full"}) {
                f.sp = sp;
                f.zero = zero;
                f.bucketMb = bucket;
                f.recompute = recompute;
                emit(f);
              }
      }
    }
  }

  const ModelFacts &m;
  const SearchOptions &o;
};
} // namespace

int64_t search::stateLowerBound(const ModelFacts &m, const StrategyFlags &f) {
  // Any rank holds at least the average: each parameter element is split at
  // most tp ways (and an expert weight at most tp x ep ways) and held by
  // every replica; ZeRO divides what it shards by its replicas, dp x cp
  // (context-parallel members hold the same parameters). Per element: the
  // float32 value (4 bytes, ZeRO-3 sharded), its gradient (4, ZeRO-2) and
  // AdamW's two moments (8, ZeRO-1).
  double elements =
      (double(m.denseParams) + double(m.expertParams) / double(f.ep)) /
      double(f.pp * f.tp);
  double dp = double(f.dp * f.cp);
  double perElement = (f.zero >= 3 ? 4 / dp : 4) + (f.zero >= 2 ? 4 / dp : 4) +
                      (f.zero >= 1 ? 8 / dp : 8);
  return static_cast<int64_t>(std::floor(elements * perElement));
}

std::vector<Candidate> search::enumerateCandidates(const ModelFacts &facts,
                                                   const SearchOptions &options,
                                                   SearchCounts &counts) {
  std::vector<Candidate> out;
  Space(facts, options)
      .forEach(
          [&](const StrategyFlags &f) {
            ++counts.enumerated;
            Candidate c;
            c.flags = f;
            c.index = counts.enumerated - 1;
            c.stateLowerBound = stateLowerBound(facts, f);
            if (c.stateLowerBound > options.deviceMemory) {
              ++counts.prunedByMemory;
              return;
            }
            estimate(c, facts, options);
            out.push_back(std::move(c));
          },
          [&](const std::string &rule) {
            ++counts.enumerated;
            ++counts.prunedByRule;
            ++counts.rules[rule];
          });
  // Most promising first: those estimated to fit before the others, each
  // by its estimated step time; ties keep the enumeration order. The best
  // of every layout (the degrees, SP, the CP kind) comes before any second
  // of one: the estimate orders layouts worst (it knows the least about
  // their communication), and a layout's schedules, ZeRO stages and
  // recomputation differ less than layouts do.
  auto key = [&](const Candidate &c) {
    return std::make_tuple(c.estimatePeakBytes > options.deviceMemory,
                           c.estimateSeconds, c.index);
  };
  std::sort(
      out.begin(), out.end(),
      [&](const Candidate &a, const Candidate &b) { return key(a) < key(b); });
  std::set<std::string> seen;
  std::vector<Candidate> first, rest;
  for (Candidate &c : out)
    (seen.insert(layoutName(c.flags)).second ? first : rest)
        .push_back(std::move(c));
  llvm::append_range(first, rest);
  return first;
}

std::string search::layoutName(const StrategyFlags &f) {
  std::string out = llvm::formatv("pp{0} dp{1}", f.pp, f.dp).str();
  if (f.tp > 1)
    out += llvm::formatv(" tp{0}{1}", f.tp, f.sp ? "+sp" : "").str();
  if (f.cp > 1)
    out +=
        llvm::formatv(" cp{0}({1})", f.cp, f.cpKind.empty() ? "ring" : f.cpKind)
            .str();
  if (f.ep > 1)
    out += llvm::formatv(" ep{0}", f.ep).str();
  return out;
}
