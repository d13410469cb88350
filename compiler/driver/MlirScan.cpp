// The MLIR text pre-scan (MlirScan.h): one pass over the characters, with
// the MLIR lexer's token rules where they matter for nesting.
#include "compiler/driver/MlirScan.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <vector>

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"

namespace mlir::piper::driver {
namespace {

bool isIdStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool isIdChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' ||
         c == '.';
}
bool isDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)); }

/// The width of the integer type `word` spells (i32, si8, ui64); with
/// `shape`, of the element type that ends a shape's dimensions (x4xi32
/// after tensor<8 or ?); -1 when it spells none, INT64_MAX when the width
/// itself is too long to read.
int64_t integerTypeWidth(llvm::StringRef word, bool shape) {
  if (shape) {
    size_t x = word.rfind('x');
    if (x == llvm::StringRef::npos ||
        word.take_front(x).find_first_not_of("0123456789x?") !=
            llvm::StringRef::npos)
      return -1;
    word = word.drop_front(x + 1);
  }
  if (word.starts_with("si") || word.starts_with("ui"))
    word = word.drop_front();
  if (!word.consume_front("i") || word.empty() ||
      word.find_first_not_of("0123456789") != llvm::StringRef::npos)
    return -1;
  uint64_t width = 0;
  if (word.getAsInteger(10, width) || width > uint64_t(INT64_MAX))
    return INT64_MAX;
  return static_cast<int64_t>(width);
}

/// Why the nesting grew past the limit; picks the message.
enum class Growth { Bracket, AffineTerm, Alias };

class Scanner {
public:
  explicit Scanner(llvm::StringRef text) : text(text) {}

  std::string run() {
    for (i = 0; i < text.size() && error.empty(); ++i)
      step();
    return error;
  }

private:
  /// An open bracket; `terms` counts the affine operators of the current
  /// expression inside it.
  struct Frame {
    bool affine = false;
    int64_t terms = 0;
  };

  char at(size_t k) const { return k < text.size() ? text[k] : '\0'; }

