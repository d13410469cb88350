// Parsing of strategy files: the JSON directive list (or object with a
// world size), each directive's keys and filters, checked against the rules
// every strategy follows (verifyStrategy, Strategy.cpp).
#include "compiler/strategy/Strategy.h"

#include "compiler/strategy/JsonScan.h"
#include "dialects/piper/PiperDialect.h"
#include "proto/InputFile.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

using namespace mlir::piper;
namespace json = llvm::json;

namespace {
/// How much of a directive's text diagnostics quote.
constexpr size_t kMaxQuotedDirective = 200;

/// Parses one directive object into its kind's options: the keys it may
/// have and their JSON types. The rules on their values are the one
/// verifier's (verifyDirective, Strategy.cpp), which parseStrategy runs on
/// every directive. Errors are prefixed with the directive's description.
class DirectiveParser {
public:
  DirectiveParser(const json::Object &obj, int index, std::string text)
      : obj(obj) {
    d.index = index;
    d.text = std::move(text);
  }

  llvm::Expected<Directive> parse() {
    std::optional<llvm::StringRef> op = obj.getString("op");
    if (!op)
      return fail("missing string key \"op\"");
    llvm::StringSet<> allowed = {"op"};
    if (auto e = parseKind(*op, allowed))
      return std::move(e);
    for (const auto &kv : obj)
      if (!allowed.contains(kv.first.str()))
        return fail(llvm::formatv("unknown key \"{0}\" for {1}", kv.first.str(),
                                  d.kindName())
                        .str());
    return d;
  }

private:
  /// Reads the keys of directive kind `op` into `d` and adds them to
  /// `allowed`, the keys that directive may have; the parseKIND functions
  /// below do the same for one kind each.
  llvm::Error parseKind(llvm::StringRef op, llvm::StringSet<> &allowed) {
    if (op == "stage")
      return parseStage(allowed);
    if (op == "split")
      return parseSplit(allowed);
    if (op == "place")
      return parsePlace(allowed);
    if (op == "replicate")
      return parseReplicate(allowed);
    if (op == "order")
      return parseOrder(allowed);
    if (op == "schedule")
      return parseSchedule(allowed);
    if (op == "shard")
      return parseShard(allowed);
    if (op == "recompute")
      return parseRecompute(allowed);
    if (op == "shard_tensor")
      return parseShardTensor(allowed);
    if (op == "context_parallel")
      return parseContextParallel(allowed);
    return fail(llvm::formatv("unknown directive \"{0}\" (expected stage, "
                              "split, place, replicate, shard, order, "
                              "schedule, recompute, shard_tensor or "
                              "context_parallel)",
                              op)
                    .str());
  }

  /// Makes `d` a directive of options T and returns them.
  template <typename T> T &become() {
    d.options = T();
    return d.get<T>();
  }

  /// "stage": the number of stages.
  llvm::Error parseStage(llvm::StringSet<> &allowed) {
    auto &o = become<StageOptions>();
    allowed.insert("stages");
    return getInt("stages", o.stages, /*required=*/true);
  }

  /// "split": microbatches over the whole DAG, along "MB" only.
  llvm::Error parseSplit(llvm::StringSet<> &allowed) {
    auto &o = become<SplitOptions>();
    for (auto k : {"filter", "dim_name", "num_microbatches"})
      allowed.insert(k);
    if (auto e = getFilter("filter", d.filter, /*required=*/false))
      return e;
    if (auto e = getInt("num_microbatches", o.microbatches, true))
      return e;
    std::string dim = "MB";
    if (auto e = getString("dim_name", dim))
      return e;
    if (dim != "MB")
      return fail("only the \"MB\" split dimension is supported");
    return llvm::Error::success();
  }

  /// "place": a filter, its devices and the stream of its transfers.
  llvm::Error parsePlace(llvm::StringSet<> &allowed) {
    auto &o = become<PlaceOptions>();
    for (auto k : {"filter", "devices", "stream"})
      allowed.insert(k);
    if (auto e = getFilter("filter", d.filter, /*required=*/true))
      return e;
    if (auto e = getDevices(o.devices))
      return e;
    return getString("stream", o.stream);
  }

