// `piperc search`: the model (a file or a preset), the devices, the memory
// and the machine in; the fastest strategies that fit out, as a table and
// as strategy files (docs/search.md).
#include "compiler/driver/DriverSupport.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>
#include <unistd.h>

#include "compiler/frontend/GptModel.h"
#include "compiler/frontend/Presets.h"
#include "compiler/search/Search.h"
#include "dialects/piper/PiperDialect.h"
#include "proto/analysis/MachineFile.h"
#include "support/ByteSize.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace mlir::piper;
using namespace mlir::piper::driver;
using namespace mlir::piper::search;

namespace {
struct SearchCommandOptions {
  std::string model, machine, deviceMemory, output, dtype = "f32";
  int64_t devices = 0, globalBatch = 0;
  /// The search's defaults.
  int64_t top = SearchOptions().top, maxCompiles = SearchOptions().maxCompiles;
  /// --seq, --micro-batch: -1 when not given.
  int64_t seq = -1, microBatch = -1;
  double timeLimit = 0;
  int jobs = 0;
  std::vector<double> bucketsMb = {kDefaultBucketMb};
};

/// The text of `module`, for the search's workers to parse.
std::string printed(ModuleOp module) {
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os);
  return text;
}

/// The model's text: a preset (with --seq and --micro-batch) or a file
/// (which fixes both: the flags must then agree with it or be absent).
std::string modelText(const SearchCommandOptions &o, std::string &error) {
  if (std::optional<ModelPreset> preset = findPreset(o.model)) {
    GptConfig cfg = preset->config;
    if (o.seq >= 0)
      cfg.seq = o.seq;
    if (o.microBatch >= 0)
      cfg.batch = o.microBatch;
    if (std::string err = validateGptConfig(cfg); !err.empty()) {
      error = "preset '" + o.model + "': " + err;
      return "";
    }
    MLIRContext ctx;
    return printed(*buildGptModel(&ctx, cfg));
  }
  if (o.seq >= 0 || o.microBatch >= 0) {
    error = "--seq and --micro-batch apply to a preset; a model file fixes "
            "both (make another with piperc model --seq S --batch B)";
    return "";
  }
  if (std::string err = checkRegularFile(o.model, "model"); !err.empty()) {
    error = err + " (nor is it a preset: piperc model --list)";
    return "";
  }
  MLIRContext ctx;
  ctx.loadDialect<PiperDialect>();
  ctx.printOpOnDiagnostic(false);
  llvm::SourceMgr sourceMgr;
  SourceMgrDiagnosticHandler handler(sourceMgr, &ctx);
  OwningOpRef<ModuleOp> module =
      loadModule(ctx, sourceMgr, o.model, "model", "search", error);
  return module ? printed(*module) : "";
}

/// "12/32 compiled (3 too big, 9 fit), 4,127 pruned, 6 s, ETA 10 s" on one
/// line of a terminal.
void printProgress(const SearchCounts &n, int64_t toCompile, double elapsed) {
  double eta =
      n.compiled ? elapsed / double(n.compiled) * double(toCompile - n.compiled)
                 : 0;
  llvm::errs() << llvm::formatv(
      "\rsearch: {0} candidates, {1} pruned, {2}/{3} compiled ({4} refused, "
      "{5} too big, {6} fit), {7:F0} s, ETA {8:F0} s   ",
      n.enumerated, n.prunedByRule + n.prunedByMemory, n.compiled, toCompile,
      n.refused, n.tooBig, n.fitting, elapsed, eta);
  llvm::errs().flush();
}

/// Why nothing fits, with what came closest.
std::string nothingFits(const SearchResult &r) {
  std::string out = "no strategy fits";
  const Evaluated *closest = nullptr;
  for (const Evaluated &e : r.compiled)
    if (e.outcome == Evaluated::Outcome::TooBig &&
        (!closest || e.peakBytes < closest->peakBytes))
      closest = &e;
  if (closest)
    out += "; the smallest compiled (" + layoutName(closest->candidate.flags) +
           " " + closest->candidate.flags.schedule +
           " zero=" + std::to_string(closest->candidate.flags.zero) +
           " recompute=" + closest->candidate.flags.recompute +
           "): " + closest->why;
  else if (r.counts.compiled == 0 && r.timedOut)
    out += ": --time-limit passed before a strategy was compiled";
  else if (r.counts.compiled == 0)
    out += ": every candidate was pruned (more memory, more devices, or "
           "another global batch?)";
  if (!r.counts.rules.empty()) {
    out += "\n  pruned by rule:";
    for (const auto &[rule, count] : r.counts.rules)
      out += llvm::formatv("\n    {0}: {1}", rule, count).str();
  }
  for (const Evaluated &e : r.compiled)
    if (e.outcome == Evaluated::Outcome::Refused ||
        e.outcome == Evaluated::Outcome::Unsimulated) {
      out +=
          "\n  e.g. refused by the compiler: " + layoutName(e.candidate.flags) +
          ": " + e.why;
      break;
    }
  return out;
}

