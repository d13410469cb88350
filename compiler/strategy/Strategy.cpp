// Directives and filters as text, and the rules every strategy must follow
// (verifyStrategy), whether parsed (StrategyParse.cpp) or built from flags
// (StrategyFlags.cpp).
#include "compiler/strategy/Strategy.h"

#include <cmath>
#include <map>

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir::piper;

std::string FilterValue::str() const {
  switch (kind) {
  case Index:
    return std::to_string(index);
  case Any:
    return "\"*\"";
  case Pass:
    return "\"" + pass + "\"";
  }
  return "";
}

std::string Filter::str() const {
  std::string out = "{";
  for (const auto &[key, value] : entries)
    out += (out.size() > 1 ? ", \"" : "\"") + key + "\": " + value.str();
  return out + "}";
}

llvm::StringRef mlir::piper::stringify(RecomputeGranularity granularity) {
  return granularity == RecomputeGranularity::Full ? "full" : "selective";
}

llvm::StringRef mlir::piper::stringify(ContextParallelKind kind) {
  return kind == ContextParallelKind::Ring ? "ring" : "ulysses";
}

std::optional<RecomputeGranularity>
mlir::piper::parseRecomputeGranularity(llvm::StringRef name) {
  for (RecomputeGranularity g :
       {RecomputeGranularity::Full, RecomputeGranularity::Selective})
    if (name == stringify(g))
      return g;
  return std::nullopt;
}

std::optional<ContextParallelKind>
mlir::piper::parseContextParallelKind(llvm::StringRef name) {
  for (ContextParallelKind k :
       {ContextParallelKind::Ring, ContextParallelKind::Ulysses})
    if (name == stringify(k))
      return k;
  return std::nullopt;
}

llvm::StringRef Directive::kindName() const {
  switch (kind()) {
  case Directive::Stage:
    return "stage";
  case Directive::Split:
    return "split";
  case Directive::Place:
    return "place";
  case Directive::Replicate:
    return "replicate";
  case Directive::Shard:
    return "shard";
  case Directive::Order:
    return "order";
  case Directive::Schedule:
    return "schedule";
  case Directive::Recompute:
    return "recompute";
  case Directive::ShardTensor:
    return "shard_tensor";
  case Directive::ContextParallel:
    return "context_parallel";
  }
  return "";
}

std::string Directive::describe() const {
  return llvm::formatv("directive #{0} ({1})", index, text).str();
}

std::string mlir::piper::checkStageMicrobatches(int64_t stages,
                                                int64_t microbatches) {
  // Both are at most 2^20 here, so the product cannot overflow.
  if (stages > 0 && microbatches > 0 &&
      stages * microbatches > kMaxStageMicrobatches)
    return llvm::formatv("{0} pipeline stages times {1} microbatches is more "
                         "than the limit of {2} tasks per pass",
                         stages, microbatches, kMaxStageMicrobatches)
        .str();
  return "";
}

int64_t mlir::piper::numStages(const Strategy &strategy) {
  int64_t fromPlacements = 1;
  for (const Directive &d : strategy.directives) {
    if (d.kind() == Directive::Stage)
      return d.get<StageOptions>().stages;
    if (d.kind() != Directive::Place)
      continue;
    auto it = d.filter.entries.find("PP");
    if (it != d.filter.entries.end() && it->second.kind == FilterValue::Index)
      fromPlacements = std::max(fromPlacements, it->second.index + 1);
  }
  return fromPlacements;
}

bool mlir::piper::dividesDevices(int64_t groupSize, int64_t devices) {
  return groupSize >= 1 && devices % groupSize == 0;
}

/// The rules of a list of devices: each in the world, none twice.
static std::string checkDeviceList(const std::vector<int64_t> &devices) {
  if (devices.empty())
    return "\"devices\" must be a non-empty list of device indices";
  if (devices.size() > size_t(kMaxWorldSize))
    return "\"devices\" lists more devices than the world may have";
  // A set, not a search of the list: 2^20 devices made it quadratic.
  llvm::DenseSet<int64_t> listed;
  for (int64_t device : devices) {
    if (device < 0 || device >= kMaxWorldSize)
      return llvm::formatv("\"devices\" entries must be integers from 0 to "
                           "{0}, got {1}",
                           kMaxWorldSize - 1, device)
          .str();
    if (!listed.insert(device).second)
      return llvm::formatv("device {0} is listed twice", device).str();
  }
  return "";
}

