// Hugging Face folders (HfCheckpoint.h): exact dtype conversions, the
// placement of sources in a parameter (transposed, at a column offset, in an
// expert block) and back, sharded export with its index, and the checks'
// messages. The whole-model proof is //test/oracle:hf_checkpoint_test.
#include "runtime/formats/HfCheckpoint.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "runtime/formats/Json.h"

using namespace piper;

using namespace piper::runtime;

namespace {

std::string freshDir(const std::string &name) {
  const char *tmp = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(tmp ? tmp : "/tmp") + "/hf-" + name;
  std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  REQUIRE(std::system(cmd.c_str()) == 0);
  return dir;
}

void writeText(const std::string &path, const std::string &text) {
  std::ofstream(path) << text;
}

bool exists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

float bitsToFloat(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

std::unique_ptr<HfFolder> openFolder(const std::string &dir) {
  Status st;
  std::unique_ptr<HfFolder> f = HfFolder::open(dir, st);
  INFO(st.message());
  REQUIRE(f);
  return f;
}

} // namespace

TEST_CASE("Hugging Face tensors read as float32 exactly", "[hf]") {
  std::string dir = freshDir("dtypes");
  // float16: zeros, normals, the subnormal range's ends, the largest
  // finite value, infinities and a NaN; bfloat16: the top half of float32.
  const std::vector<std::pair<uint16_t, float>> f16 = {
      {0x0000, 0.0f},
      {0x8000, -0.0f},
      {0x3C00, 1.0f},
      {0xC000, -2.0f},
      {0x3555, 0.333251953125f},
      {0x0001, std::ldexp(1.0f, -24)},
      {0x03FF, 1023 * std::ldexp(1.0f, -24)},
      {0x8200, -std::ldexp(1.0f, -15)},
      {0x0400, std::ldexp(1.0f, -14)},
      {0x7BFF, 65504.0f},
      {0x7C00, std::numeric_limits<float>::infinity()},
      {0xFC00, -std::numeric_limits<float>::infinity()},
  };
  std::vector<uint16_t> halfBits, bfBits;
  for (const auto &[bits, value] : f16)
    halfBits.push_back(bits);
  halfBits.push_back(0x7E00); // NaN
  const std::vector<float> bfValues = {1.0f, -3.5f, bitsToFloat(0x3EAA0000u),
                                       0.0f};
  for (float v : bfValues) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    bfBits.push_back(static_cast<uint16_t>(bits >> 16));
  }
  std::vector<float> f32 = {1.5f, -0.25f};
  REQUIRE(writeSafetensors(
      dir + "/model.safetensors",
      {SafetensorsTensor{"h",
                         "F16",
                         {static_cast<int64_t>(halfBits.size())},
                         halfBits.data()},
       SafetensorsTensor{
           "b", "BF16", {static_cast<int64_t>(bfBits.size())}, bfBits.data()},
       SafetensorsTensor{"f", "F32", {2}, f32.data()}},
      {{"format", "pt"}}));
  auto folder = openFolder(dir);
  CHECK(folder->configText().empty());
  std::vector<float> out;
  REQUIRE(folder->readFloat("h", out));
  REQUIRE(out.size() == f16.size() + 1);
  for (size_t i = 0; i < f16.size(); ++i) {
    INFO("float16 bits " << halfBits[i]);
    CHECK(std::memcmp(&out[i], &f16[i].second, 4) == 0);
  }
  CHECK(std::isnan(out.back()));
  REQUIRE(folder->readFloat("b", out));
  CHECK(out == bfValues);
  REQUIRE(folder->readFloat("f", out));
  CHECK(out == f32);
  Status st = folder->readFloat("missing", out);
  CHECK(st.message() ==
        "Hugging Face folder '" + dir + "' has no tensor 'missing'");
}

