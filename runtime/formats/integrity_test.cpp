// Tests of checkpoint integrity: type-checked JSON fields, CRC-32s and run
// ids in safetensors metadata, non-finite values, merging checksummed
// parts, and state.json: its parsing (every wrong-typed field an error,
// never an exception) and the verification of a directory against it.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <catch2/catch.hpp>

#include "runtime/formats/CheckpointManifest.h"
#include "runtime/formats/Integrity.h"
#include "runtime/formats/Json.h"
#include "runtime/formats/Safetensors.h"

using namespace piper;

using namespace piper::runtime;

namespace {

std::string tempDir() {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/ckpt-XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()));
  return tmpl;
}

std::string readBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void writeBytes(const std::string &path, const std::string &bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

/// XORs byte `offset` of `path` with `mask`.
void flipByte(const std::string &path, size_t offset, unsigned char mask) {
  std::string bytes = readBytes(path);
  REQUIRE(offset < bytes.size());
  bytes[offset] = static_cast<char>(bytes[offset] ^ mask);
  writeBytes(path, bytes);
}

/// The file offset of element `i` of tensor `name` of `path`.
size_t offsetOf(const std::string &path, const std::string &name, size_t i) {
  Status st;
  auto r = SafetensorsReader::open(path, st);
  REQUIRE(r);
  const SafetensorsEntry *e = r->find(name);
  REQUIRE(e);
  return static_cast<size_t>(r->fileSize() -
                             (r->tensors().back().end - e->begin)) +
         4 * i;
}

/// Writes `tensors` to `path` as a piper checkpoint file of `runId`.
void writeFile(const std::string &path,
               const std::vector<SafetensorsTensor> &tensors,
               const std::string &runId, int64_t step) {
  SafetensorsMetadata meta = checkpointMetadata(step, runId);
  addCrc32s(meta, tensors);
  REQUIRE(writeSafetensors(path, tensors, meta));
}

Status verifyFile(const std::string &path) {
  Status st;
  auto r = SafetensorsReader::open(path, st);
  if (!r)
    return st;
  return verifyTensors(*r);
}

bool contains(const Status &st, const std::string &text) {
  INFO("status: " << st.message());
  return !st && st.message().find(text) != std::string::npos;
}

} // namespace

TEST_CASE("JSON fields are type-checked, never thrown", "[json]") {
  StatusOr<Json> parsed =
      parseJson(R"({"s": "x", "i": -3, "u": 7, "f": 2.0, "big":
      18446744073709551615, "o": {}, "a": [], "n": null})");
  REQUIRE(parsed);
  const Json &v = *parsed;
  CHECK(*jsonString(v, "s") == "x");
  CHECK(*jsonInt(v, "i") == -3);
  CHECK(*jsonInt(v, "u") == 7);
  CHECK(*jsonUint(v, "u") == 7);
  CHECK(*jsonNumber(v, "f") == 2.0);
  CHECK(*jsonObject(v, "o") == &v.at("o"));
  CHECK(*jsonArray(v, "a") == &v.at("a"));
  CHECK(jsonHas(v, "n"));
  CHECK_FALSE(jsonHas(v, "z"));
  CHECK_FALSE(jsonHas(Json(3), "s"));

  CHECK(jsonString(v, "i").status().message() ==
        "\"i\" is a number, expected a string");
  CHECK(jsonInt(v, "s").status().message() ==
        "\"s\" is a string, expected an integer");
  CHECK(jsonInt(v, "f").status().message() ==
        "\"f\" is a floating-point number, expected an integer");
  CHECK(jsonInt(v, "big").status().message() ==
        "\"big\" is 18446744073709551615, past the largest integer");
  CHECK(jsonUint(v, "i").status().message() ==
        "\"i\" is -3, expected a non-negative integer");
  CHECK(jsonNumber(v, "n").status().message() ==
        "\"n\" is null, expected a number");
  CHECK(jsonObject(v, "a").status().message() ==
        "\"a\" is an array, expected an object");
  CHECK(jsonArray(v, "o").status().message() ==
        "\"o\" is an object, expected an array");
  CHECK(jsonString(v, "z").status().message() == "missing \"z\"");
  CHECK(jsonString(Json::array(), "s").status().message() ==
        "expected an object with \"s\", found an array");
}

