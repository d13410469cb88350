// A pre-scan of JSON (strategies, Hugging Face configurations) for what
// llvm::json::parse would crash on or let through unnoticed.
#ifndef PIPER_COMPILER_STRATEGY_JSONSCAN_H
#define PIPER_COMPILER_STRATEGY_JSONSCAN_H

#include <cstdint>
#include <string>

#include "llvm/ADT/StringRef.h"

namespace mlir::piper {

/// The deepest nesting of lists and objects scanJson lets through.
inline constexpr int64_t kMaxJsonNesting = 64;

/// What scanJson found; each field is "" or an error message.
struct JsonScan {
  /// Lists and objects nested more than kMaxJsonNesting deep: llvm::json
  /// recurses once per level, so a deep input would overflow the stack.
  std::string nesting;
  /// The first key an object repeats: llvm::json keeps the last value
  /// without a word. Meaningful only for text that parses.
  std::string duplicate;
};

/// Scans `text` (JSON, a `what` such as "strategy": the nesting error
/// names it) for nesting and repeated keys, without recursion; stops at the
/// first nesting error.
JsonScan scanJson(llvm::StringRef text, llvm::StringRef what);

} // namespace mlir::piper

#endif // PIPER_COMPILER_STRATEGY_JSONSCAN_H
