// Tests of strict JSON parsing, the safetensors writer/reader (exact layout,
// round trips, every malformed-file case, truncation and corruption never
// crash), merging, and matching a checkpoint against parameters.
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <catch2/catch.hpp>

#include "runtime/formats/Json.h"
#include "runtime/formats/Safetensors.h"

using namespace piper;

using namespace piper::runtime;

namespace {

std::string tempDir() {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/st-XXXXXX";
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

std::string le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i)
    s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return s;
}

/// A file made of a JSON header (not padded) and `data`.
std::string rawFile(const std::string &json, const std::string &data) {
  return le64(json.size()) + json + data;
}

Status openStatus(const std::string &path) {
  Status st;
  auto r = SafetensorsReader::open(path, st);
  CHECK(bool(r) == bool(st));
  return st;
}

void expectError(const std::string &path, const std::string &expected) {
  Status st = openStatus(path);
  INFO("status: " << st.message());
  CHECK_FALSE(st);
  CHECK(st.message().rfind("checkpoint '" + path + "': ", 0) == 0);
  CHECK(st.message().find(expected) != std::string::npos);
}

} // namespace

TEST_CASE("JSON: values, escapes and order", "[json]") {
  StatusOr<Json> parsed = parseJson(
      R"( {"b": [1, -2.5e3, true, false, null],
           "a": "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00", "c": {}} )");
  REQUIRE(parsed);
  const Json &v = *parsed;
  REQUIRE(v.is_object());
  REQUIRE(v.size() == 3);
  CHECK(v.begin().key() == "b"); // file order, not sorted
  const Json &b = v.at("b");
  REQUIRE(b.size() == 5);
  CHECK(b[0].is_number_unsigned());
  CHECK(b[0].get<uint64_t>() == 1);
  CHECK_FALSE(b[1].is_number_unsigned());
  CHECK(b[1].get<double>() == -2500.0);
  CHECK(b[2].get<bool>());
  CHECK(b[4].is_null());
  CHECK(v.at("a").get<std::string>() ==
        "x\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(v.at("c").is_object());
  CHECK(v.find("d") == v.end());
  CHECK(std::string(jsonKindName(v)) == "an object");
  CHECK(std::string(jsonKindName(b[1])) == "a number");

  StatusOr<Json> big = parseJson("18446744073709551615");
  REQUIRE(big);
  CHECK(big->is_number_unsigned());
  CHECK(big->get<uint64_t>() == UINT64_MAX);
  big = parseJson("18446744073709551616");
  REQUIRE(big);
  CHECK_FALSE(big->is_number_unsigned()); // overflow is not a silent wrap

  CHECK(jsonQuote("a\"b\\c\n\x01") == "\"a\\\"b\\\\c\\n\\u0001\"");
  StatusOr<Json> round = parseJson(jsonQuote("h.0 \"q\"\t\x1f"));
  REQUIRE(round);
  CHECK(round->get<std::string>() == "h.0 \"q\"\t\x1f");
}

TEST_CASE("JSON: malformed input is an error, never a crash", "[json]") {
  // nlohmann/json's own diagnostics, after "malformed JSON at byte N: ".
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "unexpected end of input"},
      {"{", "expected string literal"},
      {"{\"a\"", "expected ':'"},
      {"{\"a\":}", "unexpected '}'"},
      {"{\"a\":1,}", "expected string literal"},
      {"{\"a\":1 \"b\":2}", "expected '}'"},
      {"[1,]", "unexpected ']'"},
      {"[1 2]", "expected ']'"},
      {"01", "expected end of input"},
      {"1.", "expected digit after '.'"},
      {"1e", "expected '+', '-', or digit after exponent"},
      {"-", "expected digit after '-'"},
      {"\"abc", "missing closing quote"},
      {"\"\\x\"", "forbidden character after backslash"},
      {"\"a\nb\"", "control character U+000A (LF) must be escaped"},
      {"\"\\u12g4\"", "'\\u' must be followed by 4 hex digits"},
      {"\"\\ud800\"", "surrogate U+D800..U+DBFF must be followed by"},
      {"\"\\udc00\"", "surrogate U+DC00..U+DFFF must follow"},
      {"tru", "invalid literal"},
      {"{} x", "expected end of input"},
      {"\"\xff\"", "ill-formed UTF-8 byte; last read: '\"\\xff'"},
      {std::string("{\"a\":\x01}", 7), "invalid literal"},
  };
  for (const auto &[text, expected] : cases) {
    Status st = parseJson(text).status();
    INFO("input: " << text.substr(0, 40) << " -> " << st.message());
    CHECK_FALSE(st);
    CHECK(st.message().rfind("malformed JSON at byte ", 0) == 0);
    CHECK(st.message().find(expected) != std::string::npos);
  }
  Status at = parseJson("{\"a\": [1, 2").status();
  CHECK(at.message().rfind("malformed JSON at byte 11: ", 0) == 0);

  // What nlohmann/json accepts but a safetensors header must not hold.
  Status dup = parseJson("{\"a\":1,\"b\":{\"a\":2},\"a\":3}").status();
  CHECK(dup.message() == "malformed JSON: duplicate key \"a\"");
  Status deep = parseJson(std::string(10000, '[')).status();
  CHECK(deep.message() == "malformed JSON: nesting deeper than 64");
  REQUIRE(parseJson(std::string(64, '[') + std::string(64, ']')));
}