TEST_CASE("CRC-32s and run ids", "[integrity]") {
  // The standard check value of CRC-32/ISO-HDLC (zlib's, Python's).
  CHECK(crc32Update(0, "123456789", 9) == 0xCBF43926u);
  CHECK(crc32Update(crc32Update(0, "1234", 4), "56789", 5) == 0xCBF43926u);
  CHECK(formatCrc32(0x0a1b2c3d) == "0a1b2c3d");
  uint32_t crc = 0;
  CHECK(parseCrc32("CBF43926", crc));
  CHECK(crc == 0xCBF43926u);
  CHECK_FALSE(parseCrc32("cbf4392", crc));
  CHECK_FALSE(parseCrc32("cbf4392g", crc));
  CHECK_FALSE(parseCrc32("0xf43926", crc));

  std::string a = newRunId(), b = newRunId();
  CHECK(isRunId(a));
  CHECK(a != b);
  CHECK_FALSE(isRunId("ABCDEF0123456789abcdef0123456789"));
  CHECK_FALSE(isRunId(a.substr(1)));
}

TEST_CASE("safetensors files record and verify their CRC-32s and run id",
          "[integrity]") {
  std::string dir = tempDir(), path = dir + "/m.safetensors";
  std::vector<float> w = {1, -2, 3, 4, 5, 6}, b = {0.5f, 0.25f};
  const std::string run = newRunId();
  writeFile(path, {{"w", "F32", {2, 3}, w.data()}, {"b", "F32", {2}, b.data()}},
            run, 4);
  Status st;
  auto r = SafetensorsReader::open(path, st);
  REQUIRE(r);
  std::map<std::string, uint32_t> crcs;
  bool present = false;
  REQUIRE(recordedCrcs(*r, crcs, present));
  CHECK(present);
  CHECK(crcs.at("w") == crc32Update(0, w.data(), 24));
  CHECK(crcs.at("b") == crc32Update(0, b.data(), 8));
  std::string id;
  REQUIRE(recordedRunId(*r, id));
  CHECK(id == run);
  CHECK(verifyFile(path));
  r.reset();

  SECTION("a sign bit flipped") {
    flipByte(path, offsetOf(path, "w", 2) + 3, 0x80);
    CHECK(contains(verifyFile(path), "checkpoint '" + path +
                                         "': tensor 'w' does not match its "
                                         "CRC-32 in its metadata (recorded"));
  }
  SECTION("an exponent's top bit flipped") {
    flipByte(path, offsetOf(path, "b", 1) + 3, 0x40);
    CHECK(contains(verifyFile(path), "tensor 'b' does not match its CRC-32"));
  }
  SECTION("a NaN written with its CRC-32: non-finite") {
    w[4] = NAN;
    writeFile(path, {{"w", "F32", {2, 3}, w.data()}}, run, 4);
    CHECK(verifyFile(path).message() ==
          "checkpoint '" + path +
              "': tensor 'w' holds a non-finite value (nan at element 4); "
              "piper does not start from it");
  }
  SECTION("infinities of every float dtype") {
    uint16_t half[3] = {0x3C00, 0xFC00, 0}; // 1, -inf (F16)
    uint16_t bf[2] = {0x3F80, 0x7FC0};      // 1, nan (BF16)
    double f64[2] = {1, INFINITY};
    writeFile(path, {{"h", "F16", {3}, half}}, run, 4);
    CHECK(contains(verifyFile(path), "'h' holds a non-finite value (-inf at "
                                     "element 1)"));
    writeFile(path, {{"bf", "BF16", {2}, bf}}, run, 4);
    CHECK(contains(verifyFile(path), "(nan at element 1)"));
    writeFile(path, {{"d", "F64", {2}, f64}}, run, 4);
    CHECK(contains(verifyFile(path), "(inf at element 1)"));
    int32_t ints[2] = {-1, 0x7F800000};
    writeFile(path, {{"i", "I32", {2}, ints}}, run, 4);
    CHECK(verifyFile(path));
  }
  SECTION("a file without CRC-32s verifies its values only") {
    REQUIRE(writeSafetensors(path, {{"w", "F32", {2, 3}, w.data()}},
                             checkpointMetadata(4)));
    CHECK(verifyFile(path));
    flipByte(path, offsetOf(path, "w", 0) + 3, 0x80);
    CHECK(verifyFile(path));
  }
  SECTION("malformed CRC-32 and run id metadata") {
    REQUIRE(writeSafetensors(path, {{"w", "F32", {2, 3}, w.data()}},
                             {{kCrc32Key, "{\"w\": 5}"}}));
    CHECK(contains(verifyFile(path), "metadata \"piper.crc32\": the CRC-32 of "
                                     "\"w\" is 5, expected 8 hex digits"));
    REQUIRE(writeSafetensors(path, {{"w", "F32", {2, 3}, w.data()}},
                             {{kCrc32Key, "{}"}}));
    CHECK(contains(verifyFile(path), "has no CRC-32 of tensor \"w\""));
    REQUIRE(writeSafetensors(path, {{"w", "F32", {2, 3}, w.data()}},
                             {{kCrc32Key, "[1"}}));
    CHECK(contains(verifyFile(path), "malformed JSON"));
    REQUIRE(writeSafetensors(path, {{"w", "F32", {2, 3}, w.data()}},
                             {{kRunIdKey, "run-1"}}));
    r = SafetensorsReader::open(path, st);
    REQUIRE(r);
    CHECK(contains(recordedRunId(*r, id),
                   "metadata \"piper.run_id\" is \"run-1\", expected 32 "
                   "lowercase hex digits"));
  }
}

