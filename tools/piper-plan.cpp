// piper-plan: prints a compiled plan (or a whole compiled folder) as text, for
// people reading what the compiler produced and for FileCheck tests.
#include <cstdio>
#include <string>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <google/protobuf/text_format.h>

#include "proto/PlanDump.h"
#include "proto/PlanFile.h"
#include "proto/analysis/MemoryPlan.h"

namespace {

bool isDirectory(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int fail(const std::string &message) {
  std::fprintf(stderr, "piper-plan: %s\n", message.c_str());
  return 1;
}

/// Prints one plan file; returns the process exit code.
int printPlan(const std::string &path, bool kernels, bool textproto,
              bool memory) {
  piper::plan::Plan plan;
  std::string err = piper::plan::readPlanFile(path, plan);
  if (!err.empty())
    return fail(err);
  if (memory) {
    std::string text;
    if (!piper::plan::memoryReport(plan, 5, text))
      return fail(path + ": " + text);
    std::fputs(text.c_str(), stdout);
  } else if (textproto) {
    std::string text;
    if (!google::protobuf::TextFormat::PrintToString(plan, &text))
      return fail("cannot print " + path + " as text");
    std::fputs(text.c_str(), stdout);
  } else {
    std::fputs(piper::plan::dumpPlan(plan, kernels).c_str(), stdout);
  }
  return 0;
}

} // namespace

int main(int argc, char **argv) {
  std::string path;
  bool noKernels = false, textproto = false, memory = false;
  CLI::App app{"piper-plan: prints a plan file, or the manifest and every "
               "plan of a folder written by piperc compile, as text",
               "piper-plan"};
  app.add_option("path", path, "a plan file (plan_classN.pb) or an OUT/ folder")
      ->required();
  app.add_flag("--no-kernels", noKernels,
               "print segment signatures without their kernels");
  app.add_flag("--textproto", textproto,
               "print the raw protobuf text format instead");
  app.add_flag("--memory", memory,
               "print the arena layout from buffer lifetimes instead: state, "
               "arena and the largest blocks per plan");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    return app.exit(e);
  }
  if (!isDirectory(path))
    return printPlan(path, !noKernels, textproto, memory);

  piper::plan::Manifest manifest;
  std::string err = piper::plan::readManifest(
      path + "/" + piper::plan::kManifestFileName, manifest);
  if (!err.empty())
    return fail(err);
  if (!memory)
    std::fputs(piper::plan::dumpManifest(manifest).c_str(), stdout);
  for (const auto &c : manifest.classes()) {
    if (!memory)
      std::fputs("\n", stdout);
    if (int rc = printPlan(path + "/" + c.plan_file(), !noKernels, textproto,
                           memory))
      return rc;
  }
  return 0;
}