/// The split-backward stencil of an order directive (the original Piper's
/// rule): each filter it names with PASS "BI" it also names once with
/// "BW", in a later group, and never with the fused "B".
static std::string checkSplitBackward(const OrderOptions &order) {
  struct Halves {
    int bi = -1, bw = -1;
    bool fused = false;
  };
  std::map<std::string, Halves> bases;
  for (auto [gi, group] : llvm::enumerate(order.groups))
    for (const Filter &f : group) {
      auto pass = f.entries.find("PASS");
      if (pass == f.entries.end() || pass->second.kind != FilterValue::Pass)
        continue;
      Filter base = f;
      base.entries.erase("PASS");
      Halves &h = bases[base.str()];
      const std::string &p = pass->second.pass;
      int g = static_cast<int>(gi);
      if (p == "B") {
        h.fused = true;
      } else if (p == "BI" || p == "BW") {
        int &at = p == "BI" ? h.bi : h.bw;
        if (at >= 0)
          return llvm::formatv("names PASS \"{0}\" for {1} twice (groups "
                               "{2} and {3})",
                               p, base.str(), at, g)
              .str();
        at = g;
      }
    }
  for (const auto &[base, h] : bases) {
    if (h.bi < 0 && h.bw < 0)
      continue;
    const char *rule = "a split backward needs one \"BI\" and one \"BW\" "
                       "for the same filter, \"BI\" first";
    if (h.bw < 0)
      return llvm::formatv("names PASS \"BI\" for {0} without \"BW\": {1}",
                           base, rule)
          .str();
    if (h.bi < 0)
      return llvm::formatv("names PASS \"BW\" for {0} without \"BI\": {1}",
                           base, rule)
          .str();
    if (h.bw <= h.bi)
      return llvm::formatv("names PASS \"BW\" for {0} in group {1}, not "
                           "after its \"BI\" in group {2}: {3}",
                           base, h.bw, h.bi, rule)
          .str();
    if (h.fused)
      return llvm::formatv("names {0} both fused (PASS \"B\") and split "
                           "(\"BI\"/\"BW\")",
                           base)
          .str();
  }
  return "";
}

/// Why a filter's indices are out of range, or "".
static std::string checkFilter(const Filter &filter) {
  for (const auto &[key, value] : filter.entries)
    if (value.kind == FilterValue::Index &&
        (value.index < 0 || value.index >= kMaxFilterIndex))
      return llvm::formatv("filter {0} must be an index from 0 to {1} or "
                           "\"*\", got {2}",
                           key, kMaxFilterIndex - 1, value.index)
          .str();
  return "";
}

