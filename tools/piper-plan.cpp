// piper-plan: prints a compiled plan (or a whole compiled folder) as text, for
// people reading what the compiler produced and for FileCheck tests; with
// --simulate, times one step of a compiled folder and pictures it
// (docs/simulator.md); with --device-memory, says whether every rank fits a
// device of that size; with --backend, as that backend's executor lays the
// plan out (its memory plan, smaller where a GPU stores values packed).
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <sys/stat.h>
#include <vector>

#include <CLI/CLI.hpp>
#include <google/protobuf/text_format.h>

#include "proto/InputFile.h"
#include "proto/PlanDump.h"
#include "proto/PlanFile.h"
#include "proto/analysis/MachineFile.h"
#include "proto/analysis/MemoryPlan.h"
#include "proto/analysis/Simulate.h"
#include "proto/analysis/TimelineSvg.h"
#include "runtime/exec/Executor.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"
#include "support/ByteSize.h"
#include "support/Errno.h"

namespace {

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int fail(const std::string &message) {
  std::fprintf(stderr, "piper-plan: %s\n", message.c_str());
  return 1;
}

/// What printPlan prints of a plan.
struct PrintOptions {
  bool kernels = true, textproto = false, memory = false;
  int largest = 5;
  /// --device-memory: the fit verdict (alone, or after --memory's report);
  /// -1: none.
  int64_t deviceBytes = -1;
  /// --backend: "" (the plan file's memory plan, device-agnostic), "cpu",
  /// "cuda" or "cuda-emulation" (the GPU backends store alike).
  std::string backend;
};

/// `plan` as `backend`'s executor lays it out (Executor::deviceLayout);
/// the GPU backends' rules are their shared kernel registry's, which the
/// emulated GPU has: no GPU is needed.
piper::Status layOutFor(const std::string &backend, piper::plan::Plan &plan,
                        piper::plan::StorageBytes &sizes) {
  if (backend.empty())
    return piper::Status::ok();
  piper::runtime::ExecutorOptions options;
  if (backend != "cpu")
    options.createDevice = [](piper::runtime::Communicator *comm) {
      return piper::runtime::hal::createEmulatedGpuDevice(comm);
    };
  piper::StatusOr<piper::plan::Plan> laid =
      piper::runtime::Executor::deviceLayout(std::move(plan), options, sizes);
  if (!laid)
    return laid.status().withContext("laying the plan out for --backend " +
                                     backend);
  plan = std::move(*laid);
  return piper::Status::ok();
}

/// Prints one plan file; returns the process exit code (1 when it does not
/// fit options.deviceBytes).
int printPlan(const std::string &path, const PrintOptions &options) {
  piper::plan::Plan plan;
  std::string err = piper::plan::readPlanFile(path, plan);
  if (!err.empty())
    return fail(err);
  piper::plan::StorageBytes sizes;
  if (piper::Status laid = layOutFor(options.backend, plan, sizes); !laid)
    return fail(path + ": " + laid.message());
  if (options.memory) {
    std::string text;
    if (!piper::plan::memoryReport(plan, options.largest, text, &sizes))
      return fail(path + ": " + text);
    std::fputs(text.c_str(), stdout);
  } else if (options.textproto) {
    std::string text;
    if (!google::protobuf::TextFormat::PrintToString(plan, &text))
      return fail("cannot print " + path + " as text");
    std::fputs(text.c_str(), stdout);
  } else if (options.deviceBytes < 0) {
    // (--device-memory alone prints the verdict alone.)
    std::fputs(piper::plan::dumpPlan(plan, options.kernels).c_str(), stdout);
  }
  if (options.deviceBytes < 0)
    return 0;
  bool fits = false;
  std::string verdict =
      piper::plan::fitVerdict(plan, options.deviceBytes, fits);
  std::printf("%s%s\n", fits ? "" : "does not fit: ", verdict.c_str());
  return fits ? 0 : 1;
}

/// Writes `text` to `path`; returns "" or the error.
std::string writeText(const std::string &path, const std::string &text,
                      const char *what) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  return out ? "" : std::string("cannot write the ") + what + " '" + path + "'";
}

