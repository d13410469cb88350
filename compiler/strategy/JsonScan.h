// A pre-scan of strategy JSON for what llvm::json::parse would crash on or
// let through unnoticed.
#ifndef PIPER_COMPILER_STRATEGY_JSONSCAN_H
#define PIPER_COMPILER_STRATEGY_JSONSCAN_H

#include <string>

#include "llvm/ADT/StringRef.h"

namespace mlir::piper {

/// What scanJson found; each field is "" or an error message.
struct JsonScan {
  /// Lists and objects nested more than kMaxJsonNesting deep: llvm::json
  /// recurses once per level, so a deep input would overflow the stack.
  std::string nesting;
  /// The first key an object repeats: llvm::json keeps the last value
  /// without a word. Meaningful only for text that parses.
  std::string duplicate;
};

/// Scans `text` (JSON) for nesting and repeated keys, without recursion;
/// stops at the first nesting error.
JsonScan scanJson(llvm::StringRef text);

} // namespace mlir::piper

#endif // PIPER_COMPILER_STRATEGY_JSONSCAN_H