TEST_CASE("safetensors: exact layout of a written file", "[safetensors]") {
  std::string dir = tempDir();
  std::string path = dir + "/a.safetensors";
  float w[6] = {1, 2, 3, 4, 5, 6};
  float s = -1.5f;
  REQUIRE(writeSafetensors(path,
                           {{"h.0.w", "F32", {2, 3}, w}, {"s", "F32", {}, &s}},
                           {{"format", "pt"}, {"step", "7"}}));
  std::string json = "{\"__metadata__\":{\"format\":\"pt\",\"step\":\"7\"},"
                     "\"h.0.w\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                     "\"data_offsets\":[0,24]},"
                     "\"s\":{\"dtype\":\"F32\",\"shape\":[],"
                     "\"data_offsets\":[24,28]}}";
  std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  std::string expected = le64(padded.size()) + padded +
                         std::string(reinterpret_cast<char *>(w), 24) +
                         std::string(reinterpret_cast<char *>(&s), 4);
  std::string bytes = readBytes(path);
  CHECK(bytes == expected);
  CHECK(padded.size() % 8 == 0);
}

TEST_CASE("safetensors: writer and reader round trip", "[safetensors]") {
  std::string dir = tempDir();
  std::string path = dir + "/rt.safetensors";
  std::vector<float> a(12), b(5), empty;
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = 0.25f * i - 1;
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = 1e-3f * i;
  int32_t ints[2] = {-7, 123456};
  REQUIRE(writeSafetensors(path,
                           {{"h.0.attn.c_attn.weight", "F32", {3, 4}, a.data()},
                            {"z", "F32", {0, 3}, empty.data()},
                            {"b", "F32", {5}, b.data()},
                            {"ids", "I32", {2}, ints}},
                           checkpointMetadata(42)));
  Status st;
  auto r = SafetensorsReader::open(path, st);
  INFO(st.message());
  REQUIRE(r);
  REQUIRE(r->tensors().size() == 4);
  CHECK(r->tensors()[0].name == "h.0.attn.c_attn.weight"); // header order
  CHECK(r->tensors()[1].name == "z");
  CHECK(r->tensors()[1].begin == r->tensors()[1].end);
  const SafetensorsEntry *e = r->find("h.0.attn.c_attn.weight");
  REQUIRE(e);
  CHECK(e->dtype == "F32");
  CHECK(e->shape == std::vector<int64_t>{3, 4});
  std::vector<float> back(12);
  REQUIRE(r->read(*e, back.data()));
  CHECK(back == a);
  std::vector<float> backB(5);
  REQUIRE(r->read(*r->find("b"), backB.data()));
  CHECK(backB == b);
  int32_t backInts[2];
  REQUIRE(r->read(*r->find("ids"), backInts));
  CHECK(backInts[1] == 123456);
  REQUIRE(r->metadataValue("format"));
  CHECK(*r->metadataValue("format") == "pt");
  CHECK(*r->metadataValue("producer") == "piper");
  int64_t step = -1;
  REQUIRE(checkpointStep(*r, step));
  CHECK(step == 42);

  // No metadata at all, and no tensors at all, are both valid files.
  REQUIRE(writeSafetensors(dir + "/empty.safetensors", {}, {}));
  CHECK(readBytes(dir + "/empty.safetensors") == le64(8) + "{}      ");
  auto emptyReader = SafetensorsReader::open(dir + "/empty.safetensors", st);
  REQUIRE(emptyReader);
  CHECK(emptyReader->tensors().empty());
  REQUIRE(checkpointStep(*emptyReader, step));
  CHECK(step == 0);

  // Writer errors.
  Status dup = writeSafetensors(
      dir + "/d", {{"x", "F32", {1}, a.data()}, {"x", "F32", {1}, a.data()}},
      {});
  CHECK(dup.message() ==
        "checkpoint '" + dir + "/d': tensor 'x' appears twice");
  Status meta = writeSafetensors(dir + "/d",
                                 {{"__metadata__", "F32", {1}, a.data()}}, {});
  CHECK(meta.message().find("invalid tensor name \"__metadata__\"") !=
        std::string::npos);
  CHECK(::access((dir + "/d").c_str(), F_OK) != 0);
}