TEST_CASE("merging checksummed parts", "[integrity]") {
  std::string dir = tempDir();
  std::vector<float> wte(6, 1.0f), head(6, 2.0f);
  const std::string run = newRunId();
  writeFile(dir + "/p0", {{"wte", "F32", {3, 2}, wte.data()}}, run, 5);
  writeFile(dir + "/p1",
            {{"head", "F32", {2, 3}, head.data()},
             {"wte", "F32", {3, 2}, wte.data()}},
            run, 5);
  REQUIRE(mergeSafetensors({dir + "/p0", dir + "/p1"}, dir + "/all",
                           checkpointMetadata(5, run)));
  // The same bytes as one checksummed write of every tensor.
  writeFile(dir + "/direct",
            {{"wte", "F32", {3, 2}, wte.data()},
             {"head", "F32", {2, 3}, head.data()}},
            run, 5);
  CHECK(readBytes(dir + "/all") == readBytes(dir + "/direct"));
  CHECK(verifyFile(dir + "/all"));

  // A part whose bytes changed after it was written is not merged.
  flipByte(dir + "/p1", offsetOf(dir + "/p1", "head", 1), 0x01);
  Status st = mergeSafetensors({dir + "/p0", dir + "/p1"}, dir + "/x",
                               checkpointMetadata(5, run));
  CHECK(contains(st, "checkpoint '" + dir +
                         "/p1': tensor 'head' does not "
                         "match its CRC-32"));
  CHECK(::access((dir + "/x").c_str(), F_OK) != 0);
}

namespace {

const char *kGoodState = R"({"format": "piper-checkpoint", "version": 3,
  "step": 8, "layout": "whole", "run_id": "0123456789abcdef0123456789abcdef",
  "run": {"seed": 3},
  "files": {"model.safetensors": {"bytes": 100, "header_crc32": "0a1b2c3d",
                                  "tensors": {"w": "cbf43926"}}}})";

/// kGoodState with `from` replaced by `to`.
std::string edited(const std::string &from, const std::string &to) {
  std::string s = kGoodState;
  size_t at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

Status parse(const std::string &text) {
  CheckpointManifest m;
  return parseCheckpointManifest(text, m);
}

} // namespace

