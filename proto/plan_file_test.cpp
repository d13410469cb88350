// Tests of the plan file envelope and the manifest: round trips and every
// way a file on disk can be wrong.
#include "proto/PlanFile.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>

using namespace piper::plan;

namespace {

std::string tempPath(const std::string &name) {
  const char *dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
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
}

Plan samplePlan() {
  Plan plan;
  plan.set_device_class(1);
  plan.add_ranks(1);
  plan.add_ranks(3);
  plan.set_world_size(4);
  plan.set_model_name("gpt-tiny");
  plan.set_num_events(2);
  Parameter *p = plan.add_params();
  p->set_name("wte");
  p->mutable_type()->set_dtype(F32);
  p->mutable_type()->add_shape(16);
  p->mutable_type()->add_shape(8);
  p->mutable_init()->set_kind(Initializer::NORMAL);
  p->mutable_init()->set_scale(0.02);
  Stream *s = plan.add_streams();
  s->set_name("compute");
  Instruction *inst = s->add_instructions();
  inst->set_kind(Instruction::LOAD_BATCH);
  inst->set_label("load MB=0");
  plan.mutable_training()->set_vocab_size(16);
  return plan;
}

} // namespace

TEST_CASE("crc32 matches the IEEE check value", "[plan_file]") {
  // The standard check value of CRC-32/ISO-HDLC (zlib's crc32).
  CHECK(crc32("123456789", 9) == 0xCBF43926u);
  CHECK(crc32("", 0) == 0u);
}

TEST_CASE("plan file round trip", "[plan_file]") {
  std::string path = tempPath("roundtrip.plan");
  Plan plan = samplePlan();
  REQUIRE(writePlanFile(path, plan) == "");

  std::string bytes = readBytes(path);
  REQUIRE(bytes.size() > kPlanHeaderSize);
  CHECK(bytes.substr(0, 8) == "PIPRPLAN");
  CHECK(static_cast<unsigned char>(bytes[8]) == kPlanSchemaVersion);

  Plan back;
  REQUIRE(readPlanFile(path, back) == "");
  // The writer stamps the current version into an unversioned plan.
  CHECK(back.schema_version() == kPlanSchemaVersion);
  plan.set_schema_version(kPlanSchemaVersion);
  CHECK(back.SerializeAsString() == plan.SerializeAsString());
}

TEST_CASE("plan file rejects a plan of another version", "[plan_file]") {
  Plan plan = samplePlan();
  plan.set_schema_version(7);
  std::string err = writePlanFile(tempPath("v7w.plan"), plan);
  CHECK(err.find("schema version 7") != std::string::npos);
}

TEST_CASE("plan file errors", "[plan_file]") {
  std::string path = tempPath("broken.plan");
  REQUIRE(writePlanFile(path, samplePlan()) == "");
  std::string good = readBytes(path);
  Plan out;

  SECTION("missing file") {
    std::string missing = tempPath("no-such.plan");
    std::string err = readPlanFile(missing, out);
    CHECK(err.find(missing) != std::string::npos);
    CHECK(err.find("no such file or directory") != std::string::npos);
  }
  SECTION("truncated payload") {
    writeBytes(path, good.substr(0, good.size() - 5));
    std::string err = readPlanFile(path, out);
    size_t payload = good.size() - kPlanHeaderSize;
    CHECK(err == "plan file '" + path + "': truncated: expected " +
                     std::to_string(payload) + " payload bytes, found " +
                     std::to_string(payload - 5));
  }
  SECTION("truncated header") {
    writeBytes(path, good.substr(0, 12));
    CHECK(readPlanFile(path, out).find("truncated") != std::string::npos);
  }
  SECTION("empty file") {
    writeBytes(path, "");
    CHECK(readPlanFile(path, out).find("truncated") != std::string::npos);
  }
  SECTION("one corrupted payload byte") {
    std::string bad = good;
    bad[kPlanHeaderSize + (bad.size() - kPlanHeaderSize) / 2] ^= 0x10;
    writeBytes(path, bad);
    CHECK(readPlanFile(path, out) ==
          "plan file '" + path + "': corrupted: checksum mismatch");
  }
  SECTION("trailing garbage") {
    writeBytes(path, good + "xx");
    CHECK(readPlanFile(path, out).find("corrupted") != std::string::npos);
  }
  SECTION("other schema version") {
    std::string bad = good;
    bad[8] = 7;
    writeBytes(path, bad);
    CHECK(readPlanFile(path, out) ==
          "plan file '" + path +
              "': plan schema version 7 is not supported (this runtime reads "
              "version 2); recompile the strategy with a matching piperc");
  }
  SECTION("bad magic") {
    std::string bad = good;
    bad[0] = 'X';
    writeBytes(path, bad);
    CHECK(readPlanFile(path, out) ==
          "plan file '" + path + "': not a piper plan file");
    writeBytes(path, "hello, world: this is text, not a plan at all");
    CHECK(readPlanFile(path, out).find("not a piper plan file") !=
          std::string::npos);
  }
  SECTION("unparsable payload with a valid checksum") {
    std::string payload = "\xff\xff\xff\xff";
    std::string bad = good.substr(0, kPlanHeaderSize);
    bad[12] = 4;
    for (int i = 13; i < 20; ++i)
      bad[i] = 0;
    uint32_t c = crc32(payload.data(), payload.size());
    for (int i = 0; i < 4; ++i)
      bad[20 + i] = static_cast<char>(c >> (8 * i));
    writeBytes(path, bad + payload);
    CHECK(readPlanFile(path, out).find("not a valid plan") !=
          std::string::npos);
  }
}