TEST_CASE("safetensors: malformed files", "[safetensors]") {
  std::string dir = tempDir();
  std::string path = dir + "/bad.safetensors";
  std::string f32x2 = std::string(8, '\0');
  auto entry = [](const std::string &name, const std::string &body) {
    return "\"" + name + "\":" + body;
  };

  SECTION("missing file") {
    expectError(dir + "/nope", "cannot open: no such file or directory");
  }
  SECTION("shorter than the length field") {
    writeBytes(path, "abc");
    expectError(path, "truncated: the file has 3 bytes, fewer than the 8-byte "
                      "header length");
  }
  SECTION("header length past the end") {
    writeBytes(path, le64(100) + "{}");
    expectError(path, "truncated: the header length is 100 bytes but only 2 "
                      "bytes follow it");
  }
  SECTION("absurd header length") {
    writeBytes(path, le64(UINT64_MAX) + "{}");
    expectError(path, "the header length 18446744073709551615 is over the "
                      "100000000-byte limit");
  }
  SECTION("zero header length") {
    writeBytes(path, le64(0));
    expectError(path, "the header length 0 is too small");
  }
  SECTION("malformed JSON") {
    writeBytes(path, rawFile("{\"a\": {\"dtype\": \"F32\",", ""));
    expectError(path, "header: malformed JSON at byte 22:");
  }
  SECTION("binary junk") {
    writeBytes(path, rawFile(std::string("\x89PNG\r\n\x1a\n", 8), ""));
    expectError(path, "header: malformed JSON at byte 0: syntax error while "
                      "parsing value - invalid literal; last read: '\\x89'");
  }
  SECTION("not an object") {
    writeBytes(path, rawFile("[1, 2]  ", ""));
    expectError(path, "the header is an array, not a JSON object");
  }
  SECTION("metadata with a non-string value") {
    writeBytes(path, rawFile("{\"__metadata__\": {\"step\": 3}}", ""));
    expectError(path,
                "\"__metadata__\" value of \"step\" is a number, not a string");
  }
  SECTION("metadata step that is not an integer") {
    writeBytes(path, rawFile("{\"__metadata__\": {\"step\": \"ten\"}}", ""));
    Status st;
    auto r = SafetensorsReader::open(path, st);
    REQUIRE(r);
    int64_t step;
    Status bad = checkpointStep(*r, step);
    CHECK(bad.message() == "checkpoint '" + path +
                               "': metadata \"step\" is \"ten\", not a "
                               "non-negative integer");
  }
  SECTION("unknown dtype") {
    writeBytes(path, rawFile("{" +
                                 entry("w", "{\"dtype\":\"F24\",\"shape\":[2],"
                                            "\"data_offsets\":[0,8]}") +
                                 "}",
                             f32x2));
    expectError(path, "header: tensor \"w\": unknown dtype \"F24\"");
  }
  SECTION("negative dimension") {
    writeBytes(path, rawFile("{" +
                                 entry("w", "{\"dtype\":\"F32\",\"shape\":[-2],"
                                            "\"data_offsets\":[0,8]}") +
                                 "}",
                             f32x2));
    expectError(path, "\"shape\" must hold non-negative integers");
  }
  SECTION("missing data_offsets") {
    writeBytes(
        path,
        rawFile("{" + entry("w", "{\"dtype\":\"F32\",\"shape\":[2]}") + "}",
                f32x2));
    expectError(path, "\"data_offsets\" must be two non-negative integers");
  }
  SECTION("offsets that do not match the shape") {
    writeBytes(path, rawFile("{" +
                                 entry("w", "{\"dtype\":\"F32\",\"shape\":[3],"
                                            "\"data_offsets\":[0,8]}") +
                                 "}",
                             f32x2));
    expectError(path, "\"data_offsets\" [0, 8] span 8 bytes, but F32 [3] "
                      "needs 12");
  }
  SECTION("offsets past the end (a truncated file)") {
    writeBytes(path, rawFile("{" +
                                 entry("w", "{\"dtype\":\"F32\",\"shape\":[2],"
                                            "\"data_offsets\":[0,8]}") +
                                 "}",
                             std::string(5, '\0')));
    expectError(path, "tensor 'w': \"data_offsets\" [0, 8] run past the end "
                      "of the data (5 bytes after the header");
  }
  SECTION("huge shape") {
    writeBytes(
        path, rawFile("{" +
                          entry("w", "{\"dtype\":\"F32\",\"shape\":[4294967296,"
                                     "4294967296],\"data_offsets\":[0,8]}") +
                          "}",
                      f32x2));
    expectError(path, "shape [4294967296, 4294967296] is too large");
  }
  SECTION("overlapping tensors") {
    writeBytes(path, rawFile("{" +
                                 entry("a", "{\"dtype\":\"F32\",\"shape\":[2],"
                                            "\"data_offsets\":[0,8]}") +
                                 "," +
                                 entry("b", "{\"dtype\":\"F32\",\"shape\":[1],"
                                            "\"data_offsets\":[4,8]}") +
                                 "}",
                             f32x2));
    expectError(path, "tensors 'a' and 'b' overlap");
  }
  SECTION("a gap between tensors") {
    writeBytes(path, rawFile("{" +
                                 entry("a", "{\"dtype\":\"F32\",\"shape\":[1],"
                                            "\"data_offsets\":[4,8]}") +
                                 "}",
                             f32x2));
    expectError(path, "a gap of 4 bytes before tensor 'a'");
  }
  SECTION("bytes after the last tensor") {
    writeBytes(path, rawFile("{" +
                                 entry("a", "{\"dtype\":\"F32\",\"shape\":[1],"
                                            "\"data_offsets\":[0,4]}") +
                                 "}",
                             f32x2));
    expectError(path, "4 bytes after the last tensor's data");
  }
}