TEST_CASE("state.json: every field type-checked", "[manifest]") {
  CheckpointManifest m;
  REQUIRE(parseCheckpointManifest(kGoodState, m));
  CHECK(m.version == 3);
  CHECK(m.step == 8);
  CHECK(m.layout == "whole");
  CHECK(m.runId == "0123456789abcdef0123456789abcdef");
  CHECK(m.run["seed"] == 3);
  REQUIRE(m.files.size() == 1);
  CHECK(m.files[0].name == "model.safetensors");
  CHECK(m.files[0].bytes == 100);
  CHECK(m.files[0].headerCrc == 0x0a1b2c3du);
  CHECK(m.files[0].tensors ==
        std::vector<std::pair<std::string, uint32_t>>{{"w", 0xcbf43926u}});
  // Written and read back: the same manifest.
  CheckpointManifest back;
  REQUIRE(parseCheckpointManifest(formatCheckpointManifest(m), back));
  CHECK(formatCheckpointManifest(back) == formatCheckpointManifest(m));

  // The findings of issue 18: wrong-typed fields threw type_error.
  CHECK(parse(edited("\"piper-checkpoint\"", "1")).message() ==
        "\"format\" is a number, expected a string");
  CHECK(parse(edited("\"version\": 3", "\"version\": \"2\"")).message() ==
        "\"version\" is a string, expected an integer");
  CHECK(parse(edited("\"whole\"", "1")).message() ==
        "\"layout\" is a number, expected a string");
  CHECK(parse(edited("\"step\": 8", "\"step\": 8.5")).message() ==
        "\"step\" is a floating-point number, expected an integer");
  CHECK(parse(edited("\"step\": 8", "\"step\": -1")).message() ==
        "\"step\" is -1, expected 0 or more");
  CHECK(parse(edited("\"run\": {\"seed\": 3}", "\"run\": []")).message() ==
        "\"run\" is an array, expected an object");
  CHECK(parse(edited("\"0123456789abcdef0123456789abcdef\"", "7")).message() ==
        "\"run_id\" is a number, expected a string");
  CHECK(parse(edited("\"0123456789abcdef0123456789abcdef\"", "\"x\""))
            .message() ==
        "\"run_id\" is \"x\", expected 32 lowercase hex digits");
  CHECK(parse(edited("\"bytes\": 100", "\"bytes\": \"100\"")).message() ==
        "\"files\": \"model.safetensors\": \"bytes\" is a string, expected a "
        "non-negative integer");
  CHECK(parse(edited("\"0a1b2c3d\"", "168504381")).message() ==
        "\"files\": \"model.safetensors\": \"header_crc32\" is a number, "
        "expected a string");
  CHECK(parse(edited("\"cbf43926\"", "\"xyz\"")).message() ==
        "\"files\": \"model.safetensors\": \"tensors\": \"w\" is \"xyz\", "
        "expected 8 hex digits");
  CHECK(parse(edited("\"model.safetensors\"", "\"../model.safetensors\""))
            .message() == "\"files\": \"../model.safetensors\" is not a file "
                          "name of the checkpoint's directory");
  CHECK(parse(edited("\"piper-checkpoint\"", "\"other\"")).message() ==
        "\"format\" is \"other\", not \"piper-checkpoint\"");
  CHECK(parse(edited("\"version\": 3", "\"version\": 4")).message() ==
        "written by a newer piper (version 4; this one reads up to 3)");
  CHECK(parse(edited("\"whole\"", "\"mixed\"")).message() ==
        "\"layout\" is \"mixed\", expected \"whole\" or \"shards\"");
  CHECK(parse("[]").message() == "expected a JSON object, found an array");
  CHECK(parse("{\"format\": ").message().rfind("malformed JSON at byte", 0) ==
        0);

  // Before version 3: sizes only, "layout" and "run" optional.
  REQUIRE(parseCheckpointManifest(
      R"({"format": "piper-checkpoint", "version": 1, "step": 2,
          "files": {"model.safetensors": 64}})",
      m));
  CHECK(m.layout == "whole");
  CHECK_FALSE(m.checksummed());
  CHECK(m.files[0].bytes == 64);
  CHECK(parse(R"({"format": "piper-checkpoint", "version": 2, "step": 2,
                  "layout": "shards", "files": {"rank-0.safetensors": "64"}})")
            .message() == "\"files\": \"rank-0.safetensors\" is a string, "
                          "expected a non-negative integer");
}