TEST_CASE("Hugging Face sources are placed in a parameter and taken back",
          "[hf]") {
  std::string dir = freshDir("place");
  // Two experts of [3, 4]: expert 0 is an nn.Linear [2, 3] (transposed to
  // columns 0..1) beside a [3, 2] tensor as it is (columns 2..3); expert 1
  // is one [3, 4] tensor.
  HfParam param{"experts", {2, 3, 4}, {}};
  param.sources = {HfPlacement{"e0.lin", {2, 3}, true, 0, 0},
                   HfPlacement{"e0.raw", {3, 2}, false, 0, 2},
                   HfPlacement{"e1", {3, 4}, false, 1, 0}};
  std::vector<float> lin = {1, 2, 3, 4, 5, 6};             // [2, 3]
  std::vector<float> raw = {7, 8, 9, 10, 11, 12};          // [3, 2]
  std::vector<float> e1 = {13, 14, 15, 16, 17, 18, 19, 20, // [3, 4]
                           21, 22, 23, 24};
  REQUIRE(
      writeSafetensors(dir + "/model.safetensors",
                       {SafetensorsTensor{"e0.lin", "F32", {2, 3}, lin.data()},
                        SafetensorsTensor{"e0.raw", "F32", {3, 2}, raw.data()},
                        SafetensorsTensor{"e1", "F32", {3, 4}, e1.data()},
                        SafetensorsTensor{"model.layers.0.rotary_emb."
                                          "inv_freq",
                                          "F32",
                                          {2},
                                          raw.data()}},
                       {}));
  auto folder = openFolder(dir);
  REQUIRE(checkHfFolder(*folder, {param}));
  std::vector<float> whole;
  REQUIRE(readHfParam(*folder, param, whole));
  // Row r of expert 0: lin[0][r], lin[1][r], raw[r][0], raw[r][1].
  const std::vector<float> expected = {1,  4,  7,  8,  2,  5,  9,  10,
                                       3,  6,  11, 12, 13, 14, 15, 16,
                                       17, 18, 19, 20, 21, 22, 23, 24};
  CHECK(whole == expected);

  // A range reads only the tensors with elements in it: expert 1's block
  // (an expert-parallel rank's) reads e1 alone; elements 9..13 straddle
  // expert 0's last row (e0.lin's element, e0.raw's two) and expert 1.
  auto slice = [&](int64_t from, int64_t n) {
    return std::vector<float>(expected.begin() + from,
                              expected.begin() + from + n);
  };
  HfSourceCache cache;
  std::vector<float> part(12, -1.0f);
  REQUIRE(readHfParamRange(*folder, param, 12, 12, part.data(), cache));
  CHECK(part == slice(12, 12));
  CHECK(cache.size() == 1);
  CHECK(cache.count("e1") == 1);
  cache.clear();
  std::vector<float> mid(5, -1.0f);
  REQUIRE(readHfParamRange(*folder, param, 9, 5, mid.data(), cache));
  CHECK(mid == slice(9, 5));
  CHECK(cache.size() == 3);
  // Further ranges of the parameter use the tensors kept.
  std::vector<float> head(4, -1.0f);
  REQUIRE(readHfParamRange(*folder, param, 0, 4, head.data(), cache));
  CHECK(head == slice(0, 4));
  Status past = readHfParamRange(*folder, param, 20, 5, mid.data(), cache);
  CHECK(!past);
  CHECK(past.message().find("elements [20, 25) of parameter 'experts', which "
                            "has 24") != std::string::npos);

  // Back out, one tensor per file (a 24-byte limit), then in one file.
  std::string out = freshDir("place-out");
  auto reader = [&](const HfParam &p, std::vector<float> &v) {
    CHECK(p.name == "experts");
    v = whole;
    return Status::ok();
  };
  writeText(out + "/model.safetensors", "stale");
  REQUIRE(writeHfFolder(out, "{\"a\": 1}", {param}, reader, "F32", 24));
  CHECK(!exists(out + "/model.safetensors"));
  auto back = openFolder(out);
  CHECK(back->configText() == "{\"a\": 1}");
  CHECK(back->names() == std::vector<std::string>{"e0.lin", "e0.raw", "e1"});
  std::vector<float> v;
  REQUIRE(back->readFloat("e0.lin", v));
  CHECK(v == lin);
  REQUIRE(back->readFloat("e0.raw", v));
  CHECK(v == raw);
  REQUIRE(back->readFloat("e1", v));
  CHECK(v == e1);
  {
    std::ifstream index(out + "/" + kHfIndexFile);
    std::stringstream text;
    text << index.rdbuf();
    StatusOr<Json> parsed = parseJson(text.str());
    REQUIRE(parsed);
    const Json &root = *parsed;
    CHECK(root["metadata"]["total_size"] == 4 * 24);
    CHECK(root["weight_map"]["e1"] == "model-00003-of-00003.safetensors");
  }
  REQUIRE(writeHfFolder(out, "{}", {param}, reader, "BF16", 1000));
  CHECK(!exists(out + "/" + kHfIndexFile));
  back = openFolder(out);
  REQUIRE(back->find("e1"));
  CHECK(back->find("e1")->dtype == "BF16");
  REQUIRE(back->readFloat("e1", v));
  CHECK(v == e1); // small integers are exact in bfloat16
}

