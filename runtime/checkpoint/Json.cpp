// A small recursive-descent JSON parser with a depth limit, and quoting.
#include "runtime/checkpoint/Json.h"

#include <cstdio>

namespace piper::runtime {

namespace {

constexpr int kMaxDepth = 64;

class Parser {
public:
  explicit Parser(const std::string &text) : s(text) {}

  Status parseDocument(JsonValue &out) {
    skipSpace();
    PIPER_RETURN_IF_ERROR(parseValue(out, 0));
    skipSpace();
    if (pos != s.size())
      return fail("unexpected '" + shown() + "' after the value");
    return Status::ok();
  }

private:
  const std::string &s;
  size_t pos = 0;

  Status fail(const std::string &what) const {
    return Status::error("malformed JSON at byte " + std::to_string(pos) +
                         ": " + what);
  }
  /// The character at pos, printable, for messages.
  std::string shown() const {
    if (pos >= s.size())
      return "end of input";
    unsigned char c = static_cast<unsigned char>(s[pos]);
    if (c >= 0x20 && c < 0x7F)
      return std::string(1, static_cast<char>(c));
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\x%02x", c);
    return buf;
  }
  void skipSpace() {
    while (pos < s.size() && (s[pos] == ' ' || s[pos] == '\t' ||
                              s[pos] == '\n' || s[pos] == '\r'))
      ++pos;
  }
  bool consume(const char *word) {
    size_t n = std::char_traits<char>::length(word);
    if (s.compare(pos, n, word) != 0)
      return false;
    pos += n;
    return true;
  }

  Status parseValue(JsonValue &out, int depth) {
    if (depth > kMaxDepth)
      return fail("nesting deeper than " + std::to_string(kMaxDepth));
    if (pos >= s.size())
      return fail("unexpected end of input, expected a value");
    char c = s[pos];
    if (c == '{')
      return parseObject(out, depth);
    if (c == '[')
      return parseArray(out, depth);
    if (c == '"') {
      out.kind = JsonValue::Kind::String;
      return parseString(out.text);
    }
    if (c == '-' || (c >= '0' && c <= '9'))
      return parseNumber(out);
    if (consume("true")) {
      out.kind = JsonValue::Kind::Bool;
      out.boolean = true;
      return Status::ok();
    }
    if (consume("false")) {
      out.kind = JsonValue::Kind::Bool;
      out.boolean = false;
      return Status::ok();
    }
    if (consume("null")) {
      out.kind = JsonValue::Kind::Null;
      return Status::ok();
    }
    return fail("unexpected '" + shown() + "', expected a value");
  }

  Status parseObject(JsonValue &out, int depth) {
    out.kind = JsonValue::Kind::Object;
    ++pos; // '{'
    skipSpace();
    if (pos < s.size() && s[pos] == '}') {
      ++pos;
      return Status::ok();
    }
    while (true) {
      skipSpace();
      if (pos >= s.size() || s[pos] != '"')
        return fail("unexpected '" + shown() + "', expected a string key");
      size_t keyAt = pos;
      std::string key;
      PIPER_RETURN_IF_ERROR(parseString(key));
      if (out.find(key)) {
        pos = keyAt;
        return fail("duplicate key " + jsonQuote(key));
      }
      skipSpace();
      if (pos >= s.size() || s[pos] != ':')
        return fail("unexpected '" + shown() + "', expected ':'");
      ++pos;
      skipSpace();
      out.members.emplace_back(std::move(key), JsonValue());
      PIPER_RETURN_IF_ERROR(parseValue(out.members.back().second, depth + 1));
      skipSpace();
      if (pos < s.size() && s[pos] == ',') {
        ++pos;
        continue;
      }
      if (pos < s.size() && s[pos] == '}') {
        ++pos;
        return Status::ok();
      }
      return fail("unexpected '" + shown() + "', expected ',' or '}'");
    }
  }

  Status parseArray(JsonValue &out, int depth) {
    out.kind = JsonValue::Kind::Array;
    ++pos; // '['
    skipSpace();
    if (pos < s.size() && s[pos] == ']') {
      ++pos;
      return Status::ok();
    }
    while (true) {
      skipSpace();
      out.items.emplace_back();
      PIPER_RETURN_IF_ERROR(parseValue(out.items.back(), depth + 1));
      skipSpace();
      if (pos < s.size() && s[pos] == ',') {
        ++pos;
        continue;
      }
      if (pos < s.size() && s[pos] == ']') {
        ++pos;
        return Status::ok();
      }
      return fail("unexpected '" + shown() + "', expected ',' or ']'");
    }
  }