  /// "replicate": a filter, its devices, the ZeRO stage, the reduce and
  /// gather streams and the gradient bucket size.
  llvm::Error parseReplicate(llvm::StringSet<> &allowed) {
    auto &o = become<ReplicateOptions>();
    for (auto k : {"filter", "devices", "reduce_stream", "gather_stream",
                   "bucket_size", "shard_grads", "shard_params", "zero"})
      allowed.insert(k);
    if (auto e = getFilter("filter", d.filter, /*required=*/true))
      return e;
    if (auto e = getDevices(o.devices))
      return e;
    if (auto e = getZeroStage(o.zero))
      return e;
    if (obj.get("stream"))
      return fail("replicate takes \"reduce_stream\", not \"stream\"");
    if (auto e = getString("reduce_stream", o.reduceStream))
      return e;
    o.gatherStream = o.reduceStream;
    if (auto e = getString("gather_stream", o.gatherStream))
      return e;
    if (const json::Value *b = obj.get("bucket_size")) {
      std::optional<double> mb = b->getAsNumber();
      if (!mb)
        return fail("\"bucket_size\" must be a number of MB");
      o.bucketMb = *mb;
    }
    return llvm::Error::success();
  }

  /// ZeRO: the original Piper's booleans (shard_grads: ZeRO-2,
  /// shard_params: ZeRO-3), or the stage itself ("zero": 0-3, which
  /// alone can say ZeRO-1); the two must agree.
  llvm::Error getZeroStage(int &zero) {
    bool shardGrads = false, shardParams = false;
    if (auto e = getBool("shard_grads", shardGrads))
      return e;
    if (auto e = getBool("shard_params", shardParams))
      return e;
    zero = shardParams ? 3 : shardGrads ? 2 : 0;
    if (const json::Value *z = obj.get("zero")) {
      std::optional<int64_t> stage = z->getAsInteger();
      if (!stage || *stage < 0 || *stage > 3)
        return fail("\"zero\" must be the ZeRO stage: 0, 1, 2 or 3");
      if ((shardGrads && *stage < 2) || (shardParams && *stage < 3))
        return fail(
            llvm::formatv("\"zero\": {0} contradicts \"{1}\": true "
                          "(shard_grads is ZeRO-2, shard_params ZeRO-3)",
                          *stage, shardParams ? "shard_params" : "shard_grads")
                .str());
      zero = static_cast<int>(*stage);
    }
    return llvm::Error::success();
  }

  /// "order": a list of groups of filters, in the order their tasks run.
  llvm::Error parseOrder(llvm::StringSet<> &allowed) {
    auto &o = become<OrderOptions>();
    allowed.insert("filters");
    const json::Array *rows = obj.getArray("filters");
    if (!rows)
      return fail("missing list key \"filters\" (a list of groups)");
    // Checked before reading them: the verifier's limit, which a huge list
    // would otherwise copy in full first.
    if (rows->size() > kMaxOrderGroups)
      return fail(llvm::formatv("\"filters\" has {0} groups, more than the "
                                "limit of {1}",
                                rows->size(), kMaxOrderGroups)
                      .str());
    for (const json::Value &row : *rows) {
      const json::Array *group = row.getAsArray();
      if (!group)
        return fail("each entry of \"filters\" must be a non-empty list of "
                    "filters");
      std::vector<Filter> filters;
      for (const json::Value &f : *group) {
        Filter filter;
        if (auto e = parseFilter(f, filter))
          return e;
        filters.push_back(std::move(filter));
      }
      o.groups.push_back(std::move(filters));
    }
    return llvm::Error::success();
  }

  /// "schedule": the name of a pipeline schedule.
  llvm::Error parseSchedule(llvm::StringSet<> &allowed) {
    auto &o = become<ScheduleOptions>();
    allowed.insert("name");
    std::optional<llvm::StringRef> name = obj.getString("name");
    if (!name)
      return fail(
          "missing string key \"name\" (a schedule: " + scheduleNames() + ")");
    o.name = name->str();
    return llvm::Error::success();
  }

