// In-process tests of token-file data (deterministic windows, range, errors,
// context-parallel shards,
// training on real bytes) and of executor checkpoints (save/load round trip,
// mismatches named, bf16 copies renewed by the update or after a load).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "runtime/data/ByteTokenizer.h"
#include "runtime/exec/Data.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/test_plans.h"
#include "runtime/formats/Safetensors.h"
#include "runtime/hal/gpu/host/EmulatedDevice.h"

using namespace piper;
using namespace piper::runtime;
using namespace piper::runtime::testplans;

namespace {

std::string tempDir() {
  const char *base = std::getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/dc-XXXXXX";
  REQUIRE(::mkdtemp(tmpl.data()));
  return tmpl;
}

std::string readBytes(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// A token file of `n` tokens where token i is i % `modulo`.
std::string rampFile(const std::string &dir, int64_t n, uint32_t modulo,
                     TokenDType dtype = TokenDType::U16) {
  std::vector<uint32_t> tokens(n);
  for (int64_t i = 0; i < n; ++i)
    tokens[i] = static_cast<uint32_t>(i % modulo);
  std::string path = dir + "/ramp-" + std::to_string(n) + ".bin";
  REQUIRE(writeTokenFile(path, tokens, dtype, false));
  return path;
}

std::unique_ptr<TokenFileData> openData(const std::string &path, int64_t vocab,
                                        int64_t seqLen, uint64_t seed) {
  auto data = openTokenFileData(path, TokenDType::Auto, vocab, seqLen, seed);
  INFO(data.status().message());
  REQUIRE(data);
  return std::move(data).value();
}

std::unique_ptr<Executor> makeExecutor(const plan::Plan &plan, uint64_t seed,
                                       DataSource *data = nullptr,
                                       bool emulatedGpu = false) {
  ExecutorOptions opts;
  opts.seed = seed;
  opts.rank = plan.ranks(0);
  opts.data = data;
  if (emulatedGpu)
    opts.createDevice = [](Communicator *comm) {
      return hal::createEmulatedGpuDevice(comm);
    };
  Status status;
  auto exec = Executor::create(plan, opts, status);
  INFO(status.message());
  REQUIRE(exec);
  REQUIRE(exec->connect());
  return exec;
}

std::vector<float> paramValues(const Executor &exec, int index) {
  TensorRef t = exec.state(index, plan::Operand::PARAM);
  return std::vector<float>(t.f32(), t.f32() + t.numel());
}

} // namespace

TEST_CASE("token data: windows are deterministic, in range, shifted by one",
          "[data]") {
  std::string dir = tempDir();
  const int64_t n = 1000, seq = 16, batch = 4;
  // Token i is i (mod 50000): a window's first token tells its start.
  std::string path = rampFile(dir, n, 50000);
  auto data = openData(path, 50000, seq, 7);
  auto again = openData(path, 50000, seq, 7);
  auto otherSeed = openData(path, 50000, seq, 8);

  std::vector<int32_t> tok(batch * seq), tgt(batch * seq), tok2(batch * seq),
      tgt2(batch * seq);
  bool anySeedDiffers = false;
  for (int64_t step = 1; step <= 5; ++step) {
    for (int64_t g = 0; g < 4; ++g) {
      REQUIRE(data->fill(step, g, batch, seq, tok.data(), tgt.data()));
      REQUIRE(again->fill(step, g, batch, seq, tok2.data(), tgt2.data()));
      CHECK(tok == tok2);
      CHECK(tgt == tgt2);
      for (int64_t j = 0; j < batch; ++j) {
        int64_t start = tokenWindowStart(7, step, g, j, n, seq);
        CHECK(start >= 0);
        CHECK(start <= n - seq - 1);
        for (int64_t i = 0; i < seq; ++i) {
          CHECK(tok[j * seq + i] == start + i);
          CHECK(tgt[j * seq + i] == start + i + 1);
        }
      }
      REQUIRE(otherSeed->fill(step, g, batch, seq, tok2.data(), tgt2.data()));
      anySeedDiffers |= tok != tok2;
    }
  }
  CHECK(anySeedDiffers);
  // A later call gives the same batch again: no hidden cursor.
  REQUIRE(data->fill(3, 2, batch, seq, tok.data(), tgt.data()));
  REQUIRE(again->fill(3, 2, batch, seq, tok2.data(), tgt2.data()));
  CHECK(tok == tok2);
}

TEST_CASE("context shards: each member holds chunks m and 2N-1-m, the "
          "members together every token once",
          "[data]") {
  SyntheticData data(3, 1000);
  const int64_t batch = 3;
  for (int64_t members : {1, 2, 3, 4})
    for (int64_t seq : {2 * members, 8 * members}) {
      std::vector<int32_t> tok(batch * seq), tgt(batch * seq);
      REQUIRE(data.fill(2, 5, batch, seq, tok.data(), tgt.data()));
      const int64_t local = seq / members, chunk = seq / (2 * members);
      std::vector<int> seen(batch * seq, 0);
      for (int64_t m = 0; m < members; ++m) {
        std::vector<int32_t> t(batch * local), g(batch * local);
        REQUIRE(fillContextShard(data, 2, 5, batch, seq, members, m, t.data(),
                                 g.data()));
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t i = 0; i < local; ++i) {
            // Written out independently of contextPosition.
            int64_t pos = members == 1 ? i
                          : i < chunk
                              ? m * chunk + i
                              : (2 * members - 1 - m) * chunk + (i - chunk);
            CHECK(t[b * local + i] == tok[b * seq + pos]);
            CHECK(g[b * local + i] == tgt[b * seq + pos]);
            ++seen[b * seq + pos];
          }
      }
      CHECK(std::count(seen.begin(), seen.end(), 1) == batch * seq);
    }
  std::vector<int32_t> t(8), g(8);
  Status bad = fillContextShard(data, 1, 0, 1, 12, 4, 0, t.data(), g.data());
  REQUIRE_FALSE(bad);
  CHECK(bad.message() == "context member 0 of 4 cannot split sequences of 12 "
                         "tokens");
}

