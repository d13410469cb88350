// Flat token files (uint16 or uint32, optional 16-byte header), memory-mapped
// read-only so that every rank on a machine shares the same pages.
#ifndef PIPER_RUNTIME_DATA_TOKENFILE_H
#define PIPER_RUNTIME_DATA_TOKENFILE_H

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "support/Status.h"

namespace piper::runtime {

/// The width of the tokens of a token file. `Auto` is only a request: the
/// header's width when the file has one, uint16 (nanoGPT's .bin) otherwise.
enum class TokenDType { Auto, U16, U32 };

/// "uint16" or "uint32" (as --data-dtype spells them); "auto" for Auto.
const char *tokenDTypeName(TokenDType dtype);
/// Parses "uint16", "uint32" or "auto".
StatusOr<TokenDType> parseTokenDType(const std::string &text);
/// 2 or 4; 0 for Auto.
int tokenWidth(TokenDType dtype);

/// The optional header: magic, then version and bytes per token (uint32
/// little endian each), then the tokens.
constexpr char kTokenFileMagic[8] = {'P', 'I', 'P', 'R', 'T', 'O', 'K', 'S'};
constexpr uint32_t kTokenFileVersion = 1;
constexpr int64_t kTokenFileHeaderBytes = 16;

/// The 16-byte header for tokens of `dtype` (U16 or U32).
std::string tokenFileHeader(TokenDType dtype);

/// Where the tokens of a token file are and how wide they are.
struct TokenFileLayout {
  TokenDType dtype = TokenDType::U16; // U16 or U32: the width actually used
  bool header = false;
  int64_t dataOffset = 0; // 16 with a header, else 0
  int64_t numTokens = 0;
};

/// The header and size checks of TokenFile::open for a file of `size` bytes
/// that begins with `head` (its first min(size, 16) bytes), with `dtype`
/// requested. Messages are those of open(); `path` only names the file.
Status parseTokenFileLayout(const std::string &path, const unsigned char *head,
                            int64_t size, TokenDType dtype,
                            TokenFileLayout &out);

/// A read-only, memory-mapped token file. Reading is thread-safe.
class TokenFile {
public:
  /// Opens and maps `path`. `dtype` is the requested width: with a header,
  /// anything but Auto must agree with it. Fails with a message prefixed by
  /// "token file '<path>': " when the file is missing, is not a regular
  /// file, has a malformed header, or its size is not a whole number of
  /// tokens.
  static std::unique_ptr<TokenFile> open(const std::string &path,
                                         TokenDType dtype, Status &status);
  ~TokenFile();
  TokenFile(const TokenFile &) = delete;
  TokenFile &operator=(const TokenFile &) = delete;

  const std::string &path() const { return filePath; }
  /// U16 or U32: the width actually used.
  TokenDType dtype() const { return width; }
  bool hasHeader() const { return header; }
  int64_t numTokens() const { return count; }

  /// Token `index` (0 <= index < numTokens()).
  uint32_t at(int64_t index) const {
    return width == TokenDType::U16 ? tokens16()[index] : tokens32()[index];
  }
  /// Copies tokens [first, first + n) into `out` as int32 (the caller keeps
  /// the range in bounds; every token is below vocab_size <= INT32_MAX).
  void copy(int64_t first, int64_t n, int32_t *out) const;
  /// Checks that every token is below `vocabSize`; the error names the first
  /// offending token's index and value.
  Status checkVocab(int64_t vocabSize) const;

private:
  TokenFile() = default;
  const uint16_t *tokens16() const {
    return reinterpret_cast<const uint16_t *>(base + dataOffset);
  }
  const uint32_t *tokens32() const {
    return reinterpret_cast<const uint32_t *>(base + dataOffset);
  }
  std::string filePath;
  TokenDType width = TokenDType::U16;
  bool header = false;
  int64_t count = 0;
  const unsigned char *base = nullptr; // the mapping, or null when empty
  size_t mappedBytes = 0;
  int64_t dataOffset = 0;
};

/// Writes `tokens` as a token file of `dtype` (U16 or U32), with the header
/// when `withHeader`, atomically. Fails if a token does not fit the width.
Status writeTokenFile(const std::string &path,
                      const std::vector<uint32_t> &tokens, TokenDType dtype,
                      bool withHeader);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_DATA_TOKENFILE_H
