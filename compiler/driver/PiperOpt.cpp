// piper-opt's driver: MLIR's opt main over the piper dialect and passes, with
// the input read by the shared reader and pre-scanned first.
#include "compiler/driver/Driver.h"
#include "compiler/driver/DriverSupport.h"

#include "compiler/transforms/Passes.h"
#include "dialects/piper/PiperDialect.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/ToolOutputFile.h"

using namespace mlir;
using namespace mlir::piper;
using namespace mlir::piper::driver;

int mlir::piper::piperOptMain(int argc, char **argv) {
  DialectRegistry registry;
  registry.insert<PiperDialect>();
  registerPiperCompilerPasses();
  auto [input, output] = registerAndParseCLIOptions(
      argc, argv, "piper-opt: the piper pass driver\n", registry);
  MlirOptMainConfig config = MlirOptMainConfig::createFromCLOptions();
  // Listing dialects or passes reads no input.
  if (config.shouldShowDialects() || config.shouldListPasses())
    return asMainReturnCode(MlirOptMain(argc, argv, input, output, registry));
  auto refuse = [](const std::string &msg) {
    llvm::errs() << "piper-opt: error: " << msg << "\n";
    return 1;
  };
  // The input goes through the shared reader and the pre-scan, files and
  // standard input alike, before MLIR's parser sees it.
  if (input == "-" && llvm::sys::Process::FileDescriptorIsDisplayed(0))
    llvm::errs() << "(processing input from stdin now, hit ctrl-c/ctrl-d to "
                    "interrupt)\n";
  std::string error;
  std::unique_ptr<llvm::MemoryBuffer> buffer =
      readMlirInput(input, "input", error);
  if (!buffer)
    return refuse(error);
  std::unique_ptr<llvm::ToolOutputFile> out = openOutputFile(output, &error);
  if (!out)
    return refuse(error);
  LogicalResult result =
      MlirOptMain(out->os(), std::move(buffer), registry, config);
  if (std::string err = closeOutput(out->os(), output); !err.empty())
    return refuse(err);
  if (failed(result))
    return 1;
  out->keep();
  return 0;
}