TEST_CASE("token data: window starts cover [0, N - S - 1] uniformly",
          "[data]") {
  const int64_t seq = 8;
  // Exactly one window fits.
  for (int64_t g = 0; g < 50; ++g)
    CHECK(tokenWindowStart(1, 1, g, 0, seq + 1, seq) == 0);
  // Three starts: 0, 1 and 2, each about a third of the time.
  std::vector<int> counts(3, 0);
  for (int64_t t = 1; t <= 3000; ++t) {
    int64_t s = tokenWindowStart(5, t, 0, 0, seq + 3, seq);
    REQUIRE(s >= 0);
    REQUIRE(s <= 2);
    ++counts[s];
  }
  for (int c : counts) {
    CHECK(c > 850);
    CHECK(c < 1150);
  }
  // The largest file sizes do not overflow.
  int64_t big = int64_t(1) << 62;
  for (int64_t j = 0; j < 100; ++j) {
    int64_t s = tokenWindowStart(3, 1, 0, j, big, 1024);
    CHECK(s >= 0);
    CHECK(s <= big - 1025);
  }
}

TEST_CASE("token data: open errors", "[data]") {
  std::string dir = tempDir();
  Status st;
  SECTION("too short for one sequence and its targets") {
    std::string path = rampFile(dir, 16, 10);
    CHECK(openTokenFileData(path, TokenDType::Auto, 10, 15, 0));
    st = openTokenFileData(path, TokenDType::Auto, 10, 16, 0).status();
    CHECK_FALSE(st);
    CHECK(st.message() == "token file '" + path +
                              "': too short: 16 tokens, but one sequence of "
                              "16 tokens and its targets need 17");
  }
  SECTION("a token outside the vocabulary") {
    std::string path = rampFile(dir, 100, 40, TokenDType::U32);
    st = openTokenFileData(path, TokenDType::U32, 32, 8, 0).status();
    CHECK_FALSE(st);
    CHECK(st.message() == "token file '" + path +
                              "': the token at index 32 is 32, not below the "
                              "model's vocab_size 32");
  }
  SECTION("missing file") {
    st = openTokenFileData(dir + "/nope.bin", TokenDType::Auto, 10, 4, 0)
             .status();
    CHECK_FALSE(st);
    CHECK(st.message() == "token file '" + dir +
                              "/nope.bin': cannot open: no such file or "
                              "directory");
  }
  SECTION("a plan whose sequences outgrow the file fails the step") {
    std::string path = rampFile(dir, 10, 10);
    auto data = openData(path, 10, 4, 0);
    std::vector<int32_t> tok(12), tgt(12);
    Status fill = data->fill(1, 0, 1, 12, tok.data(), tgt.data());
    CHECK_FALSE(fill);
    CHECK(fill.message().find("10 tokens are too few for a sequence of 12") !=
          std::string::npos);
  }
}

