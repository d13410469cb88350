// Models from Hugging Face configurations (docs/hugging-face.md): a
// `config.json` as `transformers` writes it becomes the GptConfig of the
// same architecture, or a clear error naming the key whose math Piper does
// not implement.
#ifndef PIPER_COMPILER_FRONTEND_HFCONFIG_H
#define PIPER_COMPILER_FRONTEND_HFCONFIG_H

#include <string>

#include "compiler/frontend/GptModel.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringRef.h"

namespace mlir::piper {

/// Reads the Hugging Face configuration file `path` ("-": standard input)
/// into `text` with the shared input reader: a regular file of at most
/// kMaxHfConfigBytes (a FIFO, a device or a symlink to one is refused
/// unread). Returns "" or the error naming the file.
std::string readHfConfigFile(const std::string &path, std::string &text);

/// The model of a Hugging Face `config.json` (its text; `source` names it in
/// errors), with `seq` and `batch` as given (the configuration has neither).
/// Architectures: LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM,
/// GPT2LMHeadModel. Returns an empty string and fills `out`, or the error:
/// malformed JSON (or nested more than kMaxJsonNesting deep, or an object
/// repeating a key), a missing, mistyped or too large size, an unknown
/// architecture, a key Piper does not know, or a value whose math it does
/// not implement (each naming the key).
std::string gptConfigFromHuggingFace(llvm::StringRef text,
                                     llvm::StringRef source, int64_t seq,
                                     int64_t batch, GptConfig &out);

/// Records on every parameter of `module` (built from `cfg`, a model of a
/// Hugging Face configuration) the checkpoint tensors it is made of
/// (`piper.hf_sources`: names and layouts of `transformers`), and on the
/// module the configuration's text (`piper.hf_config`). Returns an empty
/// string, or the error.
std::string annotateHuggingFace(ModuleOp module, const GptConfig &cfg,
                                llvm::StringRef configText);

} // namespace mlir::piper

#endif // PIPER_COMPILER_FRONTEND_HFCONFIG_H