TEST_CASE("Hugging Face folders that do not fit give one error listing all",
          "[hf]") {
  std::string dir = freshDir("misfit");
  std::vector<float> data(12, 1.0f);
  REQUIRE(
      writeSafetensors(dir + "/model.safetensors",
                       {SafetensorsTensor{"a", "F32", {3, 4}, data.data()},
                        SafetensorsTensor{"i", "I32", {2}, data.data()},
                        SafetensorsTensor{"extra", "F32", {2}, data.data()}},
                       {}));
  auto folder = openFolder(dir);
  HfParam wrongShape{"p", {4, 3}, {HfPlacement{"a", {4, 3}, false, 0, 0}}};
  HfParam missing{"q", {2}, {HfPlacement{"gone", {2}, false, 0, 0}}};
  HfParam badDtype{"r", {2}, {HfPlacement{"i", {2}, false, 0, 0}}};
  HfParam misplaced{"s", {4, 3}, {HfPlacement{"a", {3, 4}, true, 0, 1}}};
  HfParam partial{"t", {3, 5}, {HfPlacement{"a", {3, 4}, false, 0, 0}}};
  Status st = checkHfFolder(
      *folder, {wrongShape, missing, badDtype, misplaced, partial});
  CHECK(st.message() ==
        "Hugging Face folder '" + dir +
            "' does not fit the model:\n"
            "  tensor 'a' has shape [3, 4], the model needs [4, 3] "
            "(parameter 'p')\n"
            "  missing tensor 'gone' (of parameter 'q')\n"
            "  tensor 'i' is I32; Piper reads F32, BF16 and F16\n"
            "  Hugging Face tensor 'a' of shape [3, 4] does not fit parameter "
            "'s' of shape [4, 3]\n"
            "  parameter 's': its Hugging Face tensors cover 0 of its 12 "
            "elements\n"
            "  parameter 't': its Hugging Face tensors cover 12 of its 15 "
            "elements\n"
            "  unexpected tensor 'extra' (no parameter of the model is made "
            "of it)");

  Status open;
  CHECK(!HfFolder::open(dir + "/model.safetensors", open));
  CHECK(open.message() ==
        "Hugging Face folder '" + dir + "/model.safetensors': not a directory");
  std::string empty = freshDir("empty");
  CHECK(!HfFolder::open(empty, open));
  CHECK(open.message() == "Hugging Face folder '" + empty +
                              "': has neither model.safetensors nor "
                              "model.safetensors.index.json");
  writeText(empty + "/" + kHfIndexFile, "{\"weight_map\": {\"a\": 3}}");
  CHECK(!HfFolder::open(empty, open));
  CHECK(open.message() == "Hugging Face folder '" + empty +
                              "': model.safetensors.index.json: "
                              "weight_map[\"a\"] is a number, expected a "
                              "string");
  writeText(empty + "/" + kHfIndexFile,
            "{\"weight_map\": {\"a\": \"../x.safetensors\"}}");
  CHECK(!HfFolder::open(empty, open));
  CHECK(open.message() == "Hugging Face folder '" + empty +
                              "': model.safetensors.index.json: "
                              "weight_map[\"a\"] names \"../x.safetensors\", "
                              "not a file of the folder");
}

