// Strict JSON parsing for the runtime's files, on nlohmann/json.
#ifndef PIPER_RUNTIME_CHECKPOINT_JSON_H
#define PIPER_RUNTIME_CHECKPOINT_JSON_H

#include <string>

#include <nlohmann/json.hpp>

#include "runtime/support/Status.h"

namespace piper::runtime {

/// A JSON value whose objects keep their members in file order (a
/// safetensors header lists its tensors in the order they were written).
using Json = nlohmann::ordered_json;

/// The deepest nesting parseJson accepts.
constexpr int kJsonMaxDepth = 64;

/// Parses `text` (one value, surrounded by optional whitespace) into `out`.
/// Rejects what RFC 8259 does not allow (invalid UTF-8 included), and, which
/// nlohmann/json alone would accept, duplicate object keys and nesting deeper
/// than kJsonMaxDepth. Errors read "malformed JSON at byte N: ..." with N the
/// 0-based offset where parsing stopped, or "malformed JSON: ..." for a
/// duplicate key or too deep a nesting.
Status parseJson(const std::string &text, Json &out);

/// "an object", "a string", "a number", ... for messages.
const char *jsonKindName(const Json &value);

/// `s` as a JSON string literal, quotes included, for messages (invalid
/// UTF-8 is shown as U+FFFD).
std::string jsonQuote(const std::string &s);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_CHECKPOINT_JSON_H
