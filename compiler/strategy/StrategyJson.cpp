// A strategy as the JSON file parseStrategy reads (docs/directives.md): what
// `piperc search` writes for each strategy it ranks, so that `piperc compile
// --strategy FILE` compiles exactly the strategy the search compiled.
#include "compiler/strategy/Strategy.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir::piper;
namespace json = llvm::json;

static json::Value toJson(const FilterValue &v) {
  switch (v.kind) {
  case FilterValue::Index:
    return v.index;
  case FilterValue::Any:
    return "*";
  case FilterValue::Pass:
    return v.pass;
  }
  llvm_unreachable("filter value kind");
}

static json::Object toJson(const Filter &f) {
  json::Object obj;
  for (const auto &[key, value] : f.entries)
    obj[key] = toJson(value);
  return obj;
}

static json::Array devicesJson(const std::vector<int64_t> &devices) {
  json::Array list;
  for (int64_t d : devices)
    list.push_back(d);
  return list;
}

/// The keys of one directive's options (its "op" and filter are added by
/// the caller).
namespace {
struct OptionsJson {
  json::Object &obj;
  void operator()(const StageOptions &o) { obj["stages"] = o.stages; }
  void operator()(const SplitOptions &o) {
    obj["num_microbatches"] = o.microbatches;
  }
  void operator()(const PlaceOptions &o) {
    obj["devices"] = devicesJson(o.devices);
    obj["stream"] = o.stream;
  }
  void operator()(const ReplicateOptions &o) {
    obj["devices"] = devicesJson(o.devices);
    obj["reduce_stream"] = o.reduceStream;
    obj["gather_stream"] = o.gatherStream;
    obj["bucket_size"] = o.bucketMb;
    obj["zero"] = o.zero;
  }
  void operator()(const ShardOptions &o) {
    obj["devices"] = devicesJson(o.devices);
    obj["ep"] = o.ep;
    obj["stream"] = o.stream;
  }
  void operator()(const OrderOptions &o) {
    json::Array groups;
    for (const std::vector<Filter> &group : o.groups) {
      json::Array filters;
      for (const Filter &f : group)
        filters.push_back(toJson(f));
      groups.push_back(std::move(filters));
    }
    obj["filters"] = std::move(groups);
  }
  void operator()(const ScheduleOptions &o) { obj["name"] = o.name; }
  void operator()(const RecomputeOptions &o) {
    obj["granularity"] = stringify(o.granularity);
  }
  void operator()(const ShardTensorOptions &o) {
    obj["tp"] = o.tp;
    obj["sequence_parallel"] = o.sequenceParallel;
    obj["vocab_parallel"] = o.vocabParallel;
    obj["stream"] = o.stream;
  }
  void operator()(const ContextParallelOptions &o) {
    obj["cp"] = o.cp;
    obj["kind"] = stringify(o.kind);
    obj["overlap"] = o.overlap;
    obj["stream"] = o.stream;
  }
};
} // namespace

std::string mlir::piper::strategyToJson(const Strategy &strategy) {
  json::Array directives;
  for (const Directive &d : strategy.directives) {
    json::Object obj;
    obj["op"] = d.kindName();
    // place, replicate and shard always name their nodes; split, recompute
    // and shard_tensor default to all of them; the others take no filter.
    switch (d.kind()) {
    case Directive::Place:
    case Directive::Replicate:
    case Directive::Shard:
      obj["filter"] = toJson(d.filter);
      break;
    case Directive::Split:
    case Directive::Recompute:
    case Directive::ShardTensor:
      if (!d.filter.entries.empty())
        obj["filter"] = toJson(d.filter);
      break;
    default:
      break;
    }
    std::visit(OptionsJson{obj}, d.options);
    directives.push_back(std::move(obj));
  }
  json::Object top;
  if (strategy.worldSize)
    top["world_size"] = *strategy.worldSize;
  if (!strategy.summary.empty())
    top["summary"] = strategy.summary;
  top["directives"] = std::move(directives);
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("{0:2}", json::Value(std::move(top))) << "\n";
  return text;
}
