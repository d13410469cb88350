// Strict JSON parsing for the runtime's files, on nlohmann/json.
#ifndef PIPER_RUNTIME_FORMATS_JSON_H
#define PIPER_RUNTIME_FORMATS_JSON_H

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "support/Status.h"

namespace piper::runtime {

/// A JSON value whose objects keep their members in file order (a
/// safetensors header lists its tensors in the order they were written).
using Json = nlohmann::ordered_json;

/// The deepest nesting parseJson accepts.
constexpr int kJsonMaxDepth = 64;

/// Parses `text` (one value, surrounded by optional whitespace).
/// Rejects what RFC 8259 does not allow (invalid UTF-8 included), and, which
/// nlohmann/json alone would accept, duplicate object keys and nesting deeper
/// than kJsonMaxDepth. Errors read "malformed JSON at byte N: ..." with N the
/// 0-based offset where parsing stopped, or "malformed JSON: ..." for a
/// duplicate key or too deep a nesting.
StatusOr<Json> parseJson(const std::string &text);

/// "an object", "a string", "a number", ... for messages.
const char *jsonKindName(const Json &value);

/// `s` as a JSON string literal, quotes included, for messages (invalid
/// UTF-8 is shown as U+FFFD).
std::string jsonQuote(const std::string &s);

// Type-checked reads of one member of a JSON object. Reading a field with
// nlohmann/json's operator[], value() or get<T>() throws type_error (an
// uncaught exception, SIGABRT) when a file holds another type; these return
// an error instead: "\"step\" is a string, expected an integer", or
// "missing \"step\"" when `object` (which must be an object) lacks it.
// `object` not being an object is an error too.

/// A string member.
StatusOr<std::string> jsonString(const Json &object, const std::string &key);
/// An integer member that fits int64_t (a number with a fraction or an
/// exponent is not an integer).
StatusOr<int64_t> jsonInt(const Json &object, const std::string &key);
/// A non-negative integer member that fits uint64_t.
StatusOr<uint64_t> jsonUint(const Json &object, const std::string &key);
/// A number member, integer or not.
StatusOr<double> jsonNumber(const Json &object, const std::string &key);
/// An object member (a pointer into `object`).
StatusOr<const Json *> jsonObject(const Json &object, const std::string &key);
/// An array member (a pointer into `object`).
StatusOr<const Json *> jsonArray(const Json &object, const std::string &key);
/// Whether `object` is an object with member `key` (any type).
bool jsonHas(const Json &object, const std::string &key);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_FORMATS_JSON_H
