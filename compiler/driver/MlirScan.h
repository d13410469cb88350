// A pre-scan of MLIR text for what MLIR 22's parser would crash or stall on:
// it recurses once per level of nesting with no bound of its own, and turns a
// number's digits into an APInt or APFloat in time that grows faster than
// their count (a 100,000-digit integer took minutes, a 40,000-digit fraction
// crashed).
#ifndef PIPER_COMPILER_DRIVER_MLIRSCAN_H
#define PIPER_COMPILER_DRIVER_MLIRSCAN_H

#include <cstdint>
#include <string>

#include "llvm/ADT/StringRef.h"

namespace mlir::piper::driver {

/// How deep MLIR text may nest. Real models nest fewer than 20 levels; the
/// parser, the verifier and the printer each recurse a few frames per
/// level, so a few thousand levels overflow a thread's stack.
inline constexpr int64_t kMaxMlirNesting = 256;
/// The longest number literal, in characters: 1,000 digits hold a
/// 3,300-bit integer, and no attribute of the piper dialect needs more
/// than 64 bits.
inline constexpr int64_t kMaxMlirNumberChars = 1000;
/// The widest integer type (i64, si64, ui64): no model needs more, and
/// MLIR's own limit (2^24 - 1 bits) lets 4,000 attributes of i16777215 in
/// a 71 KB file take gigabytes, and 10,000 999-digit i4096 integers
/// take 48 s.
inline constexpr int64_t kMaxMlirIntegerWidth = 64;
/// The most digits of an integer literal: 20 decimal (2^64 - 1 has 20) or
/// 16 hexadecimal ones, all a value of at most kMaxMlirIntegerWidth bits
/// can have, so that converting one costs a bounded time.
inline constexpr int64_t kMaxMlirIntegerDigits = 20;
inline constexpr int64_t kMaxMlirHexDigits = 16;

/// Checks MLIR `text` before the parser reads it; "" when it may be parsed,
/// else the error, ending with its line and column. The nesting counts
///  - brackets and regions: { ( [ < and the file metadata's {-# #-};
///  - in an affine_map or affine_set, each operator of one expression
///    (+ - * mod floordiv ceildiv: the parser recurses per term and per
///    unary minus), until the next comma or closing bracket;
///  - at a use of an attribute or type alias (#a, !t), the deepest nesting
///    of its definition, so that chains of aliases count in full.
/// Integer types (i32, si8, ui64, and a shape's element type, 4xi32) are
/// at most kMaxMlirIntegerWidth bits wide, integer literals at most
/// kMaxMlirIntegerDigits (kMaxMlirHexDigits) digits long and every number
/// at most kMaxMlirNumberChars characters: the work of converting a
/// number or building a value is bounded per byte of input. Strings and
/// comments are skipped.
std::string scanMlirText(llvm::StringRef text);

} // namespace mlir::piper::driver

#endif // PIPER_COMPILER_DRIVER_MLIRSCAN_H
