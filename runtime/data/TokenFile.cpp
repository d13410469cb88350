// Token files: header parsing, size checks, mmap, vocabulary check, writing.
#include "runtime/data/TokenFile.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "support/AtomicFile.h"
#include "support/Errno.h"
#include "support/FileIO.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "token files are little endian and read in place");

namespace piper::runtime {

namespace {

uint32_t readU32(const unsigned char *p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 |
         uint32_t(p[3]) << 24;
}

void appendU32(std::string &out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

} // namespace

const char *tokenDTypeName(TokenDType dtype) {
  switch (dtype) {
  case TokenDType::U16:
    return "uint16";
  case TokenDType::U32:
    return "uint32";
  case TokenDType::Auto:
    break;
  }
  return "auto";
}

StatusOr<TokenDType> parseTokenDType(const std::string &text) {
  if (text == "uint16")
    return TokenDType::U16;
  if (text == "uint32")
    return TokenDType::U32;
  if (text == "auto" || text.empty())
    return TokenDType::Auto;
  return Status::error("unknown token dtype '" + text +
                       "' (expected uint16 or uint32)");
}

int tokenWidth(TokenDType dtype) {
  return dtype == TokenDType::U16 ? 2 : dtype == TokenDType::U32 ? 4 : 0;
}

std::string tokenFileHeader(TokenDType dtype) {
  std::string h(kTokenFileMagic, sizeof(kTokenFileMagic));
  appendU32(h, kTokenFileVersion);
  appendU32(h, static_cast<uint32_t>(tokenWidth(dtype)));
  return h;
}

Status parseTokenFileLayout(const std::string &path, const unsigned char *head,
                            int64_t size, TokenDType dtype,
                            TokenFileLayout &out) {
  std::string where = "token file '" + path + "': ";
  out = TokenFileLayout();
  // A header is recognized by its magic alone; a headerless file would need
  // its first four tokens to spell "PIPRTOKS" to be mistaken for one.
  if (size >= static_cast<int64_t>(sizeof(kTokenFileMagic)) &&
      std::memcmp(head, kTokenFileMagic, sizeof(kTokenFileMagic)) == 0) {
    if (size < kTokenFileHeaderBytes)
      return Status::error(
          where + fmt::format("truncated header: the file has {} bytes, the "
                              "header {}",
                              size, kTokenFileHeaderBytes));
    uint32_t version = readU32(head + 8);
    uint32_t bytesPerToken = readU32(head + 12);
    if (version != kTokenFileVersion)
      return Status::error(
          where + fmt::format("header version {} is not supported (this "
                              "runtime reads version {})",
                              version, kTokenFileVersion));
    if (bytesPerToken != 2 && bytesPerToken != 4)
      return Status::error(
          where + fmt::format("the header says {} bytes per token; only 2 "
                              "(uint16) and 4 (uint32) exist",
                              bytesPerToken));
    TokenDType fromHeader =
        bytesPerToken == 2 ? TokenDType::U16 : TokenDType::U32;
    if (dtype != TokenDType::Auto && dtype != fromHeader)
      return Status::error(where + "the requested dtype " +
                           tokenDTypeName(dtype) +
                           " disagrees with the file's header, which says " +
                           tokenDTypeName(fromHeader));
    out.header = true;
    out.dtype = fromHeader;
    out.dataOffset = kTokenFileHeaderBytes;
  } else {
    out.dtype = dtype == TokenDType::Auto ? TokenDType::U16 : dtype;
  }

  int64_t dataBytes = size - out.dataOffset;
  int width = tokenWidth(out.dtype);
  if (dataBytes % width != 0)
    return Status::error(
        where + fmt::format("{}{} bytes are not a whole number of {}-byte "
                            "tokens ({})",
                            out.header ? "after the 16-byte header, " : "",
                            dataBytes, width, tokenDTypeName(out.dtype)));
  out.numTokens = dataBytes / width;
  return Status::ok();
}

std::unique_ptr<TokenFile> TokenFile::open(const std::string &path,
                                           TokenDType dtype, Status &status) {
  std::string where = "token file '" + path + "': ";
  // O_NONBLOCK: opening a FIFO must not wait for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    status = Status::error(where + "cannot open: " + errnoMessage(errno));
    return nullptr;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    status = Status::error(where + "cannot stat: " + errnoMessage(errno));
    return nullptr;
  }
  if (!S_ISREG(st.st_mode)) {
    status = Status::error(where + "is not a regular file");
    return nullptr;
  }
  int64_t size = st.st_size;