/// Why one directive breaks a rule that does not depend on how it was
/// written (JSON, flags or a pass's options), or "".
static std::string checkDirective(const Directive &d) {
  if (std::string err = checkFilter(d.filter); !err.empty())
    return err;
  auto between = [](const char *key, int64_t value, int64_t lo, int64_t hi) {
    if (value >= lo && value <= hi)
      return std::string();
    if (lo == 1)
      return value < 1
                 ? llvm::formatv("\"{0}\" must be positive", key).str()
                 : llvm::formatv("\"{0}\" must be at most {1}", key, hi).str();
    return llvm::formatv("\"{0}\" must be between {1} and {2}, got {3}", key,
                         lo, hi, value)
        .str();
  };
  auto stream = [](const std::string &name) {
    return name.empty() ? std::string("\"stream\" must name a stream")
                        : std::string();
  };
  switch (d.kind()) {
  case Directive::Stage:
    return between("stages", d.get<StageOptions>().stages, 1, kMaxStages);
  case Directive::Split:
    if (!d.filter.entries.empty())
      return "split supports only the empty filter {} (the whole DAG)";
    return between("num_microbatches", d.get<SplitOptions>().microbatches, 1,
                   kMaxMicrobatches);
  case Directive::Place: {
    const auto &o = d.get<PlaceOptions>();
    if (std::string err = checkDeviceList(o.devices); !err.empty())
      return err;
    return stream(o.stream);
  }
  case Directive::Replicate: {
    const auto &o = d.get<ReplicateOptions>();
    if (std::string err = checkDeviceList(o.devices); !err.empty())
      return err;
    if (o.zero < 0 || o.zero > 3)
      return llvm::formatv("\"zero\" must be the ZeRO stage: 0, 1, 2 or 3, "
                           "got {0}",
                           o.zero)
          .str();
    if (!(o.bucketMb > 0) || !std::isfinite(o.bucketMb))
      return "\"bucket_size\" must be a positive number of MB (2^20 bytes)";
    if (o.reduceStream.empty() || o.gatherStream.empty())
      return "\"reduce_stream\" and \"gather_stream\" must name streams";
    return "";
  }
  case Directive::Shard: {
    const auto &o = d.get<ShardOptions>();
    if (std::string err = checkDeviceList(o.devices); !err.empty())
      return err;
    if (o.ep != 0 &&
        !dividesDevices(o.ep, static_cast<int64_t>(o.devices.size())))
      return llvm::formatv("\"ep\" must divide the {0} devices (expert "
                           "groups are carved out of them)",
                           o.devices.size())
          .str();
    return stream(o.stream);
  }
  case Directive::Order: {
    const auto &o = d.get<OrderOptions>();
    if (o.groups.empty())
      return "\"filters\" must not be empty";
    if (o.groups.size() > size_t(kMaxOrderGroups))
      return llvm::formatv("\"filters\" has {0} groups, more than the limit "
                           "of {1}",
                           o.groups.size(), kMaxOrderGroups)
          .str();
    for (const std::vector<Filter> &group : o.groups) {
      if (group.empty())
        return "each entry of \"filters\" must be a non-empty list of "
               "filters";
      for (const Filter &filter : group)
        if (std::string err = checkFilter(filter); !err.empty())
          return err;
    }
    return checkSplitBackward(o);
  }
  case Directive::Schedule:
    if (!findSchedule(d.get<ScheduleOptions>().name))
      return llvm::formatv("unknown schedule \"{0}\" (expected {1})",
                           d.get<ScheduleOptions>().name, scheduleNames())
          .str();
    return "";
  case Directive::Recompute:
    return "";
  case Directive::ShardTensor: {
    const auto &o = d.get<ShardTensorOptions>();
    if (std::string err = between("tp", o.tp, 2, kMaxWorldSize); !err.empty())
      return err;
    return stream(o.stream);
  }
  case Directive::ContextParallel: {
    const auto &o = d.get<ContextParallelOptions>();
    if (std::string err = between("cp", o.cp, 2, kMaxWorldSize); !err.empty())
      return err;
    if (!o.overlap && o.kind != ContextParallelKind::Ring)
      return ("\"overlap\" orders the ring's exchanges; kind \"" +
              stringify(o.kind) + "\" has none to order")
          .str();
    return stream(o.stream);
  }
  }
  return "";
}

llvm::Error mlir::piper::verifyDirective(const Directive &d) {
  if (std::string err = checkDirective(d); !err.empty())
    return llvm::createStringError(d.describe() + ": " + err);
  return llvm::Error::success();
}

llvm::Error mlir::piper::verifyStrategy(const Strategy &strategy) {
  int64_t microbatches = 1;
  for (const Directive &d : strategy.directives) {
    if (llvm::Error err = verifyDirective(d))
      return err;
    if (d.kind() == Directive::Split)
      microbatches = std::max(microbatches, d.get<SplitOptions>().microbatches);
  }
  if (std::string err =
          checkStageMicrobatches(numStages(strategy), microbatches);
      !err.empty())
    return llvm::createStringError(err);
  return llvm::Error::success();
}