  /// "shard": expert parallelism. The MoE layers of the stage placed on
  /// `devices` (its data-parallel group) split their experts over
  /// consecutive groups of `ep` of them (default: all).
  llvm::Error parseShard(llvm::StringSet<> &allowed) {
    auto &o = become<ShardOptions>();
    for (auto k : {"filter", "devices", "stream", "ep"})
      allowed.insert(k);
    if (auto e = getFilter("filter", d.filter, /*required=*/true))
      return e;
    for (const auto &[key, value] : d.filter.entries)
      if (key == "EP" ? value.kind != FilterValue::Any : key != "PP")
        return fail("shard selects expert regions with \"EP\": \"*\" "
                    "and optionally \"PP\", not \"" +
                    key + "\"" + (key == "EP" ? " with an index" : ""));
    if (auto e = getDevices(o.devices))
      return e;
    if (auto e = getString("stream", o.stream))
      return e;
    o.ep = static_cast<int64_t>(o.devices.size());
    return getInt("ep", o.ep, /*required=*/false);
  }

  /// "recompute": the model blocks (by `block`; all transformer blocks when
  /// the filter is absent or "*") whose activations the backward
  /// recomputes, wholly ("full") or their attention core ("selective").
  llvm::Error parseRecompute(llvm::StringSet<> &allowed) {
    auto &o = become<RecomputeOptions>();
    for (auto k : {"filter", "granularity"})
      allowed.insert(k);
    if (const json::Value *f = obj.get("filter"))
      if (auto e = parseFilter(*f, d.filter, kRecomputeFilterKeys))
        return e;
    std::string granularity = "full";
    if (auto e = getString("granularity", granularity))
      return e;
    std::optional<RecomputeGranularity> g =
        parseRecomputeGranularity(granularity);
    if (!g)
      return fail("\"granularity\" must be \"full\" (whole blocks) or "
                  "\"selective\" (their attention core), got \"" +
                  granularity + "\"");
    o.granularity = *g;
    return llvm::Error::success();
  }

  /// "shard_tensor": tensor parallelism. The matrices of the model blocks
  /// the filter selects (by `block`; every block when absent or "*") split
  /// over groups of `tp` devices, Megatron's way; `stream` names the stream
  /// of the collectives it adds; `sequence_parallel` (default false) runs
  /// the blocks' norms, residual adds and biases on each member's rows;
  /// `vocab_parallel` (default true) splits the token embedding and the LM
  /// head by vocabulary rows, whatever the filter.
  llvm::Error parseShardTensor(llvm::StringSet<> &allowed) {
    auto &o = become<ShardTensorOptions>();
    for (auto k :
         {"filter", "tp", "stream", "sequence_parallel", "vocab_parallel"})
      allowed.insert(k);
    if (const json::Value *f = obj.get("filter"))
      if (auto e = parseFilter(*f, d.filter, kRecomputeFilterKeys))
        return e;
    if (auto e = getString("stream", o.stream))
      return e;
    if (auto e = getBool("sequence_parallel", o.sequenceParallel))
      return e;
    if (auto e = getBool("vocab_parallel", o.vocabParallel))
      return e;
    return getInt("tp", o.tp, /*required=*/true);
  }

  /// "context_parallel": context parallelism. Every microbatch's sequence
  /// split over groups of `cp` devices (each holding two of 2 cp chunks),
  /// attention computed around the ring (`kind` "ring", the default) or by
  /// all-to-alls to the heads ("ulysses"); `stream` names the stream of the
  /// exchanges; `overlap` (default true) runs each ring exchange beside the
  /// ring step before it.
  llvm::Error parseContextParallel(llvm::StringSet<> &allowed) {
    auto &o = become<ContextParallelOptions>();
    for (auto k : {"cp", "kind", "stream", "overlap"})
      allowed.insert(k);
    if (auto e = getString("stream", o.stream))
      return e;
    if (auto e = getBool("overlap", o.overlap))
      return e;
    std::string kind = "ring";
    if (auto e = getString("kind", kind))
      return e;
    std::optional<ContextParallelKind> k = parseContextParallelKind(kind);
    if (!k)
      return fail("\"kind\" must be \"ring\" (ring attention) or "
                  "\"ulysses\" (all-to-alls to heads), got \"" +
                  kind + "\"");
    o.kind = *k;
    return getInt("cp", o.cp, /*required=*/true);
  }

