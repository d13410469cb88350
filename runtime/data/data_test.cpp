// Tests of token files (header, dtypes, every error path, the vocabulary
// check) and of the byte-level tokenizer (round trips).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <csignal>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "runtime/data/ByteTokenizer.h"
#include "runtime/data/TokenFile.h"
#include "support/AtomicFile.h"

using namespace piper;

using namespace piper::runtime;

namespace {

std::string tempDir() {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/data-XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()));
  return tmpl;
}

void writeBytes(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

std::string readBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string le16(uint16_t v) {
  return std::string{static_cast<char>(v & 0xFF), static_cast<char>(v >> 8)};
}

std::string le32(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i)
    s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return s;
}

std::string header(uint32_t version, uint32_t width) {
  return std::string("PIPRTOKS") + le32(version) + le32(width);
}

/// Opens `path` and expects an error containing `expected`.
void expectOpenError(const std::string &path, TokenDType dtype,
                     const std::string &expected) {
  Status st;
  auto f = TokenFile::open(path, dtype, st);
  INFO("status: " << st.message());
  CHECK_FALSE(f);
  CHECK_FALSE(st);
  CHECK(st.message().find(expected) != std::string::npos);
  CHECK(st.message().rfind("token file '" + path + "': ", 0) == 0);
}

std::vector<uint32_t> allTokens(const TokenFile &f) {
  std::vector<uint32_t> out;
  for (int64_t i = 0; i < f.numTokens(); ++i)
    out.push_back(f.at(i));
  return out;
}

} // namespace

TEST_CASE("token files: headerless uint16 and uint32", "[data]") {
  std::string dir = tempDir();
  std::string path = dir + "/t.bin";
  writeBytes(path, le16(1) + le16(65535) + le16(7) + le16(0));

  Status st;
  auto f = TokenFile::open(path, TokenDType::Auto, st);
  REQUIRE(st);
  REQUIRE(f);
  CHECK_FALSE(f->hasHeader());
  CHECK(f->dtype() == TokenDType::U16); // nanoGPT's default
  CHECK(allTokens(*f) == std::vector<uint32_t>{1, 65535, 7, 0});
  std::vector<int32_t> window(3);
  f->copy(1, 3, window.data());
  CHECK(window == std::vector<int32_t>{65535, 7, 0});

  // The same 8 bytes read as uint32.
  auto g = TokenFile::open(path, TokenDType::U32, st);
  REQUIRE(g);
  CHECK(g->dtype() == TokenDType::U32);
  CHECK(allTokens(*g) == std::vector<uint32_t>{65535u * 65536u + 1, 7});
}

TEST_CASE("token files: the header chooses the width", "[data]") {
  std::string dir = tempDir();
  for (TokenDType dtype : {TokenDType::U16, TokenDType::U32}) {
    std::string path = dir + "/" + tokenDTypeName(dtype) + ".bin";
    std::vector<uint32_t> tokens = {3, 1, 4, 1, 5, 9, 2, 6};
    REQUIRE(writeTokenFile(path, tokens, dtype, /*withHeader=*/true));
    std::string bytes = readBytes(path);
    REQUIRE(bytes.size() == 16 + tokens.size() * tokenWidth(dtype));
    CHECK(bytes.substr(0, 16) == header(1, tokenWidth(dtype)));
    CHECK(bytes.substr(0, 16) == tokenFileHeader(dtype));
    Status st;
    for (TokenDType requested : {TokenDType::Auto, dtype}) {
      auto f = TokenFile::open(path, requested, st);
      REQUIRE(f);
      CHECK(f->hasHeader());
      CHECK(f->dtype() == dtype);
      CHECK(allTokens(*f) == tokens);
    }
    TokenDType other =
        dtype == TokenDType::U16 ? TokenDType::U32 : TokenDType::U16;
    expectOpenError(path, other,
                    std::string("the requested dtype ") +
                        tokenDTypeName(other) +
                        " disagrees with the file's header, which says " +
                        tokenDTypeName(dtype));
  }
}