TEST_CASE("a folder's config.json must describe the compiled model", "[hf]") {
  CHECK(checkHfConfigsMatch(
      R"({"hidden_size": 64, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-05})",
      R"({"rms_norm_eps": 0.00001, "hidden_size": 64, "torch_dtype": "float32"})",
      "dir"));
  Status st = checkHfConfigsMatch(
      R"({"hidden_size": 64, "num_attention_heads": 8, "rope_scaling": null})",
      R"({"hidden_size": 64, "num_attention_heads": 4})", "dir");
  CHECK(st.message() ==
        "dir/config.json describes another model than the one compiled "
        "(piperc model --hf):\n"
        "  \"num_attention_heads\": 8 here, 4 in the compiled model\n"
        "  \"rope_scaling\": null here, absent in the compiled model");
}

TEST_CASE("a Hugging Face tensor with a non-finite value is refused, as "
          "--load FILE refuses one",
          "[hf]") {
  for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                    -std::numeric_limits<float>::infinity()}) {
    std::string dir = freshDir("nonfinite");
    HfParam param{"w", {2, 2}, {HfPlacement{"w", {2, 2}, false, 0, 0}}};
    std::vector<float> w = {1, 2, bad, 4};
    REQUIRE(writeSafetensors(dir + "/model.safetensors",
                             {SafetensorsTensor{"w", "F32", {2, 2}, w.data()}},
                             {}));
    auto folder = openFolder(dir);
    HfSourceCache cache;
    std::vector<float> out(4);
    Status st = readHfParamRange(*folder, param, 0, 4, out.data(), cache);
    INFO(st.message());
    CHECK(!st);
    CHECK(st.message().find("tensor 'w' holds a non-finite value (" +
                            std::string(std::isnan(bad) ? "nan" : "-inf") +
                            " at element 2); piper does not start from it") !=
          std::string::npos);
  }
}

namespace {

/// Every file of `dir` (not recursively) and its bytes.
std::map<std::string, std::string> folderFiles(const std::string &dir) {
  std::map<std::string, std::string> out;
  DIR *d = ::opendir(dir.c_str());
  REQUIRE(d);
  while (dirent *e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..")
      continue;
    std::ifstream f(dir + "/" + name, std::ios::binary);
    std::stringstream text;
    text << f.rdbuf();
    out[name] = text.str();
  }
  ::closedir(d);
  return out;
}

/// Names in `parent` that start with `prefix`.
std::vector<std::string> namesStartingWith(const std::string &parent,
                                           const std::string &prefix) {
  std::vector<std::string> out;
  DIR *d = ::opendir(parent.c_str());
  REQUIRE(d);
  while (dirent *e = ::readdir(d))
    if (std::string(e->d_name).compare(0, prefix.size(), prefix) == 0)
      out.push_back(e->d_name);
  ::closedir(d);
  return out;
}

} // namespace

