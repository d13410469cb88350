// End-to-end tests of piper-run with files: token-file data made by
// piper-tokenize (--data) and safetensors checkpoints (--save/--load).
#include "runtime/launch/launcher_test_util.h"

using namespace piper;
using namespace piper::launchertest;

namespace {

/// An English text of at least 10 kB: the GPL where the system has it.
std::string englishText() {
  std::string text = readFile("/usr/share/common-licenses/GPL-3");
  if (text.size() >= 10000)
    return text;
  text.clear();
  while (text.size() < 20000)
    text += "The GNU General Public License is a free, copyleft license for "
            "software and other kinds of works.\n";
  return text;
}

/// "loss X" of the stdout line of step `step`, as printed.
std::string printedLoss(const std::string &out, int step) {
  std::smatch m;
  std::regex re("step " + std::to_string(step) + R"(/\d+ \| loss (\S+) \|)");
  if (!std::regex_search(out, m, re))
    return "";
  return m[1];
}

/// The tensors of a safetensors file as name -> floats (F32 only).
std::vector<std::pair<std::string, std::vector<float>>>
readCheckpoint(const std::string &path) {
  Status st;
  auto r = runtime::SafetensorsReader::open(path, st);
  INFO(st.message());
  REQUIRE(r);
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (const runtime::SafetensorsEntry &e : r->tensors()) {
    REQUIRE(e.dtype == "F32");
    std::vector<float> v((e.end - e.begin) / 4);
    REQUIRE(r->read(e, v.data()));
    out.emplace_back(e.name, std::move(v));
  }
  return out;
}

} // namespace

TEST_CASE("piper-tokenize, then piper-run --data: strategies agree",
          "[launcher][data]") {
  std::string dir = tempDir("tok");
  std::ofstream(dir + "/text.txt", std::ios::binary) << englishText();
  RunResult tok = runBinary(
      kPiperTokenize, {dir + "/text.txt", "-o", dir + "/text.bin", "--header"},
      {}, std::chrono::seconds(30));
  INFO("stderr: " << tok.err);
  REQUIRE(tok.exitCode() == 0);
  std::string expected = std::to_string(englishText().size()) +
                         " tokens (uint16, with header, vocab 256) written to ";
  CHECK(tok.out.rfind(expected, 0) == 0);

  TinyModel m;
  m.vocab = 256;
  std::string single = strategy({singleClassPlan(m, 4, {0}, 1)}, "dsingle");
  std::string pp = strategy(pipelinePlans(m, 4), "dpp2");
  std::string dp = strategy({singleClassPlan(m, 2, {0, 1}, 2)}, "ddp2");
  auto run = [&](const std::string &out, int nproc, bool data) {
    std::vector<std::string> args = {
        out, "--nproc",   std::to_string(nproc), "--steps", "3", "--seed",
        "2", "--metrics", out + "/metrics.jsonl"};
    if (data) {
      args.push_back("--data");
      args.push_back(dir + "/text.bin");
    }
    RunResult r = piperRun(args);
    INFO("stderr: " << r.err);
    REQUIRE(r.exitCode() == 0);
    return metricLosses(out + "/metrics.jsonl");
  };
  std::vector<double> base = run(single, 1, true);
  std::vector<double> pipe = run(pp, 2, true);
  std::vector<double> data = run(dp, 2, true);
  std::vector<double> synthetic = run(single, 1, false);
  REQUIRE(base.size() == 3);
  REQUIRE(pipe.size() == 3);
  REQUIRE(data.size() == 3);
  for (int t = 0; t < 3; ++t) {
    CHECK(pipe[t] == Approx(base[t]).epsilon(1e-7));
    CHECK(data[t] == Approx(base[t]).epsilon(1e-6));
  }
  CHECK(synthetic[0] != base[0]);
  // An explicit --data-dtype that agrees with the header is fine.
  RunResult r = piperRun({single, "--nproc", "1", "--data", dir + "/text.bin",
                          "--data-dtype", "uint16"});
  CHECK(r.exitCode() == 0);
}