namespace {

/// A checkpoint directory of two files written by run `run` at step 6, and
/// its manifest.
CheckpointManifest writeCheckpointDir(const std::string &dir,
                                      const std::string &run,
                                      std::vector<float> &w,
                                      std::vector<float> &m) {
  writeFile(dir + "/model.safetensors", {{"w", "F32", {2, 2}, w.data()}}, run,
            6);
  writeFile(dir + "/optimizer.safetensors",
            {{"w.exp_avg", "F32", {2, 2}, m.data()},
             {"w.exp_avg_sq", "F32", {2, 2}, m.data()}},
            run, 6);
  CheckpointManifest manifest;
  manifest.step = 6;
  manifest.runId = run;
  for (const char *name : {"model.safetensors", "optimizer.safetensors"}) {
    ManifestFile file;
    REQUIRE(describeCheckpointFile(dir, name, run, 6, file));
    manifest.files.push_back(file);
  }
  return manifest;
}

Status verifyDir(const std::string &dir, const CheckpointManifest &m,
                 CheckpointFault &fault) {
  std::vector<std::unique_ptr<SafetensorsReader>> readers;
  Status st = verifyCheckpointDir(dir, m, readers, fault);
  CHECK(readers.size() == (st ? m.files.size() : 0));
  return st;
}

} // namespace