TEST_CASE("token files: error paths", "[data]") {
  std::string dir = tempDir();
  std::string path = dir + "/bad.bin";

  SECTION("missing file") {
    expectOpenError(dir + "/nope.bin", TokenDType::Auto,
                    "cannot open: no such file or directory");
  }
  SECTION("a directory") {
    expectOpenError(dir, TokenDType::Auto, "not a regular file");
  }
  SECTION("odd size for uint16") {
    writeBytes(path, "abcde");
    expectOpenError(path, TokenDType::U16,
                    "5 bytes are not a whole number of 2-byte tokens (uint16)");
  }
  SECTION("size not a multiple of 4 for uint32") {
    writeBytes(path, "abcdef");
    expectOpenError(path, TokenDType::U32,
                    "6 bytes are not a whole number of 4-byte tokens (uint32)");
  }
  SECTION("odd size after a header") {
    writeBytes(path, header(1, 4) + "abcdefg");
    expectOpenError(path, TokenDType::Auto,
                    "after the 16-byte header, 7 bytes are not a whole number "
                    "of 4-byte tokens (uint32)");
  }
  SECTION("truncated header") {
    writeBytes(path, std::string("PIPRTOKS") + le32(1));
    expectOpenError(path, TokenDType::Auto,
                    "truncated header: the file has 12 bytes, the header 16");
  }
  SECTION("unknown version") {
    writeBytes(path, header(2, 2) + le16(1));
    expectOpenError(path, TokenDType::Auto,
                    "header version 2 is not supported (this runtime reads "
                    "version 1)");
  }
  SECTION("unknown width") {
    writeBytes(path, header(1, 3) + "abc");
    expectOpenError(path, TokenDType::Auto,
                    "the header says 3 bytes per token; only 2 (uint16) and 4 "
                    "(uint32) exist");
  }
  SECTION("an empty file opens with no tokens") {
    writeBytes(path, "");
    Status st;
    auto f = TokenFile::open(path, TokenDType::Auto, st);
    REQUIRE(f);
    CHECK(f->numTokens() == 0);
    CHECK(f->checkVocab(10));
  }
  SECTION("a token that does not fit uint16 cannot be written") {
    Status st = writeTokenFile(path, {1, 70000}, TokenDType::U16, false);
    CHECK_FALSE(st);
    CHECK(st.message().find("the token at index 1 is 70000, which does not "
                            "fit uint16") != std::string::npos);
  }
  SECTION("parsing dtype names") {
    CHECK(*parseTokenDType("uint16") == TokenDType::U16);
    CHECK(*parseTokenDType("uint32") == TokenDType::U32);
    CHECK(*parseTokenDType("auto") == TokenDType::Auto);
    StatusOr<TokenDType> st = parseTokenDType("int8");
    CHECK_FALSE(st);
    CHECK(st.status().message() ==
          "unknown token dtype 'int8' (expected uint16 or uint32)");
  }
}

TEST_CASE("token files: the layout from bytes agrees with open()", "[data]") {
  std::string dir = tempDir();
  std::string path = dir + "/t.bin";
  const std::vector<std::string> files = {"",
                                          "abcd",
                                          "abcde",
                                          header(1, 2) + "ab",
                                          header(1, 4) + "abcdefg",
                                          header(1, 4) + "abcdefgh",
                                          std::string("PIPRTOKS") + le32(1),
                                          header(2, 2),
                                          header(1, 3) + "abc",
                                          "PIPRTOK"};
  for (const std::string &bytes : files) {
    for (TokenDType dtype :
         {TokenDType::Auto, TokenDType::U16, TokenDType::U32}) {
      writeBytes(path, bytes);
      Status opened;
      auto f = TokenFile::open(path, dtype, opened);
      TokenFileLayout layout;
      Status parsed = parseTokenFileLayout(
          path, reinterpret_cast<const unsigned char *>(bytes.data()),
          static_cast<int64_t>(bytes.size()), dtype, layout);
      INFO(bytes.size() << " bytes, dtype " << tokenDTypeName(dtype));
      CHECK(parsed.message() == opened.message());
      if (f) {
        CHECK(layout.numTokens == f->numTokens());
        CHECK(layout.header == f->hasHeader());
        CHECK(layout.dtype == f->dtype());
      }
    }
  }
}