  static void appendUtf8(std::string &out, uint32_t cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  Status parseHex4(uint32_t &out) {
    out = 0;
    for (int i = 0; i < 4; ++i, ++pos) {
      if (pos >= s.size())
        return fail("unexpected end of input in a \\u escape");
      char c = s[pos];
      uint32_t d;
      if (c >= '0' && c <= '9')
        d = uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f')
        d = uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        d = uint32_t(c - 'A' + 10);
      else
        return fail("unexpected '" + shown() + "' in a \\u escape");
      out = out * 16 + d;
    }
    return Status::ok();
  }

  Status parseString(std::string &out) {
    ++pos; // '"'
    out.clear();
    while (true) {
      if (pos >= s.size())
        return fail("unexpected end of input in a string");
      unsigned char c = static_cast<unsigned char>(s[pos]);
      if (c == '"') {
        ++pos;
        return Status::ok();
      }
      if (c < 0x20)
        return fail("unescaped control character in a string");
      if (c != '\\') {
        out.push_back(static_cast<char>(c));
        ++pos;
        continue;
      }
      ++pos;
      if (pos >= s.size())
        return fail("unexpected end of input in a string");
      char e = s[pos++];
      switch (e) {
      case '"':
      case '\\':
      case '/':
        out.push_back(e);
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'u': {
        uint32_t cp;
        PIPER_RETURN_IF_ERROR(parseHex4(cp));
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          uint32_t low = 0;
          if (!consume("\\u"))
            return fail("a high surrogate without its low surrogate");
          PIPER_RETURN_IF_ERROR(parseHex4(low));
          if (low < 0xDC00 || low > 0xDFFF)
            return fail("a high surrogate without its low surrogate");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          return fail("a lone low surrogate");
        }
        appendUtf8(out, cp);
        break;
      }
      default:
        --pos;
        return fail("invalid escape '\\" + shown() + "'");
      }
    }
  }

  Status parseNumber(JsonValue &out) {
    size_t start = pos;
    auto digits = [&] {
      size_t from = pos;
      while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9')
        ++pos;
      return pos - from;
    };
    if (s[pos] == '-')
      ++pos;
    if (pos < s.size() && s[pos] == '0') {
      ++pos;
    } else if (digits() == 0) {
      return fail("a number without digits");
    }
    if (pos < s.size() && s[pos] == '.') {
      ++pos;
      if (digits() == 0)
        return fail("a number without digits after '.'");
    }
    if (pos < s.size() && (s[pos] == 'e' || s[pos] == 'E')) {
      ++pos;
      if (pos < s.size() && (s[pos] == '+' || s[pos] == '-'))
        ++pos;
      if (digits() == 0)
        return fail("a number without exponent digits");
    }
    out.kind = JsonValue::Kind::Number;
    out.text = s.substr(start, pos - start);
    return Status::ok();
  }
};

} // namespace

const JsonValue *JsonValue::find(const std::string &key) const {
  for (const auto &[name, value] : members)
    if (name == key)
      return &value;
  return nullptr;
}

bool JsonValue::asUint64(uint64_t &out) const {
  if (kind != Kind::Number || text.empty())
    return false;
  uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9')
      return false;
    uint64_t d = uint64_t(c - '0');
    if (v > (UINT64_MAX - d) / 10)
      return false;
    v = v * 10 + d;
  }
  out = v;
  return true;
}

const char *jsonKindName(JsonValue::Kind kind) {
  switch (kind) {
  case JsonValue::Kind::Null:
    return "null";
  case JsonValue::Kind::Bool:
    return "a boolean";
  case JsonValue::Kind::Number:
    return "a number";
  case JsonValue::Kind::String:
    return "a string";
  case JsonValue::Kind::Array:
    return "an array";
  case JsonValue::Kind::Object:
    return "an object";
  }
  return "a value";
}

Status parseJson(const std::string &text, JsonValue &out) {
  out = JsonValue();
  return Parser(text).parseDocument(out);
}

std::string jsonQuote(const std::string &s) {
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        out += buf;
      } else {
        out.push_back(ch);
      }
    }
  }
  out += "\"";
  return out;
}

} // namespace piper::runtime
