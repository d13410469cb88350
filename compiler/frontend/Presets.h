// Named model presets for `piperc model NAME` and `piperc model --list`.
#ifndef PIPER_COMPILER_FRONTEND_PRESETS_H
#define PIPER_COMPILER_FRONTEND_PRESETS_H

#include <optional>
#include <string>
#include <vector>

#include "compiler/frontend/GptModel.h"

namespace mlir::piper {

/// A named configuration with a one-line description.
struct ModelPreset {
  std::string name;
  std::string description;
  GptConfig config;
};

/// Every preset, the plain family names ("gpt", "llama") first.
const std::vector<ModelPreset> &modelPresets();

/// The preset called `name`, if any.
std::optional<ModelPreset> findPreset(const std::string &name);

/// A table of every preset with its sizes and parameter count.
std::string formatPresetTable();

} // namespace mlir::piper

#endif // PIPER_COMPILER_FRONTEND_PRESETS_H