TEST_CASE("safetensors: every truncation and header corruption is handled",
          "[safetensors]") {
  std::string dir = tempDir();
  std::string good = dir + "/good.safetensors";
  std::vector<float> w(10, 0.5f), b(3, 2.0f);
  REQUIRE(writeSafetensors(
      good, {{"w", "F32", {2, 5}, w.data()}, {"b", "F32", {3}, b.data()}},
      checkpointMetadata(3)));
  std::string bytes = readBytes(good);
  std::string path = dir + "/cut.safetensors";
  // Every proper prefix is an error (the data must be complete).
  for (size_t n = 0; n < bytes.size(); ++n) {
    writeBytes(path, bytes.substr(0, n));
    Status st = openStatus(path);
    INFO("prefix of " << n << " bytes: " << st.message());
    CHECK_FALSE(st);
    // parseSafetensors, the same checks on bytes in memory, says the same.
    std::vector<SafetensorsEntry> entries;
    SafetensorsMetadata meta;
    CHECK(parseSafetensors(path, bytes.substr(0, n), entries, meta).message() ==
          st.message());
  }
  // Flipping any header byte either still parses (e.g. inside a name or
  // padding) or fails with a message; it never crashes or reads past the
  // file.
  size_t headerEnd = 8;
  for (int i = 7; i >= 0; --i)
    headerEnd += static_cast<size_t>(static_cast<unsigned char>(bytes[i]))
                 << (8 * i);
  REQUIRE(headerEnd < bytes.size());
  int failures = 0;
  for (size_t i = 0; i < headerEnd; ++i) {
    for (unsigned char x : {0x01, 0x20, 0x80, 0xFF}) {
      std::string corrupt = bytes;
      corrupt[i] = static_cast<char>(corrupt[i] ^ x);
      writeBytes(path, corrupt);
      Status st;
      auto r = SafetensorsReader::open(path, st);
      std::vector<SafetensorsEntry> entries;
      SafetensorsMetadata meta;
      Status fromBytes = parseSafetensors(path, corrupt, entries, meta);
      CHECK(fromBytes.message() == st.message());
      if (!r) {
        ++failures;
        continue;
      }
      CHECK(entries.size() == r->tensors().size());
      CHECK(meta == r->metadata());
      // Whatever parsed must be readable within the file.
      std::vector<char> buf;
      for (const SafetensorsEntry &e : r->tensors()) {
        buf.resize(e.end - e.begin);
        CHECK(r->read(e, buf.data()));
      }
    }
  }
  CHECK(failures > 0);
}