  llvm::Error fail(const std::string &msg) {
    return llvm::createStringError(d.describe() + ": " + msg);
  }

  llvm::Error getInt(llvm::StringRef key, int64_t &out, bool required) {
    const json::Value *v = obj.get(key);
    if (!v)
      return required ? fail(("missing integer key \"" + key + "\"").str())
                      : llvm::Error::success();
    std::optional<int64_t> i = v->getAsInteger();
    if (!i)
      return fail(("\"" + key + "\" must be an integer").str());
    out = *i;
    return llvm::Error::success();
  }

  /// A string key: absent leaves `out` as it is; any other type is an error.
  llvm::Error getString(llvm::StringRef key, std::string &out) {
    const json::Value *v = obj.get(key);
    if (!v)
      return llvm::Error::success();
    std::optional<llvm::StringRef> s = v->getAsString();
    if (!s)
      return fail(("\"" + key + "\" must be a string").str());
    if (s->empty())
      return fail(("\"" + key + "\" must not be empty").str());
    out = s->str();
    return llvm::Error::success();
  }

  /// A boolean key: absent leaves `out` as it is; any other type is an error.
  llvm::Error getBool(llvm::StringRef key, bool &out) {
    const json::Value *v = obj.get(key);
    if (!v)
      return llvm::Error::success();
    std::optional<bool> b = v->getAsBoolean();
    if (!b)
      return fail(("\"" + key + "\" must be true or false").str());
    out = *b;
    return llvm::Error::success();
  }

  /// "devices": a list of integers (its length, their range and repeats
  /// are the verifier's).
  llvm::Error getDevices(std::vector<int64_t> &devices) {
    const json::Array *list = obj.getArray("devices");
    if (!list)
      return fail("\"devices\" must be a non-empty list of device indices");
    for (const json::Value &v : *list) {
      std::optional<int64_t> i = v.getAsInteger();
      if (!i)
        return fail("\"devices\" entries must be integers");
      devices.push_back(*i);
    }
    return llvm::Error::success();
  }

  llvm::Error getFilter(llvm::StringRef key, Filter &out, bool required) {
    const json::Value *v = obj.get(key);
    if (!v)
      return required ? fail(("missing key \"" + key + "\"").str())
                      : llvm::Error::success();
    return parseFilter(*v, out);
  }

  /// A filter object whose keys are among `keys`.
  llvm::Error
  parseFilter(const json::Value &v, Filter &out,
              llvm::ArrayRef<llvm::StringLiteral> keys = kFilterKeys) {
    const json::Object *f = v.getAsObject();
    if (!f)
      return fail("a filter must be an object such as {\"PP\": 0, \"MB\": "
                  "\"*\"}");
    for (const auto &[k, value] : *f) {
      std::string key = k.str();
      if (!llvm::is_contained(keys, key)) {
        std::string expected;
        for (auto [i, name] : llvm::enumerate(keys))
          expected += (i == 0                 ? ""
                       : i + 1 == keys.size() ? " or "
                                              : ", ") +
                      name.str();
        if (d.kind() == Directive::Recompute ||
            d.kind() == Directive::ShardTensor ||
            d.kind() == Directive::ContextParallel)
          return fail(llvm::formatv("{0} selects forward regions by "
                                    "model block (\"block\"), not \"{1}\"",
                                    d.kindName(), key)
                          .str());
        return fail(llvm::formatv("unknown filter key \"{0}\" (expected {1})",
                                  key, expected)
                        .str());
      }
      FilterValue fv;
      if (key == "PASS") {
        std::optional<llvm::StringRef> pass = value.getAsString();
        std::optional<PassKind> kind =
            pass ? symbolizePassKind(*pass) : std::nullopt;
        if (!kind)
          return fail("filter PASS must be one of \"F\", \"B\", \"BI\", "
                      "\"BW\", \"U\"");
        fv.kind = FilterValue::Pass;
        fv.pass = pass->str();
      } else if (std::optional<llvm::StringRef> s = value.getAsString()) {
        if (*s != "*")
          return fail(
              llvm::formatv("filter {0} must be an index or \"*\"", key).str());
        fv.kind = FilterValue::Any;
      } else if (std::optional<int64_t> i = value.getAsInteger();
                 i && *i >= 0 && *i < kMaxFilterIndex) {
        fv.kind = FilterValue::Index;
        fv.index = *i;
      } else {
        return fail(llvm::formatv("filter {0} must be an index from 0 to {1} "
                                  "or \"*\"",
                                  key, kMaxFilterIndex - 1)
                        .str());
      }
      out.entries[key] = fv;
    }
    return llvm::Error::success();
  }

