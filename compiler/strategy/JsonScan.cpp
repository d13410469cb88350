// The JSON pre-scan (JsonScan.h).
#include "compiler/strategy/JsonScan.h"

#include <vector>

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

using namespace mlir::piper;

namespace {
/// An open list or object; an object remembers its keys.
struct Frame {
  bool object = false;
  bool expectKey = false;
  llvm::StringSet<> keys;
};

/// The key a quoted JSON string stands for, escapes decoded.
std::string decodeKey(llvm::StringRef quoted) {
  llvm::StringRef raw = quoted.drop_front().drop_back();
  if (!raw.contains('\\'))
    return raw.str();
  llvm::Expected<llvm::json::Value> v = llvm::json::parse(quoted);
  if (!v) {
    llvm::consumeError(v.takeError());
    return raw.str();
  }
  std::optional<llvm::StringRef> s = v->getAsString();
  return s ? s->str() : raw.str();
}
} // namespace

JsonScan mlir::piper::scanJson(llvm::StringRef text, llvm::StringRef what) {
  JsonScan scan;
  std::vector<Frame> open;
  int64_t line = 1;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\n') {
      ++line;
    } else if (c == '"') {
      size_t start = i;
      for (++i; i < text.size() && text[i] != '"'; ++i)
        if (text[i] == '\\')
          ++i;
      // An unterminated string: the parser reports it.
      if (i >= text.size())
        break;
      if (open.empty() || !open.back().object || !open.back().expectKey)
        continue;
      open.back().expectKey = false;
      std::string key = decodeKey(text.slice(start, i + 1));
      if (!open.back().keys.insert(key).second && scan.duplicate.empty())
        scan.duplicate = llvm::formatv("key \"{0}\" appears twice in one "
                                       "object (line {1})",
                                       key, line)
                             .str();
    } else if (c == '[' || c == '{') {
      if (static_cast<int64_t>(open.size()) >= kMaxJsonNesting) {
        scan.nesting = llvm::formatv("{0} nests lists and objects more than "
                                     "{1} levels deep (line {2})",
                                     what, kMaxJsonNesting, line)
                           .str();
        return scan;
      }
      open.emplace_back();
      open.back().object = open.back().expectKey = c == '{';
    } else if ((c == ']' || c == '}') && !open.empty()) {
      open.pop_back();
    } else if (c == ',' && !open.empty() && open.back().object) {
      open.back().expectKey = true;
    }
  }
  return scan;
}