  void step() {
    char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c)))
      return;
    // Only the token right after affine_map or affine_set opens an affine
    // bracket.
    bool afterAffineKeyword = affineNext;
    affineNext = false;
    if (c == '"')
      return string();
    if (c == '/' && at(i + 1) == '/') {
      size_t nl = text.find('\n', i);
      i = nl == llvm::StringRef::npos ? text.size() : nl;
      return;
    }
    if (c == '{' && at(i + 1) == '-' && at(i + 2) == '#') {
      endDefinitionAtTopLevel();
      i += 2;
      return open(false);
    }
    if (c == '#' && at(i + 1) == '-' && at(i + 2) == '}') {
      i += 2;
      return close();
    }
    if (c == '#' || c == '!' || c == '%' || c == '^')
      return prefixedIdentifier(c);
    if (c == '@') {
      // @"..." is a string; @name a bare identifier.
      if (isIdStart(at(i + 1)))
        skipWhile(i + 1, isIdChar);
      return;
    }
    if (isDigit(c))
      return number();
    if (isIdStart(c))
      return bareIdentifier();
    if (c == '-' && at(i + 1) == '>') {
      ++i; // the arrow: neither an operator nor a closing bracket
      return;
    }
    if (c == '>' && at(i + 1) == '=') {
      ++i; // an affine constraint's >=
      return;
    }
    if (c == '(' || c == '[' || c == '{' || c == '<')
      return open(c == '<' && afterAffineKeyword);
    if (c == ')' || c == ']' || c == '}' || c == '>')
      return close();
    if (c == ',' && !frames.empty()) {
      terms -= frames.back().terms;
      frames.back().terms = 0;
      return;
    }
    if ((c == '+' || c == '-' || c == '*') && inAffine())
      return term();
  }

  bool inAffine() const { return !frames.empty() && frames.back().affine; }

  /// Moves `i` to the last character of the run from `from` that `pred`
  /// accepts.
  template <typename Pred> void skipWhile(size_t from, Pred pred) {
    size_t k = from;
    while (k < text.size() && pred(text[k]))
      ++k;
    i = k - 1;
  }

  void string() {
    size_t k = i + 1;
    while (k < text.size() && text[k] != '"')
      k += text[k] == '\\' ? 2 : 1;
    i = std::min(k, text.size());
    // "name"( starts an operation in the generic form.
    if (frames.empty()) {
      size_t next = text.find_first_not_of(" \t\r\n", i + 1);
      if (next != llvm::StringRef::npos && text[next] == '(')
        endDefinitionAtTopLevel();
    }
  }

  void prefixedIdentifier(char sigil) {
    size_t start = i;
    skipWhile(i + 1, [](char ch) { return isIdChar(ch) || ch == '-'; });
    if (sigil == '%' && frames.empty())
      endDefinitionAtTopLevel(); // %x = ... starts an operation
    if (sigil != '#' && sigil != '!')
      return;
    std::string name = text.slice(start, i + 1).str();
    size_t next = text.find_first_not_of(" \t\r\n", i + 1);
    bool defines = frames.empty() && next != llvm::StringRef::npos &&
                   text[next] == '=' && at(next + 1) != '=';
    if (defines) {
      defining = name;
      aliasDepth[name] = 0;
      return;
    }
    auto it = aliasDepth.find(name);
    if (it != aliasDepth.end())
      reach(depth() + it->second, Growth::Alias, start);
  }

  void number() {
    size_t start = i, k = i;
    bool hex = false, integer = true;
    if (text[k] == '0' && at(k + 1) == 'x' &&
        std::isxdigit(static_cast<unsigned char>(at(k + 2)))) {
      hex = true;
      k += 2;
      while (k < text.size() &&
             std::isxdigit(static_cast<unsigned char>(text[k])))
        ++k;
    } else {
      while (k < text.size() && isDigit(text[k]))
        ++k;
      if (at(k) == '.') {
        integer = false;
        for (++k; k < text.size() && isDigit(text[k]);)
          ++k;
        if (at(k) == 'e' || at(k) == 'E') {
          ++k;
          if (at(k) == '+' || at(k) == '-')
            ++k;
          while (k < text.size() && isDigit(text[k]))
            ++k;
        }
      }
    }
    i = k - 1;
    int64_t chars = static_cast<int64_t>(k - start);
    if (chars > kMaxMlirNumberChars)
      return fail(llvm::formatv("has a number of {0} characters, more than "
                                "the limit of {1}",
                                chars, kMaxMlirNumberChars)
                      .str(),
                  start);
    // An integer literal longer than any 64-bit value: its conversion
    // grows with its length times the width it needs.
    int64_t digits = hex ? chars - 2 : chars;
    int64_t limit = hex ? kMaxMlirHexDigits : kMaxMlirIntegerDigits;
    if (integer && digits > limit)
      fail(llvm::formatv("has an integer of {0} {1}digits, more than a "
                         "{2}-bit value has ({3})",
                         digits, hex ? "hexadecimal " : "",
                         kMaxMlirIntegerWidth, limit)
               .str(),
           start);
  }

  void bareIdentifier() {
    size_t start = i;
    skipWhile(i, isIdChar);
    llvm::StringRef word = text.slice(start, i + 1);
    // A shape's dimensions end in its element type: 4xi32 reads as the
    // number 4, then x4xi32's tail.
    char before = start ? text[start - 1] : '\0';
    bool shape = word.starts_with("x") &&
                 (isDigit(before) || before == '?' || before == ']');
    if (int64_t width = integerTypeWidth(word, shape);
        width > kMaxMlirIntegerWidth)
      return fail(
          llvm::formatv("has an integer type of more than {0} bits ({1})",
                        kMaxMlirIntegerWidth,
                        shape ? word.drop_front(word.rfind('x') + 1) : word)
              .str(),
          shape ? start + word.rfind('x') + 1 : start);
    if (word == "affine_map" || word == "affine_set") {
      affineNext = true;
      return;
    }
    if (inAffine() &&
        (word == "mod" || word == "floordiv" || word == "ceildiv"))
      return term();
    // module, func.func, piper.program: an operation at the top level.
    if (frames.empty() && (word == "module" || word.contains('.')))
      endDefinitionAtTopLevel();
  }

  void open(bool affine) {
    bool inherited = inAffine();
    frames.push_back(Frame{affine || inherited, 0});
    reach(depth(), Growth::Bracket, i);
  }

  void close() {
    if (frames.empty())
      return;
    terms -= frames.back().terms;
    frames.pop_back();
  }

  void term() {
    ++frames.back().terms;
    ++terms;
    reach(depth(), Growth::AffineTerm, i);
  }

  int64_t depth() const { return static_cast<int64_t>(frames.size()) + terms; }

  /// Records nesting `d` at `where`: the current alias definition reaches
  /// it, and past the limit it is the error.
  void reach(int64_t d, Growth why, size_t where) {
    if (!defining.empty()) {
      int64_t &deepest = aliasDepth[defining];
      deepest = std::max(deepest, d);
    }
    if (d <= kMaxMlirNesting || !error.empty())
      return;
    const char *what =
        why == Growth::Bracket ? "nests brackets or regions"
        : why == Growth::AffineTerm
            ? "nests an affine expression (each operator a level)"
            : "nests brackets through aliases";
    fail(llvm::formatv("{0} more than {1} levels deep", what, kMaxMlirNesting)
             .str(),
         where);
  }

  /// An operation or file metadata at the top level ends the alias
  /// definition before it.
  void endDefinitionAtTopLevel() { defining.clear(); }

  void fail(const std::string &message, size_t where) {
    if (!error.empty())
      return;
    llvm::StringRef before = text.take_front(where);
    size_t line = before.count('\n') + 1;
    size_t lineStart = before.rfind('\n');
    size_t column =
        where - (lineStart == llvm::StringRef::npos ? 0 : lineStart + 1) + 1;
    error = llvm::formatv("{0} (line {1}, column {2})", message, line, column)
                .str();
  }

  llvm::StringRef text;
  size_t i = 0;
  std::vector<Frame> frames;
  /// The affine operators of every open bracket together.
  int64_t terms = 0;
  /// After affine_map or affine_set: a < next opens an affine bracket.
  bool affineNext = false;
  /// The alias whose definition is being read ("" at none), and the deepest
  /// nesting of each definition read so far, its use's nesting.
  std::string defining;
  llvm::StringMap<int64_t> aliasDepth;
  std::string error;
};

} // namespace

std::string scanMlirText(llvm::StringRef text) { return Scanner(text).run(); }

} // namespace mlir::piper::driver
