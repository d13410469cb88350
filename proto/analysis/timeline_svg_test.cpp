// Unit tests of the timeline pictures: the SVG is well-formed XML with one
// row per device class, one lane per stream with work and one box per CALL,
// coloured by pass and labelled by microbatch; the trace JSON's metadata.
#include <catch2/catch.hpp>

#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "proto/analysis/TimelineSvg.h"

using namespace piper::plan;
using Catch::Matchers::Contains;

namespace {

/// Checks that `xml` is well-formed as far as SVG output needs: one root
/// element, every tag closed in order, quoted attributes, escaped text.
/// Returns "" or what is wrong.
std::string xmlProblem(const std::string &xml) {
  std::vector<std::string> open;
  int roots = 0;
  size_t i = 0;
  auto isName = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
           c == '_' || c == ':';
  };
  while (i < xml.size()) {
    if (xml[i] == '&') {
      size_t semi = xml.find(';', i);
      std::string entity = xml.substr(i, semi == std::string::npos
                                             ? 1
                                             : semi - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" &&
          entity != "&quot;" && entity != "&apos;")
        return "bad entity at " + std::to_string(i);
      i = semi + 1;
      continue;
    }
    if (xml[i] != '<') {
      if (xml[i] == '>')
        return "stray '>' at " + std::to_string(i);
      if (open.empty() && !std::isspace(static_cast<unsigned char>(xml[i])))
        return "text outside the root at " + std::to_string(i);
      ++i;
      continue;
    }
    if (xml.compare(i, 5, "<?xml") == 0) {
      if (i != 0)
        return "declaration not first";
      i = xml.find("?>", i);
      if (i == std::string::npos)
        return "unclosed declaration";
      i += 2;
      continue;
    }
    bool closing = xml[i + 1] == '/';
    size_t j = i + (closing ? 2 : 1);
    size_t nameStart = j;
    while (j < xml.size() && isName(xml[j]))
      ++j;
    std::string name = xml.substr(nameStart, j - nameStart);
    if (name.empty())
      return "tag without a name at " + std::to_string(i);
    if (closing) {
      if (open.empty() || open.back() != name)
        return "</" + name + "> closes nothing open";
      open.pop_back();
      if (xml[j] != '>')
        return "malformed closing tag " + name;
      i = j + 1;
      continue;
    }
    // Attributes: name="value" with no '<' or '"' inside.
    while (true) {
      while (j < xml.size() && std::isspace(static_cast<unsigned char>(xml[j])))
        ++j;
      if (j >= xml.size())
        return "unterminated tag " + name;
      if (xml[j] == '>' || xml.compare(j, 2, "/>") == 0)
        break;
      size_t a = j;
      while (j < xml.size() && isName(xml[j]))
        ++j;
      if (j == a || xml.compare(j, 2, "=\"") != 0)
        return "malformed attribute in " + name;
      size_t end = xml.find('"', j + 2);
      if (end == std::string::npos ||
          xml.substr(j + 2, end - j - 2).find('<') != std::string::npos)
        return "unterminated attribute in " + name;
      j = end + 1;
    }
    bool selfClosing = xml[j] == '/';
    if (open.empty() && ++roots > 1)
      return "a second root element " + name;
    if (!selfClosing)
      open.push_back(name);
    i = j + (selfClosing ? 2 : 1);
  }
  if (!open.empty())
    return "<" + open.back() + "> never closed";
  return roots == 1 ? "" : "no root element";
}

size_t count(const std::string &text, const std::string &what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos;
       at = text.find(what, at + 1))
    ++n;
  return n;
}

Plan stagePlan(int s, int p) {
  Plan plan;
  plan.set_device_class(s);
  plan.add_ranks(s);
  plan.set_world_size(p);
  plan.set_num_events(2);
  for (const char *pass : {"F", "BI", "BW", "U"}) {
    Segment *seg = plan.add_segments();
    seg->set_name("stage" + std::to_string(s) + "_" + pass);
  }
  plan.add_streams()->set_name("compute");
  plan.add_streams()->set_name("pp_stream");
  Buffer *b = plan.add_buffers();
  b->set_id(0);
  b->mutable_type()->set_dtype(F32);
  b->mutable_type()->add_shape(16);
  DeviceGroup *peer = plan.add_groups();
  peer->set_id(0);
  peer->add_ranks(1 - s);
  return plan;
}