  const json::Object &obj;
  Directive d;
};
} // namespace

llvm::Expected<Strategy> mlir::piper::parseStrategy(llvm::StringRef text) {
  JsonScan scan = scanJson(text, "strategy");
  if (!scan.nesting.empty())
    return llvm::createStringError(scan.nesting);
  llvm::Expected<json::Value> value = json::parse(text);
  if (!value)
    return llvm::createStringError("strategy is not valid JSON: " +
                                   llvm::toString(value.takeError()));
  if (!scan.duplicate.empty())
    return llvm::createStringError(scan.duplicate);
  Strategy strategy;
  std::string summary;
  const json::Array *list = value->getAsArray();
  if (const json::Object *obj = value->getAsObject()) {
    for (const auto &kv : *obj)
      if (kv.first != "directives" && kv.first != "world_size" &&
          kv.first != "summary")
        return llvm::createStringError(
            "unknown top-level key \"" + kv.first.str() +
            "\" (expected \"directives\", \"world_size\" and "
            "\"summary\")");
    list = obj->getArray("directives");
    // "summary": the one line piperc prints for the strategy (piperc
    // search writes the flags' summary there).
    if (const json::Value *given = obj->get("summary")) {
      std::optional<llvm::StringRef> line = given->getAsString();
      if (!line || line->empty() || line->size() > kMaxQuotedDirective ||
          line->contains('\n'))
        return llvm::createStringError(
            "\"summary\" must be a non-empty string of one line");
      summary = line->str();
    }
    if (const json::Value *ws = obj->get("world_size")) {
      std::optional<int64_t> n = ws->getAsInteger();
      if (!n || *n < 1 || *n > kMaxWorldSize)
        return llvm::createStringError(llvm::formatv(
            "\"world_size\" must be an integer from 1 to {0}", kMaxWorldSize));
      strategy.worldSize = *n;
    }
  }
  if (!list)
    return llvm::createStringError(
        "a strategy is a list of directives, or an object with a "
        "\"directives\" list");
  for (auto [i, entry] : llvm::enumerate(*list)) {
    std::string text;
    llvm::raw_string_ostream os(text);
    os << entry;
    // Diagnostics quote the directive: a device list of 2^20 entries would
    // be 8 MB of it.
    if (text.size() > kMaxQuotedDirective)
      text = text.substr(0, kMaxQuotedDirective) + "...";
    const json::Object *obj = entry.getAsObject();
    if (!obj)
      return llvm::createStringError(
          llvm::formatv("directive #{0} ({1}): must be an object", i, text)
              .str());
    llvm::Expected<Directive> d = DirectiveParser(*obj, i, text).parse();
    if (!d)
      return d.takeError();
    strategy.directives.push_back(std::move(*d));
  }
  if (llvm::Error err = verifyStrategy(strategy))
    return std::move(err);
  strategy.summary = "strategy file, " +
                     std::to_string(strategy.directives.size()) + " directives";
  if (!summary.empty())
    strategy.summary = summary + " (strategy file)";
  return strategy;
}

llvm::Expected<Strategy> mlir::piper::readStrategyFile(const std::string &path,
                                                       llvm::StringRef what) {
  std::string text;
  if (std::string err = ::piper::readInputFile(path, text); !err.empty())
    return llvm::createStringError(::piper::inputError(what.str(), path, err));
  llvm::Expected<Strategy> strategy = parseStrategy(text);
  if (!strategy)
    return llvm::createStringError(path + ": " +
                                   llvm::toString(strategy.takeError()));
  return strategy;
}
