// The piperc driver: `piperc model ...` and `piperc compile ...`.
#ifndef PIPER_COMPILER_DRIVER_DRIVER_H
#define PIPER_COMPILER_DRIVER_DRIVER_H

namespace mlir::piper {

/// Runs piperc with the given command line; returns the process exit code.
int pipercMain(int argc, char **argv);

/// Registers the piper dialect, passes and pipelines for piper-opt; returns
/// MlirOptMain's exit code.
int piperOptMain(int argc, char **argv);

} // namespace mlir::piper

#endif // PIPER_COMPILER_DRIVER_DRIVER_H