TEST_CASE("a Hugging Face export is all or nothing", "[hf]") {
  std::string parent = freshDir("atomic");
  std::string dir = parent + "/model";
  std::vector<HfParam> params;
  for (int i = 0; i < 3; ++i)
    params.push_back(
        HfParam{"p" + std::to_string(i),
                {2, 3},
                {HfPlacement{"t" + std::to_string(i), {2, 3}, false, 0, 0}}});
  auto values = [](float base) {
    return [base](const HfParam &p, std::vector<float> &v) {
      v.assign(6, base + float(p.name[1] - '0'));
      return Status::ok();
    };
  };
  // Three shards of one tensor each (24 bytes), and a file of the user's.
  REQUIRE(writeHfFolder(dir, "{\"v\": 1}", params, values(1), "F32", 24));
  writeText(dir + "/tokenizer.json", "{\"tok\": true}");
  const std::map<std::string, std::string> first = folderFiles(dir);
  CHECK(first.count("model-00003-of-00003.safetensors") == 1);

  // An export that fails at its second parameter leaves the first export
  // whole, and no temporary folder.
  int calls = 0;
  Status failed = writeHfFolder(
      dir, "{\"v\": 2}", params,
      [&](const HfParam &p, std::vector<float> &v) {
        if (++calls == 2)
          return Status::error("reading '" + p.name + "' failed");
        v.assign(6, 9.0f);
        return Status::ok();
      },
      "F32", 1000);
  CHECK(!failed);
  CHECK(failed.message().find("reading 'p1' failed") != std::string::npos);
  CHECK(folderFiles(dir) == first);
  CHECK(namesStartingWith(parent, ".model.piper-export-").empty());

  // A temporary folder a killed export left is removed by the next export,
  // which replaces the three shards by one file (no shard of the earlier
  // layout stays) and carries the user's file over.
  std::string stale = parent + "/.model.piper-export-99999";
  REQUIRE(::mkdir(stale.c_str(), 0777) == 0);
  writeText(stale + "/model.safetensors", "half-written");
  REQUIRE(writeHfFolder(dir, "{\"v\": 3}", params, values(5), "F32", 1000));
  CHECK(namesStartingWith(parent, ".model.piper-export-").empty());
  std::map<std::string, std::string> now = folderFiles(dir);
  std::vector<std::string> names;
  for (const auto &[name, bytes] : now)
    names.push_back(name);
  CHECK(names == std::vector<std::string>{"config.json", "model.safetensors",
                                          "tokenizer.json"});
  CHECK(now["config.json"] == "{\"v\": 3}");
  CHECK(now["tokenizer.json"] == "{\"tok\": true}");
  auto folder = openFolder(dir);
  std::vector<float> v;
  REQUIRE(folder->readFloat("t2", v));
  CHECK(v == std::vector<float>(6, 7.0f));

  // A sub-folder cannot be carried over: an error, the folder unchanged.
  REQUIRE(::mkdir((dir + "/extra").c_str(), 0777) == 0);
  Status sub = writeHfFolder(dir, "{}", params, values(0), "F32", 1000);
  CHECK(!sub);
  CHECK(sub.message().find("is a folder or special file") != std::string::npos);
  CHECK(folderFiles(dir).at("config.json") == "{\"v\": 3}");
  CHECK(namesStartingWith(parent, ".model.piper-export-").empty());
}

TEST_CASE("a folder's config.json is read with the shared reader's limits",
          "[hf]") {
  std::string dir = freshDir("config-limits");
  std::vector<float> w = {1.0f};
  REQUIRE(writeSafetensors(dir + "/model.safetensors",
                           {SafetensorsTensor{"w", "F32", {1}, w.data()}}, {}));
  const std::string config = dir + "/config.json";
  const std::string who =
      "Hugging Face folder '" + dir + "': file '" + config + "' ";
  auto refused = [&]() {
    Status st;
    CHECK(!HfFolder::open(dir, st));
    return st.message();
  };
  // A symlink to /dev/zero ran out of memory, a FIFO blocked until a
  // writer came: both were taken for an absent config.json before.
  REQUIRE(::symlink("/dev/zero", config.c_str()) == 0);
  CHECK(refused() == who + "is not a regular file");
  REQUIRE(std::remove(config.c_str()) == 0);
  REQUIRE(::mkfifo(config.c_str(), 0600) == 0);
  CHECK(refused() == who + "is not a regular file");
  REQUIRE(std::remove(config.c_str()) == 0);
  // A 4 GB sparse file is refused by its size, unread.
  writeText(config, "{}");
  REQUIRE(::truncate(config.c_str(), int64_t(4) << 30) == 0);
  CHECK(refused() == who + "is more than the limit of 16777216 bytes");
  REQUIRE(std::remove(config.c_str()) == 0);
  // A dangling symlink is there, and cannot be opened.
  REQUIRE(::symlink("nowhere.json", config.c_str()) == 0);
  CHECK(refused().rfind(who.substr(0, who.size() - 1) + ": cannot open: ", 0) ==
        0);
  REQUIRE(std::remove(config.c_str()) == 0);
  writeText(config, "{\"a\": 1}");
  CHECK(openFolder(dir)->configText() == "{\"a\": 1}");
  // 100,000 levels of nesting: parseJson refuses it before recursing.
  Status deep = checkHfConfigsMatch(
      std::string(100000, '[') + std::string(100000, ']'), "{}", "dir");
  CHECK(!deep);
  CHECK(deep.message().rfind("dir/config.json: ", 0) == 0);
}
