// Directives and filters as text, and the rules every strategy must follow
// (verifyStrategy), whether parsed (StrategyParse.cpp) or built from flags
// (StrategyFlags.cpp).
#include "compiler/strategy/Strategy.h"

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

llvm::StringRef Directive::kindName() const {
  switch (kind) {
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
    if (d.kind == Directive::Stage)
      return d.stages;
    if (d.kind != Directive::Place)
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

/// The rules of one directive that do not depend on how it was written.
static llvm::Error verifyDirective(const Directive &d) {
  auto fail = [&](const std::string &msg) {
    return llvm::createStringError(d.describe() + ": " + msg);
  };
  switch (d.kind) {
  case Directive::Stage:
    if (d.stages < 1)
      return fail("\"stages\" must be positive");
    if (d.stages > kMaxStages)
      return fail(
          llvm::formatv("\"stages\" must be at most {0}", kMaxStages).str());
    break;
  case Directive::Split:
    if (d.numMicrobatches < 1)
      return fail("\"num_microbatches\" must be positive");
    if (d.numMicrobatches > kMaxMicrobatches)
      return fail(llvm::formatv("\"num_microbatches\" must be at most {0}",
                                kMaxMicrobatches)
                      .str());
    break;
  case Directive::ShardTensor:
    if (d.tensorParallel < 2 || d.tensorParallel > kMaxWorldSize)
      return fail(llvm::formatv("\"tp\" must be between 2 and {0}, got {1}",
                                kMaxWorldSize, d.tensorParallel)
                      .str());
    if (d.stream.empty())
      return fail("\"stream\" must name a stream");
    break;
  case Directive::ContextParallel:
    if (d.contextParallel < 2 || d.contextParallel > kMaxWorldSize)
      return fail(llvm::formatv("\"cp\" must be between 2 and {0}, got {1}",
                                kMaxWorldSize, d.contextParallel)
                      .str());
    if (d.cpKind != "ring" && d.cpKind != "ulysses")
      return fail("\"kind\" must be \"ring\" (ring attention) or "
                  "\"ulysses\" (all-to-alls to heads), got \"" +
                  d.cpKind + "\"");
    if (!d.cpOverlap && d.cpKind != "ring")
      return fail("\"overlap\" orders the ring's exchanges; kind \"" +
                  d.cpKind + "\" has none to order");
    if (d.stream.empty())
      return fail("\"stream\" must name a stream");
    break;
  case Directive::Shard:
    if (!dividesDevices(d.expertParallel,
                        static_cast<int64_t>(d.devices.size())))
      return fail(llvm::formatv("\"ep\" must divide the {0} devices (expert "
                                "groups are carved out of them)",
                                d.devices.size())
                      .str());
    break;
  default:
    break;
  }
  return llvm::Error::success();
}

llvm::Error mlir::piper::verifyStrategy(const Strategy &strategy) {
  int64_t microbatches = 1;
  for (const Directive &d : strategy.directives) {
    if (llvm::Error err = verifyDirective(d))
      return err;
    if (d.kind == Directive::Split)
      microbatches = std::max(microbatches, d.numMicrobatches);
  }
  if (std::string err = checkStageMicrobatches(numStages(strategy),
                                               microbatches);
      !err.empty())
    return llvm::createStringError(err);
  return llvm::Error::success();
}