Instruction *add(Plan &plan, int stream, Instruction::Kind kind,
                 const std::string &label) {
  Instruction *i = plan.mutable_streams(stream)->add_instructions();
  i->set_kind(kind);
  i->set_label(label);
  if (kind == Instruction::SEND || kind == Instruction::RECV)
    i->set_peer_group(0); // the other stage
  return i;
}

/// Two stages, two microbatches, GPipe-like: stage 0 runs F of both, sends
/// them on pp_stream, then the split backward and the update; stage 1 the
/// same after receiving. Every CALL names its microbatch but the update.
std::vector<Plan> twoStages() {
  std::vector<Plan> plans;
  for (int s = 0; s < 2; ++s) {
    Plan plan = stagePlan(s, 2);
    std::string tag = " (PP=" + std::to_string(s) + " MB=";
    for (int mb = 0; mb < 2; ++mb) {
      if (s == 1) {
        Instruction *r =
            add(plan, 1, Instruction::RECV, "recv channel " + std::to_string(mb));
        r->set_tag(mb);
        r->add_outputs(0);
        Instruction *rec = add(plan, 1, Instruction::RECORD, "after recv");
        rec->set_event(mb);
        add(plan, 0, Instruction::WAIT, "wait")->set_event(mb);
      }
      add(plan, 0, Instruction::CALL, "task @F" + tag + std::to_string(mb) + ")")
          ->set_segment(0);
      if (s == 0) {
        Instruction *rec = add(plan, 0, Instruction::RECORD, "after F");
        rec->set_event(mb);
        add(plan, 1, Instruction::WAIT, "wait")->set_event(mb);
        Instruction *send =
            add(plan, 1, Instruction::SEND, "send channel " + std::to_string(mb));
        send->set_tag(mb);
        send->add_inputs(0);
      }
    }
    for (int mb = 0; mb < 2; ++mb) {
      add(plan, 0, Instruction::CALL, "task @BI" + tag + std::to_string(mb) + ")")
          ->set_segment(1);
      add(plan, 0, Instruction::CALL, "task @BW" + tag + std::to_string(mb) + ")")
          ->set_segment(2);
    }
    add(plan, 0, Instruction::CALL, "task @U (PP=" + std::to_string(s) + ")")
        ->set_segment(3);
    plans.push_back(plan);
  }
  return plans;
}

Simulation simulateFixed(const std::vector<Plan> &plans) {
  Machine free;
  free.linkBytesPerSecond = 0;
  free.linkLatencySeconds = 0;
  SimulateOptions o;
  o.overrides = {{"F", 1}, {"BI", 1}, {"BW", 0.5}, {"U", 0.25},
                 {"send", 0.1}, {"recv", 0.1}};
  Simulation sim;
  std::string error;
  bool ok = simulate(plans, free, o, sim, error);
  INFO(error);
  REQUIRE(ok);
  return sim;
}

} // namespace

TEST_CASE("the microbatch is read from MB= in a label") {
  CHECK(labelMicrobatch("task @stage0_F (PP=0 MB=12 PASS=F)") == 12);
  CHECK(labelMicrobatch("batch (MB=3)") == 3);
  CHECK(labelMicrobatch("recv channel 4") == -1);
  CHECK(labelMicrobatch("NUMB=3") == -1);
  CHECK(labelMicrobatch("MB=") == -1);
}