TEST_CASE("parsePlanFile and parseManifest read bytes as the files do",
          "[plan_file]") {
  std::string path = tempPath("bytes.plan");
  REQUIRE(writePlanFile(path, samplePlan()) == "");
  std::string bytes = readBytes(path);
  Plan fromFile, fromBytes;
  REQUIRE(readPlanFile(path, fromFile) == "");
  REQUIRE(parsePlanFile(path, bytes, fromBytes) == "");
  CHECK(fromBytes.SerializeAsString() == fromFile.SerializeAsString());
  writeBytes(path, bytes.substr(0, 30));
  CHECK(parsePlanFile(path, bytes.substr(0, 30), fromBytes) ==
        readPlanFile(path, fromFile));

  Manifest m;
  CHECK(parseManifest("m.textproto", "schema_version: 2\nworld_size: 3\n", m) ==
        "");
  CHECK(m.world_size() == 3);
  CHECK(parseManifest("m.textproto", "world_size: 3\n", m) ==
        "manifest 'm.textproto': missing schema_version");
}

TEST_CASE("plan file rejects an event count over the limit", "[plan_file]") {
  // Found by the plan fuzzer (test/fuzz/crashes/plan/): 68 bytes declaring
  // 161,480,157 events made plan validation allocate 1.3 GB and time out.
  std::string path = tempPath("events.plan");
  Plan plan = samplePlan();
  plan.set_num_events(161480157);
  REQUIRE(writePlanFile(path, plan) == "");
  Plan out;
  CHECK(readPlanFile(path, out) ==
        "plan file '" + path +
            "': corrupted: num_events 161480157 is over the limit of 16777216");
  plan.set_num_events(kMaxPlanEvents);
  REQUIRE(writePlanFile(path, plan) == "");
  CHECK(readPlanFile(path, out) == "");
}

TEST_CASE("manifest round trip", "[plan_file]") {
  std::string path = tempPath("manifest.textproto");
  Manifest m;
  m.set_world_size(4);
  m.set_model_name("gpt-tiny");
  m.set_strategy("pp=2 dp=2 1f1b mb=4");
  for (int c = 0; c < 2; ++c) {
    Manifest::Class *cls = m.add_classes();
    cls->set_device_class(c);
    cls->add_ranks(c);
    cls->add_ranks(c + 2);
    cls->set_plan_file("class" + std::to_string(c) + ".plan");
  }
  m.mutable_training()->set_num_microbatches(4);
  m.mutable_training()->set_lr(1e-3);
  REQUIRE(writeManifest(path, m) == "");

  Manifest back;
  REQUIRE(readManifest(path, back) == "");
  m.set_schema_version(kPlanSchemaVersion);
  CHECK(back.SerializeAsString() == m.SerializeAsString());
}

TEST_CASE("manifest errors", "[plan_file]") {
  std::string path = tempPath("bad-manifest.textproto");
  Manifest out;

  SECTION("missing file") {
    CHECK(readManifest(tempPath("nope.textproto"), out).find("cannot open") !=
          std::string::npos);
  }
  SECTION("syntax error") {
    writeBytes(path, "schema_version: 1\nworld_size: four\n");
    std::string err = readManifest(path, out);
    CHECK(err.find(path) != std::string::npos);
    CHECK(err.find("line 2") != std::string::npos);
  }
  SECTION("unknown field") {
    writeBytes(path, "schema_version: 1\nworld_sise: 4\n");
    CHECK(readManifest(path, out).find("world_sise") != std::string::npos);
  }
  SECTION("no version") {
    writeBytes(path, "world_size: 4\n");
    CHECK(readManifest(path, out).find("missing schema_version") !=
          std::string::npos);
  }
  SECTION("other version") {
    writeBytes(path, "schema_version: 9\nworld_size: 4\n");
    CHECK(readManifest(path, out).find("manifest schema version 9 is not "
                                       "supported") != std::string::npos);
  }
  SECTION("world size over the limit") {
    // Run through the manifest fuzz target (test/fuzz/crashes/manifest/): the
    // strategy check allocated 16 GB, one entry per rank of the world.
    writeBytes(path, "schema_version: 2\nworld_size: 2000000000\n"
                     "classes { ranks: 0 plan_file: \"a.pb\" }\n");
    CHECK(readManifest(path, out) ==
          "manifest '" + path +
              "': world_size 2000000000 is over the limit of 1048576 devices");
    writeBytes(path, "schema_version: 2\nworld_size: 1048576\n");
    CHECK(readManifest(path, out) == "");
  }
}