TEST_CASE("piper-run --data errors stop the run before any rank starts",
          "[launcher][data]") {
  TinyModel m; // vocab 16, sequences of 8
  std::string out = strategy(pipelinePlans(m, 2), "dataerr");
  std::string dir = tempDir("dataerr");

  SECTION("a token outside the vocabulary") {
    std::string path = dir + "/t.bin";
    REQUIRE(runtime::writeTokenFile(path, {1, 2, 3, 15, 16, 4, 5, 6, 7, 8},
                                    runtime::TokenDType::U32, true));
    RunResult r = piperRun({out, "--nproc", "2", "--data", path});
    CHECK(r.exitCode() == 1);
    CHECK(r.err == "piper-run: token file '" + path +
                       "': the token at index 4 is 16, not below the model's "
                       "vocab_size 16\n");
  }
  SECTION("too short") {
    std::string path = dir + "/short.bin";
    REQUIRE(runtime::writeTokenFile(path, {1, 2, 3, 4, 5, 6, 7, 8},
                                    runtime::TokenDType::U16, false));
    RunResult r = piperRun({out, "--nproc", "2", "--data", path});
    CHECK(r.exitCode() == 1);
    CHECK(r.err == "piper-run: token file '" + path +
                       "': too short: 8 tokens, but one sequence of 8 tokens "
                       "and its targets need 9\n");
  }
  SECTION("missing file") {
    RunResult r = piperRun({out, "--nproc", "2", "--data", dir + "/nope"});
    CHECK(r.exitCode() == 1);
    CHECK(r.err == "piper-run: token file '" + dir +
                       "/nope': cannot open: no such file or directory\n");
  }
  SECTION("a size that is not a whole number of tokens") {
    std::ofstream(dir + "/odd.bin", std::ios::binary) << "abcdefghijklmnopq";
    RunResult r = piperRun({out, "--nproc", "2", "--data", dir + "/odd.bin"});
    CHECK(r.exitCode() == 1);
    CHECK(r.err.find("17 bytes are not a whole number of 2-byte tokens") !=
          std::string::npos);
  }
  SECTION("--data-dtype against the header") {
    std::string path = dir + "/h.bin";
    REQUIRE(runtime::writeTokenFile(path, std::vector<uint32_t>(20, 1),
                                    runtime::TokenDType::U16, true));
    RunResult r = piperRun(
        {out, "--nproc", "2", "--data", path, "--data-dtype", "uint32"});
    CHECK(r.exitCode() == 1);
    CHECK(r.err.find("the requested dtype uint32 disagrees with the file's "
                     "header, which says uint16") != std::string::npos);
  }
  SECTION("--data-dtype needs --data, and a known width") {
    RunResult r = piperRun({out, "--nproc", "2", "--data-dtype", "uint16"});
    CHECK(r.exitCode() != 0);
    CHECK(r.err.find("--data") != std::string::npos);
    RunResult w = piperRun(
        {out, "--nproc", "2", "--data", dir + "/x", "--data-dtype", "int8"});
    CHECK(w.exitCode() != 0);
    CHECK(w.err.find("--data-dtype") != std::string::npos);
  }
}

