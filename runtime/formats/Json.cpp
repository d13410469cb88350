// Strict JSON parsing on nlohmann/json: duplicate keys, nesting depth, and
// parse errors turned into Status messages.
#include "runtime/formats/Json.h"

#include <set>
#include <vector>

#include <fmt/format.h>

namespace piper::runtime {

namespace {

/// Thrown from the parser callback to stop at a document nlohmann/json would
/// accept but the runtime does not.
struct Rejected {
  std::string message;
};

/// nlohmann/json's message without its "[json.exception...] parse error at
/// line L, column C: " prefix, with bytes that are not printable ASCII
/// shown as \xNN (the message quotes the input it stopped at).
std::string describe(const Json::exception &e) {
  std::string what = e.what();
  size_t column = what.find("column ");
  size_t from =
      column == std::string::npos ? what.find("] ") : what.find(": ", column);
  if (from != std::string::npos)
    what = what.substr(from + 2);
  std::string out;
  for (unsigned char c : what) {
    if (c >= 0x20 && c < 0x7F)
      out.push_back(static_cast<char>(c));
    else
      out += fmt::format("\\x{:02x}", c);
  }
  return out;
}

} // namespace

StatusOr<Json> parseJson(const std::string &text) {
  // The keys seen so far in each object being parsed, innermost last.
  std::vector<std::set<std::string>> keys;
  auto check = [&keys](int depth, Json::parse_event_t event, Json &parsed) {
    if (depth > kJsonMaxDepth)
      throw Rejected{fmt::format("nesting deeper than {}", kJsonMaxDepth)};
    switch (event) {
    case Json::parse_event_t::object_start:
      keys.emplace_back();
      break;
    case Json::parse_event_t::object_end:
      keys.pop_back();
      break;
    case Json::parse_event_t::key: {
      const std::string &key = parsed.get_ref<const std::string &>();
      if (!keys.back().insert(key).second)
        throw Rejected{"duplicate key " + jsonQuote(key)};
      break;
    }
    default:
      break;
    }
    return true;
  };
  try {
    return Json::parse(text, check);
  } catch (const Rejected &r) {
    return Status::error("malformed JSON: " + r.message);
  } catch (const Json::parse_error &e) {
    // nlohmann counts the bytes read, the offending one included.
    return Status::error(fmt::format("malformed JSON at byte {}: {}",
                                     e.byte > 0 ? e.byte - 1 : 0, describe(e)));
  } catch (const Json::exception &e) {
    return Status::error("malformed JSON: " + describe(e));
  }
}

const char *jsonKindName(const Json &value) {
  switch (value.type()) {
  case Json::value_t::null:
    return "null";
  case Json::value_t::boolean:
    return "a boolean";
  case Json::value_t::number_integer:
  case Json::value_t::number_unsigned:
  case Json::value_t::number_float:
    return "a number";
  case Json::value_t::string:
    return "a string";
  case Json::value_t::array:
    return "an array";
  case Json::value_t::object:
    return "an object";
  default:
    return "a value";
  }
}

std::string jsonQuote(const std::string &s) {
  return Json(s).dump(-1, ' ', false, Json::error_handler_t::replace);
}

namespace {

/// The member `key` of `object`, or an error: `object` is not an object, or
/// has no such member.
StatusOr<const Json *> findMember(const Json &object, const std::string &key) {
  if (!object.is_object())
    return Status::error(fmt::format("expected an object with {}, found {}",
                                     jsonQuote(key), jsonKindName(object)));
  auto it = object.find(key);
  if (it == object.end())
    return Status::error("missing " + jsonQuote(key));
  return &*it;
}

Status wrongType(const std::string &key, const Json &value,
                 const char *expected) {
  // 2.0 is a number but not an integer: say which kind of number.
  const char *kind =
      value.is_number_float() ? "a floating-point number" : jsonKindName(value);
  return Status::error(
      fmt::format("{} is {}, expected {}", jsonQuote(key), kind, expected));
}

} // namespace

StatusOr<std::string> jsonString(const Json &object, const std::string &key) {
  PIPER_ASSIGN_OR_RETURN(const Json *v, findMember(object, key));
  if (!v->is_string())
    return wrongType(key, *v, "a string");
  return v->get_ref<const std::string &>();
}

StatusOr<int64_t> jsonInt(const Json &object, const std::string &key) {
  PIPER_ASSIGN_OR_RETURN(const Json *v, findMember(object, key));
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u > uint64_t(INT64_MAX))
      return Status::error(
          fmt::format("{} is {}, past the largest integer", jsonQuote(key), u));
    return static_cast<int64_t>(u);
  }
  if (!v->is_number_integer())
    return wrongType(key, *v, "an integer");
  return v->get<int64_t>();
}

StatusOr<uint64_t> jsonUint(const Json &object, const std::string &key) {
  PIPER_ASSIGN_OR_RETURN(const Json *v, findMember(object, key));
  if (v->is_number_integer() && !v->is_number_unsigned())
    return Status::error(fmt::format("{} is {}, expected a non-negative "
                                     "integer",
                                     jsonQuote(key), v->get<int64_t>()));
  if (!v->is_number_unsigned())
    return wrongType(key, *v, "a non-negative integer");
  return v->get<uint64_t>();
}

StatusOr<double> jsonNumber(const Json &object, const std::string &key) {
  PIPER_ASSIGN_OR_RETURN(const Json *v, findMember(object, key));
  if (!v->is_number())
    return wrongType(key, *v, "a number");
  return v->get<double>();
}

StatusOr<const Json *> jsonObject(const Json &object, const std::string &key) {
  PIPER_ASSIGN_OR_RETURN(const Json *v, findMember(object, key));
  if (!v->is_object())
    return wrongType(key, *v, "an object");
  return v;
}

StatusOr<const Json *> jsonArray(const Json &object, const std::string &key) {
  PIPER_ASSIGN_OR_RETURN(const Json *v, findMember(object, key));
  if (!v->is_array())
    return wrongType(key, *v, "an array");
  return v;
}

bool jsonHas(const Json &object, const std::string &key) {
  return object.is_object() && object.contains(key);
}

} // namespace piper::runtime