  std::unique_ptr<TokenFile> file(new TokenFile());
  file->filePath = path;
  unsigned char head[kTokenFileHeaderBytes];
  size_t headBytes =
      static_cast<size_t>(std::min<int64_t>(size, kTokenFileHeaderBytes));
  if (headBytes > 0 && !preadAll(fd, head, headBytes, 0)) {
    status = Status::error(where + "cannot read: " + errnoMessage(errno));
    return nullptr;
  }
  TokenFileLayout layout;
  status = parseTokenFileLayout(path, head, size, dtype, layout);
  if (!status)
    return nullptr;
  file->header = layout.header;
  file->width = layout.dtype;
  file->dataOffset = layout.dataOffset;
  file->count = layout.numTokens;
  int64_t dataBytes = size - layout.dataOffset;
  if (dataBytes > 0) {
    void *p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED,
                     fd, 0);
    if (p == MAP_FAILED) {
      status = Status::error(where + "cannot map: " + errnoMessage(errno));
      return nullptr;
    }
    file->base = static_cast<const unsigned char *>(p);
    file->mappedBytes = static_cast<size_t>(size);
  }
  status = Status::ok();
  return file;
}

TokenFile::~TokenFile() {
  if (base)
    ::munmap(const_cast<unsigned char *>(base), mappedBytes);
}

void TokenFile::copy(int64_t first, int64_t n, int32_t *out) const {
  if (width == TokenDType::U16) {
    const uint16_t *src = tokens16() + first;
    for (int64_t i = 0; i < n; ++i)
      out[i] = static_cast<int32_t>(src[i]);
  } else {
    const uint32_t *src = tokens32() + first;
    for (int64_t i = 0; i < n; ++i)
      out[i] = static_cast<int32_t>(src[i]);
  }
}

Status TokenFile::checkVocab(int64_t vocabSize) const {
  auto bad = [&](int64_t index, uint32_t value) {
    return Status::error(fmt::format("token file '{}': the token at index {} "
                                     "is {}, not below the model's "
                                     "vocab_size {}",
                                     filePath, index, value, vocabSize));
  };
  if (vocabSize < 1)
    return Status::error(fmt::format(
        "token file '{}': vocab_size {} is out of range", filePath, vocabSize));
  if (width == TokenDType::U16) {
    if (vocabSize > 0xFFFF)
      return Status::ok(); // every uint16 fits
    uint16_t limit = static_cast<uint16_t>(vocabSize);
    const uint16_t *t = tokens16();
    for (int64_t i = 0; i < count; ++i)
      if (t[i] >= limit)
        return bad(i, t[i]);
  } else {
    uint64_t limit = static_cast<uint64_t>(vocabSize);
    const uint32_t *t = tokens32();
    for (int64_t i = 0; i < count; ++i)
      if (t[i] >= limit)
        return bad(i, t[i]);
  }
  return Status::ok();
}

Status writeTokenFile(const std::string &path,
                      const std::vector<uint32_t> &tokens, TokenDType dtype,
                      bool withHeader) {
  if (dtype == TokenDType::Auto)
    return Status::error("token file '" + path +
                         "': choose uint16 or uint32 to write");
  std::string bytes;
  if (withHeader)
    bytes = tokenFileHeader(dtype);
  int width = tokenWidth(dtype);
  bytes.reserve(bytes.size() + tokens.size() * width);
  for (size_t i = 0; i < tokens.size(); ++i) {
    uint32_t t = tokens[i];
    if (width == 2 && t > 0xFFFF)
      return Status::error(fmt::format("token file '{}': the token at index "
                                       "{} is {}, which does not fit uint16",
                                       path, i, t));
    for (int b = 0; b < width; ++b)
      bytes.push_back(static_cast<char>((t >> (8 * b)) & 0xFF));
  }
  AtomicFile out;
  PIPER_RETURN_IF_ERROR(out.open(path));
  PIPER_RETURN_IF_ERROR(out.write(bytes.data(), bytes.size()));
  return out.commit();
}

} // namespace piper::runtime