TEST_CASE("piper-run --save and --load: safetensors round trips",
          "[launcher][checkpoint]") {
  TinyModel m;
  std::string single = strategy({singleClassPlan(m, 2, {0}, 1)}, "csingle");
  std::string pp = strategy(pipelinePlans(m, 2), "cpp2");
  std::string dp = strategy({singleClassPlan(m, 1, {0, 1}, 2)}, "cdp2");
  std::string dir = tempDir("ckpt");
  auto run = [&](const std::string &out, int nproc,
                 std::vector<std::string> extra) {
    std::vector<std::string> args = {out, "--nproc", std::to_string(nproc)};
    if (std::find(extra.begin(), extra.end(), "--seed") == extra.end())
      extra.insert(extra.end(), {"--seed", "4"});
    args.insert(args.end(), extra.begin(), extra.end());
    RunResult r = piperRun(args);
    INFO("stderr: " << r.err);
    REQUIRE(r.exitCode() == 0);
    return r;
  };

  // Two steps, saved: the file holds both parameters, named and shaped as
  // in the plan, with the metadata, and the same bytes as --save-params.
  std::string a = dir + "/sub/a.safetensors";
  run(single, 1,
      {"--steps", "2", "--save", a, "--save-params", dir + "/params"});
  {
    Status st;
    auto r = runtime::SafetensorsReader::open(a, st);
    INFO(st.message());
    REQUIRE(r);
    REQUIRE(r->tensors().size() == 2);
    CHECK(r->tensors()[0].name == "wte");
    CHECK(r->tensors()[0].shape == std::vector<int64_t>{16, 8});
    CHECK(r->tensors()[1].name == "head");
    CHECK(r->tensors()[1].shape == std::vector<int64_t>{8, 16});
    CHECK(*r->metadataValue("format") == "pt");
    CHECK(*r->metadataValue("producer") == "piper");
    CHECK(*r->metadataValue("step") == "2");
  }
  auto saved = readCheckpoint(a);
  CHECK(readFloats(dir + "/params/wte.bin") == saved[0].second);
  CHECK(readFloats(dir + "/params/head.bin") == saved[1].second);

  // --load then --save with no steps in between writes the same bytes, even
  // under another seed: loading replaces initialization.
  std::string b = dir + "/b.safetensors";
  run(single, 1, {"--steps", "0", "--seed", "77", "--load", a, "--save", b});
  CHECK(readFile(b) == readFile(a));

  // Steps continue after the checkpoint's, and the first loss after --load
  // is the straight run's loss at that step (the forward pass uses exactly
  // the saved parameters). Later losses differ: AdamW moments start again
  // from zero.
  RunResult straight = run(single, 1, {"--steps", "3"});
  RunResult resumed = run(single, 1, {"--steps", "1", "--load", a});
  CHECK(resumed.out.find("step 1/") == std::string::npos);
  REQUIRE(printedLoss(resumed.out, 3) != "");
  CHECK(printedLoss(resumed.out, 3) == printedLoss(straight.out, 3));

  // A pipeline writes one merged file (no parts left behind) whose values
  // match one rank's; loading and saving it again is byte-identical, and one
  // rank can load it too.
  std::string p = dir + "/p.safetensors";
  run(pp, 2, {"--steps", "2", "--save", p});
  CHECK(::access((p + ".class0.part").c_str(), F_OK) != 0);
  CHECK(::access((p + ".class1.part").c_str(), F_OK) != 0);
  auto merged = readCheckpoint(p);
  REQUIRE(merged.size() == 2);
  for (size_t t = 0; t < 2; ++t) {
    CHECK(merged[t].first == saved[t].first);
    REQUIRE(merged[t].second.size() == saved[t].second.size());
    for (size_t i = 0; i < saved[t].second.size(); ++i)
      CHECK(merged[t].second[i] == Approx(saved[t].second[i]).margin(1e-5));
  }
  std::string p2 = dir + "/p2.safetensors";
  run(pp, 2, {"--steps", "0", "--load", p, "--save", p2});
  CHECK(readFile(p2) == readFile(p));
  std::string s2 = dir + "/s2.safetensors";
  run(single, 1, {"--steps", "0", "--load", p, "--save", s2});
  CHECK(readFile(s2) == readFile(p));

  // Data parallel: replica 0 writes the one file.
  std::string d = dir + "/d.safetensors";
  run(dp, 2, {"--steps", "2", "--save", d});
  auto fromDp = readCheckpoint(d);
  REQUIRE(fromDp.size() == 2);
  for (size_t i = 0; i < saved[0].second.size(); ++i)
    CHECK(fromDp[0].second[i] == Approx(saved[0].second[i]).margin(1e-5));
}

TEST_CASE("piper-run --load rejects checkpoints that do not fit",
          "[launcher][checkpoint]") {
  TinyModel m;
  std::string pp = strategy(pipelinePlans(m, 2), "loaderr");
  std::string dir = tempDir("loaderr");
  std::vector<float> wte(16 * 8, 0.1f), head(8 * 16, 0.2f), extra(3, 0.0f);
  auto load = [&](const std::string &path) {
    RunResult r = piperRun({pp, "--nproc", "2", "--load", path});
    CHECK(r.exitCode() == 1);
    return r.err;
  };

  SECTION("missing file") {
    CHECK(load(dir + "/nope") ==
          "piper-run: checkpoint '" + dir +
              "/nope': cannot open: no such file or directory\n");
  }
  SECTION("a missing parameter, a wrong shape and an extra tensor") {
    std::string path = dir + "/bad.safetensors";
    REQUIRE(runtime::writeSafetensors(path,
                                      {{"wte", "F32", {8, 16}, wte.data()},
                                       {"lm_head", "F32", {3}, extra.data()}},
                                      {}));
    CHECK(load(path) ==
          "piper-run: checkpoint '" + path +
              "' does not match the model: missing parameters: head; tensor "
              "'wte' has shape [8, 16], but the model's parameter has [16, "
              "8]; tensors that are not parameters of the model: lm_head\n");
  }
  SECTION("a truncated file") {
    std::string path = dir + "/cut.safetensors";
    REQUIRE(runtime::writeSafetensors(path,
                                      {{"wte", "F32", {16, 8}, wte.data()},
                                       {"head", "F32", {8, 16}, head.data()}},
                                      {}));
    std::string bytes = readFile(path);
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        << bytes.substr(0, bytes.size() - 10);
    std::string err = load(path);
    CHECK(err.find("tensor 'head': \"data_offsets\" [512, 1024] run past "
                   "the end of the data") != std::string::npos);
  }
  SECTION("not a safetensors file") {
    std::string path = dir + "/junk";
    std::ofstream(path, std::ios::binary) << "this is not a checkpoint";
    std::string err = load(path);
    CHECK(err.find("the header length") != std::string::npos);
  }
}