TEST_CASE("a checkpoint directory verified against its state.json",
          "[manifest]") {
  std::string dir = tempDir();
  std::vector<float> w = {1, 2, 3, 4}, m = {0.1f, 0.2f, 0.3f, 0.4f};
  const std::string run = newRunId();
  CheckpointManifest manifest = writeCheckpointDir(dir, run, w, m);
  const std::string model = dir + "/model.safetensors";
  const std::string optimizer = dir + "/optimizer.safetensors";
  CHECK(manifest.files[0].tensors.size() == 1);
  CHECK(manifest.files[1].tensors.size() == 2);
  CheckpointFault fault;
  REQUIRE(verifyDir(dir, manifest, fault));
  CHECK(fault == CheckpointFault::None);

  SECTION("a file cut short or missing: incomplete") {
    std::string bytes = readBytes(optimizer);
    writeBytes(optimizer, bytes.substr(0, bytes.size() - 4));
    CHECK(verifyDir(dir, manifest, fault).message() ==
          "'" + optimizer + "' has " + std::to_string(bytes.size() - 4) +
              " bytes, " + std::to_string(bytes.size()) + " were written");
    CHECK(fault == CheckpointFault::Incomplete);
    ::unlink(optimizer.c_str());
    CHECK(verifyDir(dir, manifest, fault).message() ==
          "'" + optimizer + "' is missing");
    CHECK(fault == CheckpointFault::Incomplete);
  }
  SECTION("a byte flipped in the middle of the last file: corrupt") {
    size_t size = readBytes(optimizer).size();
    flipByte(optimizer, size - 12, 0x10);
    Status st = verifyDir(dir, manifest, fault);
    CHECK(contains(st, "checkpoint '" + optimizer +
                           "': tensor "
                           "'w.exp_avg_sq' does not match its CRC-32 in "
                           "state.json"));
    CHECK(fault == CheckpointFault::Corrupt);
  }
  SECTION("a tensor changed with its CRC-32 in state.json: corrupt, by the "
          "file's own record") {
    flipByte(optimizer, offsetOf(optimizer, "w.exp_avg", 1) + 3, 0x80);
    // state.json edited to the changed tensor's CRC-32 (its header's is
    // unchanged: only tensor bytes moved).
    Status st;
    auto r = SafetensorsReader::open(optimizer, st);
    REQUIRE(r);
    const SafetensorsEntry *e = r->find("w.exp_avg");
    REQUIRE(e);
    TensorScan scan;
    REQUIRE(scanTensor(*r, *e, scan));
    for (auto &[name, crc] : manifest.files[1].tensors)
      if (name == "w.exp_avg")
        crc = scan.crc;
    CHECK(contains(verifyDir(dir, manifest, fault),
                   "tensor 'w.exp_avg' does not match its CRC-32 in its "
                   "metadata"));
    CHECK(fault == CheckpointFault::Corrupt);
  }
  SECTION("a moment's sign flipped: corrupt, naming the tensor") {
    flipByte(optimizer, offsetOf(optimizer, "w.exp_avg", 1) + 3, 0x80);
    CHECK(contains(verifyDir(dir, manifest, fault),
                   "tensor 'w.exp_avg' does not match its CRC-32"));
    CHECK(fault == CheckpointFault::Corrupt);
  }
  SECTION("a header byte changed: corrupt") {
    // "step":"6" -> "step":"7" in the model file's metadata.
    std::string bytes = readBytes(model);
    size_t at = bytes.find("\"step\":\"6\"");
    REQUIRE(at != std::string::npos);
    bytes[at + 8] = '7';
    writeBytes(model, bytes);
    CHECK(verifyDir(dir, manifest, fault).message() ==
          "checkpoint '" + model + "' holds step 7, state.json step 6");
    CHECK(fault == CheckpointFault::Corrupt);
    bytes[at + 8] = '6';
    // The CRC-32 of "w" in the piper.crc32 metadata (JSON in a string).
    const std::string key = "\\\"w\\\":\\\"";
    REQUIRE(bytes.find(key) != std::string::npos);
    size_t crcAt = bytes.find(key) + key.size();
    bytes[crcAt] = bytes[crcAt] == '0' ? '1' : '0';
    writeBytes(model, bytes);
    CHECK(contains(verifyDir(dir, manifest, fault),
                   "checkpoint '" + model +
                       "': its header does not match "
                       "its CRC-32 in state.json"));
  }
  SECTION("a file of another run's checkpoint of the same step: corrupt") {
    std::string other = tempDir();
    writeCheckpointDir(other, newRunId(), w, m);
    writeBytes(optimizer, readBytes(other + "/optimizer.safetensors"));
    CHECK(contains(verifyDir(dir, manifest, fault),
                   "checkpoint '" + optimizer +
                       "' is of another run: its "
                       "run id is '"));
    CHECK(fault == CheckpointFault::Corrupt);
  }
  SECTION("a NaN that matches its CRC-32: corrupt") {
    w[3] = NAN;
    manifest = writeCheckpointDir(dir, run, w, m);
    CHECK(contains(verifyDir(dir, manifest, fault),
                   "tensor 'w' holds a non-finite value (nan at element 3)"));
    CHECK(fault == CheckpointFault::Corrupt);
  }
  SECTION("a manifest that lists other tensors: corrupt") {
    manifest.files[0].tensors[0].first = "v";
    CHECK(verifyDir(dir, manifest, fault).message() ==
          "checkpoint '" + model + "': tensor 'w' is not in state.json");
    CHECK(fault == CheckpointFault::Corrupt);
  }
  SECTION("an old manifest: sizes, headers, steps and values only") {
    // Files of an older piper: no run id, no CRC-32s.
    REQUIRE(writeSafetensors(model, {{"w", "F32", {2, 2}, w.data()}},
                             checkpointMetadata(6)));
    CheckpointManifest old;
    old.version = 2;
    old.step = 6;
    old.files.push_back(
        ManifestFile{"model.safetensors", readBytes(model).size(), 0, {}});
    CHECK(formatCheckpointManifest(old).find("\"model.safetensors\": ") !=
          std::string::npos);
    CHECK(verifyDir(dir, old, fault));
    // Undetectable without CRC-32s; a NaN is not.
    flipByte(model, offsetOf(model, "w", 0) + 3, 0x80);
    CHECK(verifyDir(dir, old, fault));
    w[0] = NAN;
    REQUIRE(writeSafetensors(model, {{"w", "F32", {2, 2}, w.data()}},
                             checkpointMetadata(6)));
    CHECK(contains(verifyDir(dir, old, fault), "non-finite"));
    CHECK(fault == CheckpointFault::Corrupt);
  }
}