TEST_CASE("token files: the vocabulary check names the first bad token",
          "[data]") {
  std::string dir = tempDir();
  std::string path = dir + "/v.bin";
  for (TokenDType dtype : {TokenDType::U16, TokenDType::U32}) {
    REQUIRE(writeTokenFile(path, {0, 5, 9, 10, 12, 3}, dtype, false));
    Status st;
    auto f = TokenFile::open(path, dtype, st);
    REQUIRE(f);
    CHECK(f->checkVocab(13));
    Status bad = f->checkVocab(10);
    CHECK_FALSE(bad);
    CHECK(bad.message() == "token file '" + path +
                               "': the token at index 3 is 10, not below the "
                               "model's vocab_size 10");
  }
  // Every uint16 is below a vocabulary of 2^16 or more.
  REQUIRE(writeTokenFile(path, {65535}, TokenDType::U16, false));
  Status st;
  auto f = TokenFile::open(path, TokenDType::U16, st);
  REQUIRE(f);
  CHECK(f->checkVocab(65536));
  CHECK_FALSE(f->checkVocab(65535));
}

TEST_CASE("piper-tokenize's library: byte round trip", "[data][tokenizer]") {
  std::string dir = tempDir();
  std::string text;
  for (int i = 0; i < 3; ++i)
    for (int b = 0; b < 256; ++b)
      text.push_back(static_cast<char>(b));
  text += "Hello, world!\n";
  std::string input = dir + "/in.txt";
  writeBytes(input, text);
  for (TokenDType dtype : {TokenDType::U16, TokenDType::U32}) {
    for (bool withHeader : {false, true}) {
      std::string out = dir + "/out.bin";
      int64_t count = -1;
      REQUIRE(tokenizeBytesFile(input, out, dtype, withHeader, count));
      CHECK(count == static_cast<int64_t>(text.size()));
      CHECK(readBytes(out).size() ==
            (withHeader ? 16 : 0) + text.size() * tokenWidth(dtype));
      Status st;
      auto f = TokenFile::open(out, withHeader ? TokenDType::Auto : dtype, st);
      REQUIRE(f);
      REQUIRE(f->numTokens() == count);
      CHECK(f->checkVocab(kByteVocabSize));
      std::string back;
      for (int64_t i = 0; i < f->numTokens(); ++i)
        back.push_back(static_cast<char>(f->at(i)));
      CHECK(back == text);
    }
  }
}