TEST_CASE("training on real bytes makes the loss fall", "[data][train]") {
  std::string dir = tempDir();
  std::string text = dir + "/text.txt";
  // A real English text where the system has one; else a stand-in.
  std::string source = readBytes("/usr/share/common-licenses/GPL-3");
  if (source.size() < 10000) {
    std::string para = "The licenses for most software and other practical "
                       "works are designed to take away your freedom to share "
                       "and change the works. By contrast, the GNU General "
                       "Public License is intended to guarantee your freedom "
                       "to share and change all versions of a program.\n";
    source.clear();
    while (source.size() < 20000)
      source += para;
  }
  std::ofstream(text, std::ios::binary) << source;
  int64_t count = 0;
  REQUIRE(
      tokenizeBytesFile(text, dir + "/text.bin", TokenDType::U16, true, count));
  REQUIRE(count == static_cast<int64_t>(source.size()));

  TinyModel m;
  m.vocab = static_cast<int>(kByteVocabSize);
  m.hidden = 32;
  m.batch = 8;
  m.seqLen = 32;
  m.lr = 0.03;
  m.normalHead = false; // zero head: the first loss is exactly ln(256)
  plan::Plan plan = singleClassPlan(m, 2, {0}, 1);
  auto data = openData(dir + "/text.bin", m.vocab, m.seqLen, 3);
  auto exec = makeExecutor(plan, 3, data.get());
  std::vector<double> losses;
  for (int step = 1; step <= 60; ++step) {
    double loss = 0;
    REQUIRE(exec->runStep(step, loss));
    losses.push_back(loss);
  }
  CHECK(losses[0] == Approx(std::log(256.0)).epsilon(1e-6));
  double last = 0;
  for (int i = 55; i < 60; ++i)
    last += losses[i] / 5;
  INFO("first loss " << losses[0] << ", mean of the last 5 " << last);
  // A byte bigram model of English ends near 2.5 nats; 60 small steps get
  // well on the way.
  CHECK(last < losses[0] - 1.0);
}

TEST_CASE("executor checkpoints: load restores exactly what was saved",
          "[checkpoint]") {
  std::string dir = tempDir();
  TinyModel m;
  plan::Plan plan = singleClassPlan(m, 2, {0}, 1);
  // Both executors read the same data; only their initialization differs.
  SyntheticData data(1, m.vocab);
  auto trained = makeExecutor(plan, 1, &data);
  for (int step = 1; step <= 2; ++step) {
    double loss;
    REQUIRE(trained->runStep(step, loss));
  }
  std::string a = dir + "/a.safetensors";
  REQUIRE(trained->saveCheckpoint(a, 2));

  Status st;
  auto reader = SafetensorsReader::open(a, st);
  REQUIRE(reader);
  REQUIRE(reader->tensors().size() == 2);
  CHECK(reader->tensors()[0].name == "wte");
  CHECK(reader->tensors()[0].shape == std::vector<int64_t>{16, 8});
  CHECK(reader->tensors()[1].name == "head");
  CHECK(*reader->metadataValue("step") == "2");

  // Another seed initializes differently; loading replaces all of it.
  auto fresh = makeExecutor(plan, 99, &data);
  CHECK(paramValues(*fresh, 0) != paramValues(*trained, 0));
  REQUIRE(fresh->loadCheckpoint(*reader));
  for (int p = 0; p < 2; ++p)
    CHECK(paramValues(*fresh, p) == paramValues(*trained, p));
  std::string b = dir + "/b.safetensors";
  REQUIRE(fresh->saveCheckpoint(b, 2));
  CHECK(readBytes(b) == readBytes(a));

  // The next step's loss is computed with the loaded parameters: it equals
  // the trained executor's (the forward pass precedes the update). Later
  // steps differ: AdamW moments are not in the checkpoint.
  double l1 = 0, l2 = 0;
  REQUIRE(trained->runStep(3, l1));
  REQUIRE(fresh->runStep(3, l2));
  CHECK(l1 == l2);

  // Tensors that are not parameters of this plan (another class's) are
  // ignored by the executor; piper-run rejects those no class holds.
  std::vector<float> other(3, 4.0f);
  std::vector<float> wte = paramValues(*fresh, 0),
                     head = paramValues(*fresh, 1);
  std::string c = dir + "/c.safetensors";
  REQUIRE(writeSafetensors(c,
                           {{"other.stage", "F32", {3}, other.data()},
                            {"head", "F32", {8, 16}, head.data()},
                            {"wte", "F32", {16, 8}, wte.data()}},
                           {}));
  auto third = makeExecutor(plan, 5, &data);
  auto readerC = SafetensorsReader::open(c, st);
  REQUIRE(readerC);
  REQUIRE(third->loadCheckpoint(*readerC));
  CHECK(paramValues(*third, 0) == wte);
  CHECK(paramValues(*third, 1) == head);
}