/// Simulates the step of the compiled folder `dir`; returns the exit code.
int simulateFolder(const std::string &dir,
                   const piper::plan::Manifest &manifest,
                   const piper::plan::Machine &machine,
                   const piper::plan::SimulateOptions &options, bool timeline,
                   const std::string &tracePath, const std::string &svgPath) {
  std::vector<piper::plan::Plan> plans(manifest.classes_size());
  for (int c = 0; c < manifest.classes_size(); ++c) {
    std::string err = piper::plan::readPlanFile(
        dir + "/" + manifest.classes(c).plan_file(), plans[c]);
    if (!err.empty())
      return fail(err);
  }
  piper::plan::Simulation sim;
  std::string err;
  if (!piper::plan::simulate(plans, machine, options, sim, err))
    return fail(dir + ": " + err);
  std::fputs(piper::plan::simulationReport(sim, timeline).c_str(), stdout);
  if (!tracePath.empty())
    if (std::string e =
            writeText(tracePath, piper::plan::timelineTraceJson(sim), "trace");
        !e.empty())
      return fail(e);
  if (!svgPath.empty())
    if (std::string e =
            writeText(svgPath, piper::plan::timelineSvg(sim, plans), "picture");
        !e.empty())
      return fail(e);
  return 0;
}

} // namespace

