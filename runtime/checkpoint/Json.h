// A minimal JSON reader and writer helpers, enough for safetensors headers.
#ifndef PIPER_RUNTIME_CHECKPOINT_JSON_H
#define PIPER_RUNTIME_CHECKPOINT_JSON_H

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/support/Status.h"

namespace piper::runtime {

/// A parsed JSON value. Numbers keep their text, so that integers of any
/// size convert exactly; objects keep their members in file order.
struct JsonValue {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  std::string text; // a String's value or a Number's literal
  std::vector<JsonValue> items;
  std::vector<std::pair<std::string, JsonValue>> members;

  /// The member named `key` of an object, or null.
  const JsonValue *find(const std::string &key) const;
  /// True and sets `out` when this is a non-negative integer literal (no
  /// sign, fraction or exponent) that fits 64 bits.
  bool asUint64(uint64_t &out) const;
};

/// "object", "string", ... for messages.
const char *jsonKindName(JsonValue::Kind kind);

/// Parses `text` (one value, surrounded by optional whitespace). Rejects
/// anything RFC 8259 does not allow, duplicate object keys, and nesting
/// deeper than 64. Errors read "malformed JSON at byte N: ...".
Status parseJson(const std::string &text, JsonValue &out);

/// `s` as a JSON string literal, quotes included (UTF-8 passes through;
/// control characters, '"' and '\\' are escaped).
std::string jsonQuote(const std::string &s);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_CHECKPOINT_JSON_H