// Mixed precision: the `adamw` that updates a whole parameter also writes
// the parameter's bf16 copy, which the next step reads as it is (no refresh
// pass). Loading a checkpoint makes every copy be refreshed from the master
// when next read, so a run that reloads its own parameters before each step
// reads refreshed copies: its losses and parameters must be those of the
// run reading the update's copies, bit for bit. And a checkpoint of other
// values loaded between steps is what the next step reads. On the CPU and
// on the emulated GPU.
TEST_CASE("executor checkpoints: in mixed precision the update's bf16 copies "
          "are the refreshed ones",
          "[checkpoint]") {
  std::string dir = tempDir();
  TinyModel m;
  plan::Plan plan = singleClassPlan(m, 2, {0}, 1);
  plan.mutable_training()->set_compute_dtype(plan::BF16);
  withArena(plan); // the bf16 copies' places
  for (bool gpu : {false, true}) {
    INFO((gpu ? "emulated GPU" : "CPU"));
    SyntheticData data(1, m.vocab);
    auto params = [](const Executor &exec) {
      std::vector<std::vector<float>> all(2);
      for (int p = 0; p < 2; ++p)
        REQUIRE(exec.stateToHost(p, plan::Operand::PARAM, all[p]));
      return all;
    };
    const std::string saved = dir + "/own.safetensors";
    auto reload = [&](Executor &exec, int64_t step) {
      REQUIRE(exec.saveCheckpoint(saved, step));
      Status st;
      auto reader = SafetensorsReader::open(saved, st);
      REQUIRE(reader);
      REQUIRE(exec.loadCheckpoint(*reader));
    };
    auto updated = makeExecutor(plan, 1, &data, gpu),
         refreshed = makeExecutor(plan, 1, &data, gpu);
    for (int64_t step = 1; step <= 4; ++step) {
      INFO("step " << step);
      if (step > 1)
        reload(*refreshed, step - 1);
      double a = 0, b = 0;
      REQUIRE(updated->runStep(step, a));
      REQUIRE(refreshed->runStep(step, b));
      CHECK(a == b);
      CHECK(params(*updated) == params(*refreshed));
    }

    // Other parameters loaded after a step: the next step's forward reads
    // them, as a fresh executor holding them does.
    auto other = makeExecutor(plan, 7, &data, gpu);
    const std::string init = dir + "/init.safetensors";
    REQUIRE(other->saveCheckpoint(init, 0));
    Status st;
    auto reader = SafetensorsReader::open(init, st);
    REQUIRE(reader);
    double first = 0, loaded = 0, fresh = 0;
    REQUIRE(updated->runStep(5, first));
    REQUIRE(updated->loadCheckpoint(*reader));
    REQUIRE(updated->runStep(6, loaded));
    REQUIRE(other->runStep(6, fresh));
    CHECK(loaded == fresh);
  }
}

TEST_CASE("executor checkpoints: mismatches are named", "[checkpoint]") {
  std::string dir = tempDir();
  TinyModel m;
  plan::Plan plan = singleClassPlan(m, 1, {0}, 1);
  auto exec = makeExecutor(plan, 1);
  std::vector<float> data(16 * 9, 0.0f);
  std::string path = dir + "/bad.safetensors";
  REQUIRE(writeSafetensors(path, {{"wte", "F32", {16, 9}, data.data()}}, {}));
  Status st;
  auto reader = SafetensorsReader::open(path, st);
  REQUIRE(reader);
  Status bad = exec->loadCheckpoint(*reader);
  CHECK(bad.message() ==
        "rank 0: checkpoint '" + path +
            "' does not match the model: missing parameters: head; tensor "
            "'wte' has shape [16, 9], but the model's parameter has [16, 8]");
}