TEST_CASE("safetensors: merging parts", "[safetensors]") {
  std::string dir = tempDir();
  std::vector<float> wte(6, 1.0f), head(6, 2.0f), ln(2, 3.0f);
  REQUIRE(writeSafetensors(
      dir + "/p0",
      {{"wte", "F32", {3, 2}, wte.data()}, {"ln", "F32", {2}, ln.data()}},
      checkpointMetadata(5)));
  // The last stage holds a tied copy of wte and its own head.
  REQUIRE(writeSafetensors(dir + "/p1",
                           {{"head", "F32", {2, 3}, head.data()},
                            {"wte", "F32", {3, 2}, wte.data()}},
                           checkpointMetadata(5)));
  REQUIRE(mergeSafetensors({dir + "/p0", dir + "/p1"}, dir + "/all",
                           checkpointMetadata(5)));
  // The merge equals writing all tensors at once, in part order.
  REQUIRE(writeSafetensors(dir + "/direct",
                           {{"wte", "F32", {3, 2}, wte.data()},
                            {"ln", "F32", {2}, ln.data()},
                            {"head", "F32", {2, 3}, head.data()}},
                           checkpointMetadata(5)));
  CHECK(readBytes(dir + "/all") == readBytes(dir + "/direct"));

  std::vector<float> other(6, 9.0f);
  REQUIRE(writeSafetensors(dir + "/p2", {{"wte", "F32", {3, 2}, other.data()}},
                           {}));
  Status diff = mergeSafetensors({dir + "/p0", dir + "/p2"}, dir + "/x", {});
  CHECK(diff.message() == "parameter 'wte' is in '" + dir + "/p0' and in '" +
                              dir + "/p2' with different values");
  REQUIRE(
      writeSafetensors(dir + "/p3", {{"wte", "F32", {6}, other.data()}}, {}));
  Status shape = mergeSafetensors({dir + "/p0", dir + "/p3"}, dir + "/x", {});
  CHECK(shape.message().find("with different types (F32 [3, 2] and F32 [6])") !=
        std::string::npos);
  Status missing =
      mergeSafetensors({dir + "/p0", dir + "/nope"}, dir + "/x", {});
  CHECK(missing.message().find("nope': cannot open") != std::string::npos);
  CHECK(::access((dir + "/x").c_str(), F_OK) != 0);
}

TEST_CASE("safetensors: matching a checkpoint to parameters", "[safetensors]") {
  std::string dir = tempDir();
  std::string path = dir + "/m.safetensors";
  std::vector<float> data(16, 0.0f);
  uint16_t half[4] = {};
  REQUIRE(writeSafetensors(path,
                           {{"wte", "F32", {4, 2}, data.data()},
                            {"head", "F32", {2, 3}, data.data()},
                            {"ln", "F16", {4}, half},
                            {"extra.a", "F32", {1}, data.data()},
                            {"extra.b", "F32", {1}, data.data()}},
                           {}));
  Status st;
  auto r = SafetensorsReader::open(path, st);
  REQUIRE(r);
  CHECK(checkCheckpointParams(*r, {{"wte", {4, 2}}}, false));
  Status bad = checkCheckpointParams(*r,
                                     {{"wte", {4, 2}},
                                      {"head", {3, 2}},
                                      {"ln", {4}},
                                      {"pos", {8}},
                                      {"q", {1}}},
                                     true);
  CHECK(bad.message() ==
        "checkpoint '" + path +
            "' does not match the model: missing parameters: pos, q; tensor "
            "'head' has shape [2, 3], but the model's parameter has [3, 2]; "
            "tensor 'ln' is F16, but piper loads F32 only; tensors that are "
            "not parameters of the model: extra.a, extra.b");
}
