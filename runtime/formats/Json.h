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

// Type-checked reads of one member of a JSON object. Reading a field with
// nlohmann/json's operator[], value() or get<T>() throws type_error (an
// uncaught exception, SIGABRT) when a file holds another type; these return
// an error instead: "\"step\" is a string, expected an integer", or
// "missing \"step\"" when `object` (which must be an object) lacks it.
// `object` not being an object is an error too.

/// A string member.
Status jsonString(const Json &object, const std::string &key, std::string &out);
/// An integer member that fits int64_t (a number with a fraction or an
/// exponent is not an integer).
Status jsonInt(const Json &object, const std::string &key, int64_t &out);
/// A non-negative integer member that fits uint64_t.
Status jsonUint(const Json &object, const std::string &key, uint64_t &out);
/// A number member, integer or not.
Status jsonNumber(const Json &object, const std::string &key, double &out);
/// An object member: `out` points into `object`.
Status jsonObject(const Json &object, const std::string &key, const Json *&out);
/// An array member: `out` points into `object`.
Status jsonArray(const Json &object, const std::string &key, const Json *&out);
/// Whether `object` is an object with member `key` (any type).
bool jsonHas(const Json &object, const std::string &key);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_FORMATS_JSON_H