int runSearchCommand(const SearchCommandOptions &o) {
  ::piper::StatusOr<int64_t> memory = ::piper::parseByteSize(o.deviceMemory);
  if (!memory)
    return fail("--device-memory " + memory.status().message());
  if (o.devices < 1 || o.devices > kMaxWorldSize)
    return fail(
        llvm::formatv("--devices must be from 1 to {0}", kMaxWorldSize));
  if (o.globalBatch < 1)
    return fail("--global-batch must be positive (sequences per step)");
  if (o.top < 1 || o.maxCompiles < 1 || o.jobs < 0 || o.timeLimit < 0)
    return fail("--top and --max-compiles must be positive, --jobs and "
                "--time-limit non-negative");
  for (double b : o.bucketsMb)
    if (!(b > 0) || !std::isfinite(b))
      return fail("--buckets sizes must be positive numbers of MB");
  SearchOptions options;
  options.devices = o.devices;
  options.deviceMemory = *memory;
  options.globalBatch = o.globalBatch;
  options.opt.dtype = *symbolizeComputeType(o.dtype);
  options.maxCompiles = o.maxCompiles;
  options.top = o.top;
  options.timeLimit = o.timeLimit;
  options.bucketsMb = o.bucketsMb;
  options.jobs =
      o.jobs ? o.jobs : std::max(1u, std::thread::hardware_concurrency());
  if (!o.machine.empty())
    if (std::string err =
            ::piper::plan::readMachineFile(o.machine, options.machine);
        !err.empty())
      return fail(err);
  std::string error;
  std::string text = modelText(o, error);
  if (text.empty())
    return fail(error);
  bool terminal = ::isatty(2);
  Progress progress;
  if (terminal)
    progress = printProgress;
  auto start = std::chrono::steady_clock::now();
  FailureOr<SearchResult> result = runSearch(text, options, progress, error);
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (terminal)
    llvm::errs() << "\n";
  if (failed(result))
    return fail(error);
  const SearchCounts &n = result->counts;
  llvm::outs() << llvm::formatv(
      "piperc search: {0} on {1} device(s) of {2}, global batch {3}, {4}; "
      "{5} candidates: {6} pruned by rule, {7} by the state bound; {8} "
      "compiled ({9} refused, {10} too big, {11} fit; {12} whole after a "
      "proxy) in {13:F1} s on {14} thread(s){15}\n",
      o.model, o.devices, o.deviceMemory, o.globalBatch, o.dtype, n.enumerated,
      n.prunedByRule, n.prunedByMemory, n.compiled, n.refused, n.tooBig,
      n.fitting, n.confirmed, seconds, options.jobs,
      result->timedOut ? " (stopped by --time-limit)" : "");
  llvm::outs().flush(); // before an error on stderr
  if (result->ranked.empty())
    return fail(nothingFits(*result));
  llvm::outs() << formatTable(*result, options, o.top);
  if (o.output.empty())
    return 0;
  std::error_code ec;
  std::filesystem::create_directories(o.output, ec);
  if (ec)
    return fail("cannot create '" + o.output + "': " + ec.message());
  for (auto [i, e] : llvm::enumerate(result->ranked)) {
    if (int64_t(i) >= o.top)
      break;
    std::string path = llvm::formatv("{0}/{1}.json", o.output, i + 1).str();
    std::error_code fec;
    llvm::raw_fd_ostream out(path, fec);
    if (fec)
      return fail("cannot write '" + path + "': " + fec.message());
    out << e.strategyJson;
    if (std::string err = closeOutput(out, path); !err.empty())
      return fail(err);
  }
  llvm::outs() << llvm::formatv(
      "wrote {0}/1.json ... {1}.json; compile one with: piperc compile MODEL "
      "--strategy {0}/1.json --dtype {2}\n",
      o.output, std::min<int64_t>(o.top, result->ranked.size()), o.dtype);
  return 0;
}
} // namespace

Subcommand mlir::piper::driver::addSearchCommand(CLI::App &app) {
  auto o = std::make_shared<SearchCommandOptions>();
  CLI::App *cmd = app.add_subcommand(
      "search", "find the fastest strategies that fit: enumerate every axis, "
                "compile the most promising, rank them by the simulator "
                "(docs/search.md)");
  cmd->add_option("model", o->model, "model .mlir file or preset name")
      ->required();
  cmd->add_option("--devices", o->devices, "number of devices")->required();
  cmd->add_option("--device-memory", o->deviceMemory,
                  "memory of one device (e.g. 141GiB): every rank's exact "
                  "plan must fit")
      ->required();
  cmd->add_option("--global-batch", o->globalBatch,
                  "sequences per optimizer step over all replicas")
      ->required();
  cmd->add_option("--machine", o->machine,
                  "machine description JSON (bench/h200-cluster.json; "
                  "docs/simulator.md)");
  cmd->add_option("--seq", o->seq, "with a preset: the sequence length")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--micro-batch", o->microBatch,
                  "with a preset: sequences per microbatch")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--dtype", o->dtype, "f32 or bf16, as piperc compile")
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--top", o->top, "strategies to print and write (3)");
  cmd->add_option("--max-compiles", o->maxCompiles,
                  "compile at most this many candidates, most promising "
                  "first (32)");
  cmd->add_option("--time-limit", o->timeLimit,
                  "seconds after which no more compiles start (0: none; the "
                  "result then depends on the machine's speed)");
  cmd->add_option("--jobs", o->jobs,
                  "compile on this many threads (0: one per core)");
  cmd->add_option("--buckets", o->bucketsMb,
                  "gradient bucket sizes in MB to try with data parallelism "
                  "(25)")
      ->delimiter(',');
  cmd->add_option("-o,--output", o->output,
                  "write the top strategies here as 1.json, 2.json, ...");
  return {cmd, [o] { return runSearchCommand(*o); }};
}