TEST_CASE("the SVG is well-formed: a row per class, a lane per stream with "
          "work, a box per CALL") {
  std::vector<Plan> plans = twoStages();
  Simulation sim = simulateFixed(plans);
  std::string svg = timelineSvg(sim, plans);
  INFO(svg);
  CHECK(xmlProblem(svg) == "");
  CHECK(svg.rfind("<?xml", 0) == 0);
  CHECK_THAT(svg, Contains("<svg xmlns=\"http://www.w3.org/2000/svg\""));

  size_t calls = 0, comms = 0;
  for (const ClassTime &ct : sim.classes)
    for (const TimelineEntry &e : ct.timeline) {
      calls += e.kind == Instruction::CALL;
      comms += e.kind == Instruction::SEND || e.kind == Instruction::RECV;
    }
  CHECK(calls == 14);
  CHECK(count(svg, "<rect class=\"box call\"") == calls);
  CHECK(count(svg, "<rect class=\"box comm\"") == comms);
  CHECK(count(svg, "<g class=\"device-class\"") == 2);
  CHECK_THAT(svg, Contains(">class 0: ranks [0]</text>"));
  CHECK_THAT(svg, Contains(">class 1: ranks [1]</text>"));
  // Both classes use both streams: four lanes.
  CHECK(count(svg, "<g class=\"lane\">") == 4);
  CHECK(count(svg, ">pp_stream</text>") == 2);
  // Colours by pass; the legend names the passes present.
  CHECK(count(svg, "fill=\"#7fb3f5\"") == 4 + 1); // F boxes and the legend
  CHECK(count(svg, "fill=\"#f4845f\"") == 4 + 1); // BI
  CHECK(count(svg, "fill=\"#c39bd3\"") == 4 + 1); // BW
  CHECK_THAT(svg, Contains(">BW backward, weight gradient</text>"));
  CHECK_THAT(svg, Contains(">communication</text>"));
  CHECK_THAT(svg, !Contains(">B backward</text>"));
  // Microbatch labels: every CALL but the two updates is wide enough.
  CHECK(count(svg, "<text class=\"mb\"") == calls - 2);
  // Tooltips carry the label and the times.
  CHECK_THAT(svg, Contains("<title>task @F (PP=0 MB=0): 0 s .. 1 s</title>"));
  // The axis reaches the step's end.
  CHECK_THAT(svg, Contains("predicted step 6.35 s"));
}

TEST_CASE("labels are escaped in the SVG") {
  std::vector<Plan> plans = twoStages();
  plans[0].mutable_streams(0)->mutable_instructions(0)->set_label(
      "task <F> & \"co\" MB=0");
  Simulation sim = simulateFixed(plans);
  std::string svg = timelineSvg(sim, plans);
  CHECK(xmlProblem(svg) == "");
  CHECK_THAT(svg, Contains("task &lt;F&gt; &amp; &quot;co&quot; MB=0"));
}

TEST_CASE("the trace JSON carries the simulated bubble per class") {
  std::vector<Plan> plans = twoStages();
  Simulation sim = simulateFixed(plans);
  std::string json = timelineTraceJson(sim);
  CHECK_THAT(json, Contains("\"source\": \"simulated\""));
  CHECK_THAT(json, Contains("\"bubble_fraction\": ["));
  CHECK_THAT(json, Contains("\"name\": \"class 1 ranks [1]\""));
  CHECK(count(json, "\"ph\": \"X\"") == 14 + 4);
}

TEST_CASE("writeTimelineFiles writes both files, or says why not") {
  std::vector<Plan> plans = twoStages();
  char tmpl[] = "/tmp/timeline_svg_test-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string dir = tmpl, line, error;
  REQUIRE(writeTimelineFiles(plans, dir, line, error));
  CHECK(line == "predicted timeline: timeline.json (Chrome/Perfetto trace), "
                "timeline.svg (picture)\n");
  for (const char *name : {kTimelineTraceFileName, kTimelineSvgFileName}) {
    std::ifstream in(dir + "/" + name);
    std::stringstream text;
    text << in.rdbuf();
    CHECK(text.str().size() > 100);
    std::remove((dir + "/" + name).c_str());
  }
  ::rmdir(dir.c_str());

  CHECK_FALSE(writeTimelineFiles(plans, "/nonexistent-dir/x", line, error));
  CHECK_THAT(error, Contains("cannot write the timeline "
                             "'/nonexistent-dir/x/timeline.json'"));

  // A RECV that no SEND matches: the plans cannot finish.
  add(plans[1], 1, Instruction::RECV, "recv channel 9")->set_tag(9);
  plans[1].mutable_streams(1)->mutable_instructions(
      plans[1].streams(1).instructions_size() - 1)->add_outputs(0);
  REQUIRE(writeTimelineFiles(plans, "/nonexistent-dir/x", line, error));
  CHECK(line == "predicted timeline: none (the step could not be "
                "simulated)\n");
}