TEST_CASE("piper-tokenize's library: chunks, empty input, errors",
          "[data][tokenizer]") {
  std::string dir = tempDir();
  // Larger than the 1 MiB read chunk, and not a multiple of it.
  std::string big((5 << 19) + 3, '\0');
  for (size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<char>((i * 131 + 7) & 0xFF);
  writeBytes(dir + "/big.txt", big);
  int64_t count = 0;
  REQUIRE(tokenizeBytesFile(dir + "/big.txt", dir + "/big.bin", TokenDType::U16,
                            false, count));
  CHECK(count == static_cast<int64_t>(big.size()));
  Status st;
  auto f = TokenFile::open(dir + "/big.bin", TokenDType::U16, st);
  REQUIRE(f);
  bool same = f->numTokens() == count;
  for (int64_t i = 0; same && i < count; ++i)
    same = f->at(i) == static_cast<unsigned char>(big[i]);
  CHECK(same);

  writeBytes(dir + "/empty.txt", "");
  REQUIRE(tokenizeBytesFile(dir + "/empty.txt", dir + "/empty.bin",
                            TokenDType::U16, true, count));
  CHECK(count == 0);
  CHECK(readBytes(dir + "/empty.bin") == tokenFileHeader(TokenDType::U16));

  // The input is never overwritten, by its own name or another (a link).
  Status onInput = tokenizeBytesFile(dir + "/big.txt", dir + "/big.txt",
                                     TokenDType::U16, false, count);
  CHECK_FALSE(onInput);
  CHECK(onInput.message().find("does not overwrite its input") !=
        std::string::npos);
  REQUIRE(::symlink((dir + "/big.txt").c_str(), (dir + "/alias").c_str()) == 0);
  CHECK_FALSE(tokenizeBytesFile(dir + "/big.txt", dir + "/alias",
                                TokenDType::U16, false, count));
  CHECK(readBytes(dir + "/big.txt") == big);

  Status missing = tokenizeBytesFile(dir + "/nope.txt", dir + "/x.bin",
                                     TokenDType::U16, false, count);
  CHECK_FALSE(missing);
  CHECK(missing.message() == "input '" + dir +
                                 "/nope.txt': cannot open: no such file or "
                                 "directory");
  Status noDir = tokenizeBytesFile(dir + "/big.txt", dir + "/no/such/x.bin",
                                   TokenDType::U16, false, count);
  CHECK_FALSE(noDir);
  CHECK(noDir.message().find("cannot create a temporary file next to") !=
        std::string::npos);
  // A failed write leaves no temporary file behind.
  CHECK(::access((dir + "/x.bin").c_str(), F_OK) != 0);

  // Opening a FIFO blocked until a writer came (piper-tokenize hung), and
  // /dev/zero never ends.
  REQUIRE(::mkfifo((dir + "/in.fifo").c_str(), 0644) == 0);
  Status fifo = tokenizeBytesFile(dir + "/in.fifo", dir + "/f.bin",
                                  TokenDType::U16, false, count);
  CHECK(fifo.message() == "input '" + dir + "/in.fifo': is not a regular file");
  Status zero = tokenizeBytesFile("/dev/zero", dir + "/z.bin", TokenDType::U16,
                                  false, count);
  CHECK(zero.message() == "input '/dev/zero': is not a regular file");
}

TEST_CASE("atomic files replace their target only on commit", "[data]") {
  std::string dir = tempDir();
  std::string path = dir + "/f";
  writeBytes(path, "old");
  {
    AtomicFile f;
    REQUIRE(f.open(path));
    REQUIRE(f.write("new", 3));
    CHECK(readBytes(path) == "old");
    // Destroyed without commit: the target is untouched.
  }
  CHECK(readBytes(path) == "old");
  AtomicFile f;
  REQUIRE(f.open(path));
  REQUIRE(f.write("new!", 4));
  REQUIRE(f.commit());
  CHECK(readBytes(path) == "new!");
  // Only the target is left in the folder.
  CHECK(::rmdir(dir.c_str()) != 0);
  REQUIRE(::unlink(path.c_str()) == 0);
  CHECK(::rmdir(dir.c_str()) == 0);
}

TEST_CASE("atomic files never replace a device, a FIFO or a folder", "[data]") {
  std::string dir = tempDir();
  REQUIRE(::mkfifo((dir + "/fifo").c_str(), 0644) == 0);
  AtomicFile f;
  CHECK(f.open("/dev/null").message() ==
        "'/dev/null' exists and is not a regular file (a device or a FIFO?); "
        "refusing to replace it");
  CHECK(f.open(dir + "/fifo").message().find("is not a regular file") !=
        std::string::npos);
  CHECK(f.open(dir).message() == "'" + dir + "' is a directory");
  CHECK(checkWritableTarget("/dev/full", "--save").message() ==
        "--save '/dev/full': exists and is not a regular file (a device or "
        "a FIFO?); refusing to replace it");
  CHECK(checkWritableTarget("", "--save").message() ==
        "--save needs a file name, not ''");
  CHECK(checkWritableTarget(dir + "/new/sub/file", "--save"));
  CHECK(checkRegularFile(dir + "/fifo", "plan file 'p'").message() ==
        "plan file 'p': is not a regular file");
  CHECK(checkRegularFile("/dev/zero", "manifest 'm'").message() ==
        "manifest 'm': is not a regular file");
  CHECK(checkRegularFile(dir + "/nope", "x").message() ==
        "x: cannot open: no such file or directory");
  // Reading a FIFO as a token file fails at once instead of waiting for a
  // writer.
  Status st;
  CHECK_FALSE(TokenFile::open(dir + "/fifo", TokenDType::Auto, st));
  CHECK(st.message() == "token file '" + dir + "/fifo': is not a regular file");
}

TEST_CASE("half-written files go when the process is told to stop", "[data]") {
  std::string dir = tempDir();
  std::fflush(nullptr);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    removeTempFilesOnSignals();
    AtomicFile f;
    if (!f.open(dir + "/ckpt") || !f.write("partial", 7))
      ::_exit(10);
    // A checkpoint part another rank would merge.
    std::ofstream(dir + "/ckpt.class1.part") << "part";
    rememberTempFile(dir + "/ckpt.class1.part");
    ::raise(SIGTERM);
    ::_exit(11); // not reached
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGTERM);
  // Nothing is left in the folder.
  CHECK(::rmdir(dir.c_str()) == 0);

  // removeTempFiles() (what a failing rank calls before _exit) too; a
  // forgotten file stays.
  dir = tempDir();
  writeBytes(dir + "/a", "a");
  writeBytes(dir + "/b", "b");
  rememberTempFile(dir + "/a");
  forgetTempFile(rememberTempFile(dir + "/b"));
  removeTempFiles();
  CHECK(::access((dir + "/a").c_str(), F_OK) != 0);
  CHECK(readBytes(dir + "/b") == "b");
}
