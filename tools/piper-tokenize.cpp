// piper-tokenize: turns a text file into a byte-level token file for
// `piper-run --data` (see docs/data.md).
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "runtime/data/ByteTokenizer.h"

int main(int argc, char **argv) {
  using namespace piper;
  using namespace piper::runtime;
  std::string input, output, dtypeName = "uint16";
  bool header = false;
  CLI::App app{"piper-tokenize: writes every byte of INPUT as one token "
               "(vocabulary 256) to a token file for piper-run --data",
               "piper-tokenize"};
  app.add_option("input", input, "the text (or any) file to tokenize")
      ->required();
  app.add_option("-o,--output", output, "the token file to write")->required();
  app.add_option("--dtype", dtypeName, "token width: uint16 or uint32")
      ->check(CLI::IsMember({"uint16", "uint32"}))
      ->capture_default_str();
  app.add_flag("--header", header,
               "start the file with the 16-byte PIPRTOKS header");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError &e) {
    // A malformed command line exits 2 (CLI11's own codes are 100+).
    return app.exit(e) == 0 ? 0 : 2;
  }
  StatusOr<TokenDType> dtype = parseTokenDType(dtypeName);
  Status st = dtype.status();
  int64_t count = 0;
  if (st)
    st = tokenizeBytesFile(input, output, *dtype, header, count);
  if (!st) {
    fmt::print(stderr, "piper-tokenize: {}\n", st.message());
    return 1;
  }
  fmt::print("{} tokens ({}, {}, vocab {}) written to {}\n", count,
             tokenDTypeName(*dtype), header ? "with header" : "no header",
             kByteVocabSize, output);
  return 0;
}