static int runPiperPlan(int argc, char **argv) {
  std::string path;
  bool noKernels = false, textproto = false, memory = false;
  bool simulate = false, timeline = false, blockingSends = false;
  int largest = 5;
  std::string tracePath, svgPath, machinePath, deviceMemory, backend;
  std::vector<std::string> costs;
  CLI::App app{"piper-plan: prints a plan file, or the manifest and every "
               "plan of a folder written by piperc compile, as text, or "
               "simulates one step of such a folder",
               "piper-plan"};
  app.add_option("path", path, "a plan file (plan_classN.pb) or an OUT/ folder")
      ->required();
  app.add_flag("--no-kernels", noKernels,
               "print segment signatures without their kernels");
  app.add_flag("--textproto", textproto,
               "print the raw protobuf text format instead");
  app.add_flag("--memory", memory,
               "print the arena layout from buffer lifetimes instead: state, "
               "arena, the largest blocks per plan and what is live at the "
               "step's peak");
  app.add_option("--largest", largest,
                 "with --memory: how many of the largest blocks, and of "
                 "those live at the peak, to list (default 5)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--device-memory", deviceMemory,
                 "say whether every rank of each plan fits a device of this "
                 "size (80GiB, 141GB, bytes): what it needs, and the headroom "
                 "or the step's peak and its largest buffers; exits 1 when a "
                 "plan does not fit (alone, or after --memory's report)");
  app.add_option("--backend", backend,
                 "print each plan as piper-run --backend BACKEND's executor "
                 "lays it out, with --memory and --device-memory too: the "
                 "GPU backends (cuda, cuda-emulation) lay the state and step "
                 "out again for the values and parameter copies they store "
                 "packed in bf16 plans (smaller; docs/memory-plan.md); no "
                 "GPU needed. Default: the plan file's memory plan")
      ->check(CLI::IsMember({"cpu", "cuda", "cuda-emulation"}));
  app.add_flag("--simulate", simulate,
               "simulate one training step of an OUT/ folder and print, per "
               "device class, the predicted step time, stream busy times and "
               "compute bubble (docs/simulator.md)");
  app.add_flag("--timeline", timeline,
               "with --simulate: also print every instruction's start and end");
  app.add_option("--trace", tracePath,
                 "with --simulate: write a Chrome/Perfetto trace (JSON) of the "
                 "simulated step to this file");
  app.add_option("--svg", svgPath,
                 "with --simulate: write the simulated step as a picture "
                 "(SVG: a row per device class, a lane per stream, boxes "
                 "coloured by pass, labelled by microbatch) to this file");
  app.add_option(
      "--machine", machinePath,
      "with --simulate: a JSON machine description (keys "
      "flops_per_second, memory_bytes_per_second, "
      "link_bytes_per_second, link_latency_seconds; 0 = free; "
      "devices_per_node with node_link_bytes_per_second and "
      "node_link_latency_seconds: the link inside a node; share_compute: "
      "true runs a device's CALLs one at a time across its compute "
      "streams; comm_uses_compute: true makes communication's byte time "
      "take that engine too (CPU ranks); bench/h100-cluster.json, "
      "bench/h200-cluster.json)");
  app.add_option("--cost", costs,
                 "with --simulate: KEY=SECONDS, a fixed duration for CALLs of "
                 "pass KEY (segment name suffix: F, B, U) or else for "
                 "instructions whose label starts with KEY (repeatable)")
      ->allow_extra_args(false);
  app.add_flag("--blocking-sends", blockingSends,
               "with --simulate: a SEND holds its stream until the transfer "
               "completes, as NCCL on a GPU stream (by default it is "
               "asynchronous, as the plan format defines it)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    // A malformed command line exits 2 (CLI11's own codes are 100+).
    return app.exit(e) == 0 ? 0 : 2;
  }
  bool simOnly = timeline || !tracePath.empty() || !svgPath.empty() ||
                 !machinePath.empty() || !costs.empty() || blockingSends;
  if (simOnly && !simulate)
    return fail("--timeline, --trace, --svg, --machine, --cost and "
                "--blocking-sends need --simulate");
  if (largest != 5 && !memory)
    return fail("--largest needs --memory");
  if (simulate && (memory || textproto || noKernels || !deviceMemory.empty() ||
                   !backend.empty()))
    return fail("--simulate cannot be combined with --memory, --textproto, "
                "--no-kernels, --device-memory or --backend");
  if (!deviceMemory.empty() && (textproto || noKernels))
    return fail("--device-memory cannot be combined with --textproto or "
                "--no-kernels");
  PrintOptions print;
  print.kernels = !noKernels;
  print.textproto = textproto;
  print.memory = memory;
  print.largest = largest;
  print.backend = backend;
  if (!deviceMemory.empty()) {
    piper::StatusOr<int64_t> size = piper::parseByteSize(deviceMemory);
    if (!size)
      return fail("--device-memory " + size.status().message());
    print.deviceBytes = *size;
  }
  if (simulate && !isDirectory(path))
    return fail("--simulate needs a folder written by piperc compile, not '" +
                path + "'");
  if (!isDirectory(path))
    return printPlan(path, print);

  piper::plan::Manifest manifest;
  std::string err = piper::plan::readManifest(
      path + "/" + piper::plan::kManifestFileName, manifest);
  if (!err.empty())
    return fail(err);
  if (simulate) {
    piper::plan::Machine machine;
    if (!machinePath.empty())
      if (std::string e = piper::plan::readMachineFile(machinePath, machine);
          !e.empty())
        return fail(e);
    piper::plan::SimulateOptions options;
    options.blockingSends = blockingSends;
    for (const std::string &c : costs) {
      size_t eq = c.find('=');
      char *end = nullptr;
      double seconds =
          eq == std::string::npos ? -1 : std::strtod(c.c_str() + eq + 1, &end);
      if (eq == std::string::npos || eq == 0 || end == c.c_str() + eq + 1 ||
          *end != '\0' || !(seconds >= 0))
        return fail("--cost '" + c +
                    "': expected KEY=SECONDS with SECONDS >= 0");
      options.overrides[c.substr(0, eq)] = seconds;
    }
    return simulateFolder(path, manifest, machine, options, timeline, tracePath,
                          svgPath);
  }
  const bool plain = !memory && print.deviceBytes < 0;
  if (plain)
    std::fputs(piper::plan::dumpManifest(manifest).c_str(), stdout);
  // Every class's verdict, even after one that does not fit.
  int rc = 0;
  for (const auto &c : manifest.classes()) {
    if (plain)
      std::fputs("\n", stdout);
    int classRc = printPlan(path + "/" + c.plan_file(), print);
    if (classRc != 0 && print.deviceBytes < 0)
      return classRc;
    rc = rc != 0 ? rc : classRc;
  }
  return rc;
}

int main(int argc, char **argv) {
  int rc = runPiperPlan(argc, argv);
  // What went to standard output must have arrived (> /dev/full).
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    return fail("cannot write to standard output: " +
                piper::errnoMessage(errno));
  }
  return rc;
}
