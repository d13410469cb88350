// The piperc driver: the compile pipeline with --compile-to=PHASE, the
// checks of its output, writing the plans, and the command line (`piperc
// model` is ModelCommand.cpp).
#include "compiler/driver/Driver.h"
#include "compiler/driver/DriverSupport.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>

#include "compiler/lowering/LowerToPlan.h"
#include "compiler/strategy/Strategy.h"
#include "compiler/transforms/Passes.h"
#include "compiler/transforms/Transforms.h"
#include "dialects/piper/PiperDialect.h"
#include "mlir/IR/AsmState.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Support/Timing.h"
#include "proto/PlanFile.h"
#include "proto/PlanTensors.h"
#include "proto/analysis/MemoryPlan.h"
#include "proto/analysis/Simulate.h"
#include "proto/analysis/TimelineSvg.h"
#include "support/ByteSize.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MathExtras.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/ToolOutputFile.h"

using namespace mlir;
using namespace mlir::piper;
using namespace mlir::piper::driver;

namespace {
/// Remembers the pass that failed, to say which phase did.
class FailedPass : public PassInstrumentation {
public:
  void runAfterPassFailed(Pass *pass, Operation *) override {
    if (argument.empty())
      argument = pass->getArgument().str();
  }
  std::string what() const {
    if (std::optional<CompilePhase> phase = compilePhaseOfPass(argument))
      return describeCompilePhase(*phase).str();
    return "compilation";
  }

private:
  std::string argument;
};

struct CompileOptions {
  std::string input, output, strategyFile, compileTo = "plan";
  int64_t worldSize = 0;
  /// --pp --dp --microbatches --schedule --zero --ep --virtual-stages
  /// --bucket-mb --recompute.
  StrategyFlags flags;
  OptimizerConfig opt;
  /// Print the time of each phase to stderr when done.
  bool timing = false;
  /// Print the IR after every pass of the pass manager.
  bool printIrAfterAll = false;
  /// --device-memory: reject plans whose arena exceeds this size.
  std::string deviceMemory;
  /// Whether --world-size and --min-lr were given on the command line.
  bool worldSizeGiven = false, minLrGiven = false;
};

/// The strategy of a compile: the file, or the flags; --world-size on top.
llvm::Expected<Strategy> compileStrategy(const CompileOptions &o) {
  llvm::Expected<Strategy> strategy = o.strategyFile.empty()
                                          ? buildStrategy(o.flags)
                                          : readStrategyFile(o.strategyFile);
  if (!strategy || !o.worldSizeGiven)
    return strategy;
  if (o.worldSize < 1 || o.worldSize > kMaxWorldSize)
    return llvm::createStringError(
        llvm::formatv("--world-size must be from 1 to {0}, got {1}",
                      kMaxWorldSize, o.worldSize)
            .str());
  strategy->worldSize = o.worldSize;
  return strategy;
}

/// Why the optimizer flags are invalid, or "".
std::string checkOptimizer(const CompileOptions &o) {
  for (auto [flag, value] : {std::pair<const char *, double>{"--lr", o.opt.lr},
                             {"--beta1", o.opt.beta1},
                             {"--beta2", o.opt.beta2},
                             {"--eps", o.opt.eps},
                             {"--weight-decay", o.opt.weightDecay},
                             {"--min-lr", o.opt.minLr},
                             {"--clip-grad", o.opt.clipGradNorm}})
    if (std::string err = finite(flag, value); !err.empty())
      return err;
  if (o.opt.lr <= 0 || o.opt.minLr < 0 || o.opt.warmupSteps < 0 ||
      o.opt.decaySteps < 0 || o.opt.clipGradNorm < 0 || o.opt.weightDecay < 0 ||
      o.opt.beta1 < 0 || o.opt.beta1 >= 1 || o.opt.beta2 < 0 ||
      o.opt.beta2 >= 1 || o.opt.eps <= 0)
    return "invalid optimizer settings: --lr and --eps must be positive "
           "(--eps 0 divides 0 by 0 for a gradient that is 0), betas in [0, "
           "1), the others non-negative";
  if (o.opt.minLr > o.opt.lr)
    return llvm::formatv("--min-lr {0}{1} is above --lr {2}",
                         llvm::format("%g", o.opt.minLr),
                         o.minLrGiven ? "" : " (the default)",
                         llvm::format("%g", o.opt.lr))
        .str();
  return "";
}

double mib(int64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

/// Writes OUT/report.txt: per device class its size, traffic and memory
/// plan, the predicted step and the timeline files. Returns an error or "".
std::string writeReport(const LoweredPlans &lowered, const Strategy &strategy,
                        const std::string &output,
                        ArrayRef<int64_t> peaksWithoutRecompute) {
  // A human-readable report beside the plans.
  std::string report;
  llvm::raw_string_ostream rs(report);
  rs << "model: " << lowered.manifest.model_name() << "\n"
     << "strategy: " << strategy.summary << "\n"
     << "world size: " << lowered.manifest.world_size() << "\n";
  for (auto [index, plan] : llvm::enumerate(lowered.plans)) {
    size_t instructions = 0, sendBytes = 0, reduceBytes = 0;
    for (const auto &s : plan.streams())
      for (const auto &ins : s.instructions()) {
        ++instructions;
        if (ins.kind() == ::piper::plan::Instruction::SEND) {
          sendBytes += planTensorBytes(::piper::plan::storedType(
              plan, plan.buffers(ins.inputs(0)).type()));
        } else if (ins.kind() == ::piper::plan::Instruction::ALL_REDUCE) {
          for (int p : ins.params())
            reduceBytes += planTensorBytes(plan.params(p).type());
        }
      }
    rs << llvm::formatv(
        "class {0} ranks [{1}]: {2} parameters, {3} "
        "instructions on {4} stream(s); predicted peak "
        "memory {5:F1} MiB per rank (state {6:F1} MiB); per "
        "step sends {7:F2} MiB, all-reduces {8:F2} MiB\n",
        plan.device_class(),
        llvm::join(llvm::map_range(plan.ranks(),
                                   [](int r) { return std::to_string(r); }),
                   ", "),
        plan.params_size(), instructions, plan.streams_size(),
        mib(plan.predicted_peak_bytes()), mib(plan.predicted_state_bytes()),
        mib(sendBytes), mib(reduceBytes));
    rs << llvm::formatv("  memory plan: arena {0} bytes ({1:F1} MiB) per rank "
                        "= state {2} + step {3} (piper-plan --memory shows "
                        "the layout)\n",
                        plan.arena_bytes(), mib(plan.arena_bytes()),
                        plan.state_bytes(),
                        plan.arena_bytes() - plan.state_bytes());
    if (index < peaksWithoutRecompute.size())
      rs << llvm::formatv("  recomputation: predicted peak {0} bytes per rank; "
                          "without recomputation {1} bytes\n",
                          plan.predicted_peak_bytes(),
                          peaksWithoutRecompute[index]);
  }
  rs << ::piper::plan::predictedStepReport(lowered.plans);
  // The predicted timeline as a trace and a picture, named in the report.
  std::string timelineLine, timelineError;
  if (!::piper::plan::writeTimelineFiles(lowered.plans, output, timelineLine,
                                         timelineError))
    return timelineError;
  rs << timelineLine;
  {
    std::error_code rec;
    std::string reportPath = output + "/report.txt";
    llvm::raw_fd_ostream out(reportPath, rec);
    if (rec)
      return "cannot write the report: " + rec.message();
    out << report;
    return closeOutput(out, reportPath);
  }
}

/// The lines piperc prints once the plans are written.
void printSummary(const LoweredPlans &lowered, const Strategy &strategy,
                  const std::string &output,
                  ArrayRef<int64_t> peaksWithoutRecompute) {
  llvm::outs() << "piperc: wrote " << lowered.plans.size() << " plan(s) for "
               << lowered.manifest.world_size() << " device(s) to " << output
               << " (" << strategy.summary << ")\n";
  for (auto [index, plan] : llvm::enumerate(lowered.plans)) {
    size_t instructions = 0;
    for (const auto &s : plan.streams())
      instructions += s.instructions_size();
    llvm::outs() << "  class " << plan.device_class() << " ranks [";
    for (int i = 0; i < plan.ranks_size(); ++i)
      llvm::outs() << (i ? ", " : "") << plan.ranks(i);
    llvm::outs() << "]: " << plan.params_size() << " parameters, "
                 << plan.segments_size() << " segments, " << instructions
                 << " instructions on " << plan.streams_size()
                 << " stream(s), predicted peak "
                 << llvm::formatv("{0:F1}", mib(plan.predicted_peak_bytes()))
                 << " MiB per rank";
    if (index < peaksWithoutRecompute.size())
      llvm::outs() << llvm::formatv(" ({0:F1} MiB without recomputation)",
                                    mib(peaksWithoutRecompute[index]));
    llvm::outs() << "\n";
  }
}

/// The predicted peak of each device class when `strategy` is compiled
/// without its recompute directives (the report's comparison), or nullopt
/// with `error` set.
std::optional<std::vector<int64_t>>
peaksWithoutRecompute(const CompileOptions &o, Strategy strategy,
                      std::string &error) {
  llvm::erase_if(strategy.directives, [](const Directive &d) {
    return d.kind() == Directive::Recompute;
  });
  MLIRContext ctx;
  ctx.loadDialect<PiperDialect>();
  ctx.printOpOnDiagnostic(false);
  llvm::SourceMgr sourceMgr;
  SourceMgrDiagnosticHandler handler(sourceMgr, &ctx);
  OwningOpRef<ModuleOp> module =
      loadModule(ctx, sourceMgr, o.input, "model", "compile", error);
  if (!module)
    return std::nullopt;
  PassManager pm(&ctx);
  addCompilePipeline(pm, strategy, o.opt, CompilePhase::Plan);
  FailureOr<LoweredPlans> lowered = failure();
  if (succeeded(pm.run(*module)))
    lowered = lowerToPlans(*module, llvm::sys::path::stem(o.input).str(),
                           strategy.summary, /*checkProgress=*/true,
                           o.opt.fuseEpilogues, o.opt.padVocab);
  if (failed(lowered)) {
    error = "the strategy without recompute directives does not compile";
    return std::nullopt;
  }
  std::vector<int64_t> peaks;
  for (const auto &plan : lowered->plans)
    peaks.push_back(plan.predicted_peak_bytes());
  return peaks;
}

int runCompile(const CompileOptions &o) {
  if (o.flags.schedule == "help") {
    llvm::outs() << formatScheduleTable();
    return 0;
  }
  if (o.input.empty())
    return fail("name a model .mlir file to compile");
  std::optional<CompilePhase> lastPhase = symbolizeCompilePhase(o.compileTo);
  if (!lastPhase)
    return fail("unknown phase '" + o.compileTo + "' for --compile-to (" +
                compilePhaseNames() + ")");
  int64_t deviceBytes = -1;
  if (!o.deviceMemory.empty()) {
    ::piper::StatusOr<int64_t> size = ::piper::parseByteSize(o.deviceMemory);
    if (!size)
      return fail("--device-memory " + size.status().message());
    deviceBytes = *size;
  }
  if (std::string err = checkRegularFile(o.input, "model"); !err.empty())
    return fail(err);
  llvm::Expected<Strategy> strategyOr = compileStrategy(o);
  if (!strategyOr)
    return fail(llvm::toString(strategyOr.takeError()));
  Strategy strategy = std::move(*strategyOr);
  if (std::string err = checkOptimizer(o); !err.empty())
    return fail(err);

  DefaultTimingManager timing;
  timing.setEnabled(o.timing);
  TimingScope root = timing.getRootScope();
  TimingScope parseTimer = root.nest("parse");
  MLIRContext ctx;
  ctx.loadDialect<PiperDialect>();
  // Diagnostics name the nodes; dumping the whole program buries them.
  ctx.printOpOnDiagnostic(false);
  llvm::SourceMgr sourceMgr;
  SourceMgrDiagnosticHandler handler(sourceMgr, &ctx);
  std::string error;
  OwningOpRef<ModuleOp> module =
      loadModule(ctx, sourceMgr, o.input, "model", "compile", error);
  if (!module)
    return fail(error);
  parseTimer.stop();

  // The compile pipeline, up to the phase --compile-to names: the same
  // passes piper-opt runs; the pass manager verifies after each and times
  // each one.
  {
    PassManager pm(&ctx);
    addCompilePipeline(pm, strategy, o.opt, *lastPhase);
    TimingScope passTimer = root.nest("pipeline");
    if (o.timing)
      pm.enableTiming(passTimer);
    if (o.printIrAfterAll) {
      ctx.disableMultithreading();
      pm.enableIRPrinting(
          /*shouldPrintBeforePass=*/[](Pass *, Operation *) { return false; },
          /*shouldPrintAfterPass=*/[](Pass *, Operation *) { return true; },
          /*printModuleScope=*/true, /*printAfterOnlyOnChange=*/false);
    }
    auto failures = std::make_unique<FailedPass>();
    FailedPass *failure = failures.get();
    pm.addInstrumentation(std::move(failures));
    if (failed(pm.run(*module)))
      return fail(failure->what() + " failed");
  }
  if (*lastPhase != CompilePhase::Plan)
    return writeOutput(*module, o.output);

  if (o.output.empty())
    return fail("-o OUT/ is required to write plans");
  TimingScope lowerTimer = root.nest("lower-to-plans");
  FailureOr<LoweredPlans> lowered = lowerToPlans(
      *module, llvm::sys::path::stem(o.input).str(), strategy.summary,
      /*checkProgress=*/true, o.opt.fuseEpilogues, o.opt.padVocab);
  lowerTimer.stop();
  TimingScope writeTimer = root.nest("write-plans");
  if (failed(lowered))
    return fail("lowering to plans failed");
  // "Will it fit?": a verdict per device class against --device-memory.
  std::string fitting, tooBig;
  if (deviceBytes >= 0) {
    for (const auto &plan : lowered->plans) {
      bool fits = false;
      std::string verdict = ::piper::plan::fitVerdict(plan, deviceBytes, fits);
      (fits ? fitting : tooBig) += "\n  " + verdict;
    }
    if (!tooBig.empty())
      return fail("the strategy does not fit --device-memory " +
                  o.deviceMemory + " (nothing written):" + tooBig);
  }
  if (std::string err = writePlans(*lowered, o.output); !err.empty())
    return fail(err);
  // With recomputation, the peak the same strategy would plan without it.
  std::vector<int64_t> peaksWithout;
  if (llvm::any_of(strategy.directives, [](const Directive &d) {
        return d.kind() == Directive::Recompute;
      })) {
    std::string error;
    std::optional<std::vector<int64_t>> peaks =
        peaksWithoutRecompute(o, strategy, error);
    if (!peaks)
      return fail("compiling without recomputation for the report: " + error);
    peaksWithout = std::move(*peaks);
  }
  if (std::string err = writeReport(*lowered, strategy, o.output, peaksWithout);
      !err.empty())
    return fail(err);
  printSummary(*lowered, strategy, o.output, peaksWithout);
  if (!fitting.empty())
    llvm::outs() << "piperc: every rank fits --device-memory " << o.deviceMemory
                 << ":" << fitting << "\n";
  return 0;
}
} // namespace

/// `piperc compile`'s command line: the model, the strategy (a file or the
/// flags), the optimizer, the phases and the checks, into `comp`.
static CLI::App *addCompileCommand(CLI::App &app, CompileOptions &comp) {
  CLI::App *compileCmd = app.add_subcommand(
      "compile", "compile a model and a strategy into per-device plans");
  // Not required: `piperc compile --schedule help` needs no model.
  compileCmd->add_option("model", comp.input, "model .mlir file");
  compileCmd->add_option("-o,--output", comp.output,
                         "output folder (plans) or file (--compile-to)");
  auto *strategyOpt = compileCmd->add_option("--strategy", comp.strategyFile,
                                             "strategy JSON file");
  auto *ppOpt =
      compileCmd->add_option("--pp", comp.flags.pp, "pipeline stages");
  auto *dpOpt =
      compileCmd->add_option("--dp", comp.flags.dp, "data-parallel replicas");
  auto *mbOpt =
      compileCmd->add_option("--microbatches", comp.flags.microbatches,
                             "microbatches per replica per step");
  auto *schedOpt = compileCmd->add_option(
      "--schedule", comp.flags.schedule,
      "pipeline schedule: " + scheduleNames() + " (help: list them)");
  auto *zeroOpt = compileCmd->add_option(
      "--zero", comp.flags.zero,
      "ZeRO stage of the data-parallel replicas: 1 shards the AdamW moments, "
      "2 also the gradients, 3 also the parameters (docs/zero.md)");
  auto *epOpt = compileCmd->add_option(
      "--ep", comp.flags.ep,
      "expert parallelism: split every MoE layer's experts over groups of this "
      "many data-parallel replicas (divides --dp and the experts; "
      "docs/expert-parallel.md)");
  auto *vsOpt = compileCmd->add_option(
      "--virtual-stages", comp.flags.virtualStages,
      "stages per pipeline device group: --pp P makes P*V stages, placed in "
      "the schedule's layout (default: 2 for interleaved-1f1b, zbv and "
      "dualpipev, else 1; docs/schedules.md)");
  auto *bucketOpt = compileCmd->add_option(
      "--bucket-mb", comp.flags.bucketMb,
      "gradient bucket size of the data-parallel all-reduces (and ZeRO's "
      "reduce-scatters and gathers) in MB of 2^20 bytes (default 25; the "
      "replicate directive's bucket_size)");
  auto *tpOpt = compileCmd->add_option(
      "--tp", comp.flags.tp,
      "tensor parallelism: split every transformer block's matrices over "
      "groups of this many devices, Megatron's way (innermost: rank = "
      "stage group * dp * tp + replica * tp + member; "
      "docs/tensor-parallel.md)");
  auto *spOpt = compileCmd->add_flag(
      "--sp", comp.flags.sp,
      "sequence parallelism (with --tp): the blocks' norms, residual adds "
      "and biases run on each member's 1/tp of the rows, the all-reduces "
      "become reduce-scatter + all-gather pairs; docs/tensor-parallel.md");
  auto *vocabOpt = compileCmd->add_flag(
      "--no-vocab-parallel", comp.flags.noVocabParallel,
      "with --tp: keep the token embedding and LM head whole on every "
      "member (by default they are split by vocabulary rows and the loss "
      "never gathers the logits; docs/tensor-parallel.md)");
  auto *cpOpt = compileCmd->add_option(
      "--cp", comp.flags.cp,
      "context parallelism: split every microbatch's sequence over groups "
      "of this many devices (rank = "
      "stage group * dp * cp * tp + (replica * cp + member) * tp + tensor "
      "member; the sequence must be a multiple of 2 * cp; "
      "docs/context-parallel.md)");
  auto *cpKindOpt = compileCmd->add_option(
      "--cp-kind", comp.flags.cpKind,
      "context parallelism's kind: ring (default: ring attention, key/value "
      "shards passed around) or ulysses (all-to-alls from the sequence to "
      "the heads and back: heads and key/value heads multiples of --cp)");
  auto *cpNoOverlapOpt = compileCmd->add_flag(
      "--cp-no-overlap", comp.flags.cpNoOverlap,
      "with --cp (ring): each key/value exchange waits for the ring step "
      "before it instead of running beside it (the serialized ring, for "
      "comparison and debugging; docs/context-parallel.md)");
  auto *recomputeOpt = compileCmd->add_option(
      "--recompute", comp.flags.recompute,
      "activation recomputation: none (default), full (every transformer "
      "block keeps only its input; the backward re-runs its forward) or "
      "selective (the attention core only); docs/recompute.md");
  for (CLI::Option *opt :
       {ppOpt, dpOpt, mbOpt, schedOpt, zeroOpt, epOpt, vsOpt, bucketOpt,
        recomputeOpt, tpOpt, spOpt, vocabOpt, cpOpt, cpKindOpt, cpNoOverlapOpt})
    opt->excludes(strategyOpt);
  compileCmd->add_option("--world-size", comp.worldSize,
                         "number of devices (checked against the strategy)");
  compileCmd->add_option("--compile-to", comp.compileTo,
                         "stop after a phase and print its IR: " +
                             compilePhaseNames());
  compileCmd->add_option("--lr", comp.opt.lr, "AdamW learning rate");
  compileCmd->add_option("--beta1", comp.opt.beta1, "AdamW beta1");
  compileCmd->add_option("--beta2", comp.opt.beta2, "AdamW beta2");
  compileCmd->add_option("--eps", comp.opt.eps, "AdamW epsilon");
  compileCmd->add_option("--weight-decay", comp.opt.weightDecay,
                         "AdamW decoupled weight decay (matrices only)");
  compileCmd->add_option("--min-lr", comp.opt.minLr,
                         "learning rate at the end of the cosine decay");
  compileCmd->add_option("--warmup-steps", comp.opt.warmupSteps,
                         "linear learning-rate warmup steps");
  compileCmd->add_option("--decay-steps", comp.opt.decaySteps,
                         "step at which the cosine decay reaches --min-lr "
                         "(0: no decay)");
  compileCmd->add_option("--clip-grad", comp.opt.clipGradNorm,
                         "global gradient-norm clipping threshold (0: off)");
  compileCmd
      ->add_option_function<std::string>(
          "--dtype",
          [&comp](const std::string &name) {
            comp.opt.dtype = *symbolizeComputeType(name);
          },
          "f32, or bf16 mixed precision (fp32 master weights, accumulation "
          "and optimizer state)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  compileCmd->add_flag("--mlir-timing", comp.timing,
                       "print the time each compiler phase takes (stderr)");
  compileCmd->add_flag("--mlir-print-ir-after-all", comp.printIrAfterAll,
                       "print the IR after every pass of the compile pipeline "
                       "(stderr)");
  compileCmd->add_option("--device-memory", comp.deviceMemory,
                         "memory of one device (e.g. 80GiB): a plan whose "
                         "arena does not fit is an error naming the rank, "
                         "the step's peak and the largest buffers there");
  compileCmd->add_flag("--no-optimizer", comp.opt.noUpdate,
                       "forward and backward only: gradients accumulate and "
                       "are never applied (gradient checks)");
  compileCmd
      ->add_option(
          "--pad-vocab", comp.opt.padVocab,
          "store a classifier's logits and their gradient with rows padded "
          "to a multiple of this many columns (default 64: GPT-2's 50257 "
          "become 50304, so that every row starts 256-byte aligned for the "
          "GEMMs; the parameters keep their shapes and the padding is never "
          "read: the numbers are the unpadded plan's); 0 pads nothing")
      ->check(CLI::Range(int64_t(0), int64_t(4096)));
  compileCmd->add_flag(
      "!--no-fused-classifier", comp.opt.fuseClassifier,
      "compute the loss's logits gradient in the backward, from the kept "
      "logits, instead of in the forward in one pass with the loss (the "
      "fused classifier; bit-identical; docs/design-notes.md §2)");
  compileCmd->add_flag(
      "!--no-fused-epilogues", comp.opt.fuseEpilogues,
      "compute a biased linear's weight and bias gradients in two ops "
      "instead of one (linear_grad_weight_bias, whose bias gradient comes "
      "out of the weight gradient's GEMM on CUDA), and add weight gradients "
      "(the linears', the norms' and the embeddings') to their accumulators "
      "with accumulate "
      "kernels instead of in their own kernels (in the GEMM on CUDA), and "
      "run gelu and gelu_grad as "
      "kernels of their own instead of with the GEMM before them "
      "(linear_gelu, linear_grad_input_gelu: in its epilogue on CUDA), "
      "and run the residual stream's add as a kernel of its own instead "
      "of with the norm after it and the norm's input gradient before it "
      "(add_layer_norm, add_rms_norm, *_norm_grad_input_add; bit-identical "
      "everywhere); bit-identical on the CPU; docs/design-notes.md §2");
  return compileCmd;
}

int mlir::piper::pipercMain(int argc, char **argv) {
  CLI::App app{"piperc: the Piper compiler for distributed training"};
  app.require_subcommand(1);

  Subcommand model = addModelCommand(app);
  Subcommand search = addSearchCommand(app);

  CompileOptions comp;
  CLI::App *compileCmd = addCompileCommand(app, comp);

  LowerOptions lower;
  CLI::App *lowerCmd = app.add_subcommand(
      "lower", "plans from a hand-written, placed training program "
               "(a piper.program with explicit transfers and collectives)");
  lowerCmd->add_option("program", lower.input, "program .mlir file")
      ->required();
  lowerCmd->add_option("-o,--output", lower.output, "output folder")
      ->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    // A malformed command line exits 2 (CLI11's own codes are 100+).
    return app.exit(e) == 0 ? 0 : 2;
  }
  comp.worldSizeGiven = compileCmd->count("--world-size") > 0;
  comp.minLrGiven = compileCmd->count("--min-lr") > 0;
  int rc = model.cmd->parsed()    ? model.run()
           : search.cmd->parsed() ? search.run()
           : lowerCmd->parsed()   ? runLower(lower)
                                  : runCompile(comp);
  // What went to standard output must have arrived (> /dev/full).
  if (std::string err = closeOutput(llvm::outs(), "-"); !err.empty())
    return fail(err);
  return rc;
}
