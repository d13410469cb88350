// The byte-level tokenizer behind piper-tokenize: every byte is one token.
#ifndef PIPER_RUNTIME_DATA_BYTETOKENIZER_H
#define PIPER_RUNTIME_DATA_BYTETOKENIZER_H

#include <cstdint>
#include <string>

#include "runtime/data/TokenFile.h"
#include "support/Status.h"

namespace piper::runtime {

/// The vocabulary of byte-level tokens: 0..255.
constexpr int64_t kByteVocabSize = 256;

/// Writes the bytes of `inputPath` to `outputPath` as a token file of
/// `dtype` (U16 or U32; Auto means U16), one token per byte, with the
/// 16-byte header when `withHeader`. Streams the input, writes the output
/// atomically and sets `numTokens` to the number of tokens written.
Status tokenizeBytesFile(const std::string &inputPath,
                         const std::string &outputPath, TokenDType dtype,
                         bool withHeader, int64_t &numTokens);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_DATA_BYTETOKENIZER_H
