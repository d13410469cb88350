// Pictures of a simulated step: the SVG timeline, the Chrome trace and the
// files piperc compile writes (see TimelineSvg.h).
#include "proto/analysis/TimelineSvg.h"

#include "proto/PlanGroups.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

namespace piper::plan {

namespace {

// Layout, in SVG user units (pixels).
constexpr double kWidth = 1200;
constexpr double kLeft = 190;  // the label column
constexpr double kRight = 24;
constexpr double kTop = 34;    // the title
constexpr double kHeader = 18; // a class's label line
constexpr double kLane = 20;   // one stream
constexpr double kLaneGap = 3;
constexpr double kRowGap = 12; // between classes
constexpr double kMinBox = 0.75;

bool drawn(const TimelineEntry &e) {
  return e.kind == Instruction::CALL || plan::isCommunication(e.kind);
}

/// The passes with their own colour, in legend order.
struct PassStyle {
  const char *pass;
  const char *colour;
  const char *meaning;
};
constexpr PassStyle kPasses[] = {
    {"F", "#7fb3f5", "forward"},
    {"B", "#f7b267", "backward"},
    {"BI", "#f4845f", "backward, input gradient"},
    {"BW", "#c39bd3", "backward, weight gradient"},
    {"U", "#8fd18f", "update"},
};
constexpr const char *kOtherColour = "#76d7c4";
constexpr const char *kCommColour = "#bdbdbd";

const char *passColour(const std::string &pass) {
  for (const PassStyle &p : kPasses)
    if (pass == p.pass)
      return p.colour;
  return kOtherColour;
}

std::string escapeXml(const std::string &text) {
  std::string out;
  for (char ch : text) {
    switch (ch) {
    case '&': out += "&amp;"; break;
    case '<': out += "&lt;"; break;
    case '>': out += "&gt;"; break;
    case '"': out += "&quot;"; break;
    case '\'': out += "&apos;"; break;
    default: out += ch;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string rankList(const std::vector<int> &ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i)
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

/// A round tick spacing (1, 2 or 5 times a power of ten) giving at most
/// about eight intervals over `span` seconds.
double tickSpacing(double span) {
  double raw = span / 8;
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw)
      return m * mag;
  return 10 * mag;
}

/// The segment pass of a CALL entry of class `c` ("" when unknown).
std::string callPass(const std::vector<Plan> &plans, size_t c,
                     const TimelineEntry &e) {
  if (c >= plans.size() || e.stream >= plans[c].streams_size())
    return "";
  const Stream &stream = plans[c].streams(e.stream);
  if (e.inst < 0 || e.inst >= stream.instructions_size())
    return "";
  int seg = stream.instructions(e.inst).segment();
  if (seg < 0 || seg >= plans[c].segments_size())
    return "";
  return segmentPass(plans[c].segments(seg).name());
}

/// Draws one box (and its microbatch) into `out`.
void drawBox(std::string &out, const TimelineEntry &e, const std::string &pass,
             double x0, double x1, double y) {
  bool call = e.kind == Instruction::CALL;
  double w = std::max(kMinBox, x1 - x0);
  std::string title = e.label.empty() ? Instruction::Kind_Name(e.kind)
                                      : e.label;
  title += ": " + formatSeconds(e.start) + " .. " + formatSeconds(e.end);
  out += "<rect class=\"box " + std::string(call ? "call" : "comm") +
         "\" x=\"" + num(x0) + "\" y=\"" + num(y) + "\" width=\"" + num(w) +
         "\" height=\"" + num(kLane) + "\" fill=\"" +
         (call ? passColour(pass) : kCommColour) +
         "\" stroke=\"#555\" stroke-width=\"0.5\"><title>" +
         escapeXml(title) + "</title></rect>\n";
  int mb = labelMicrobatch(e.label);
  if (mb < 0 || w < 12)
    return;
  out += "<text class=\"mb\" x=\"" + num(x0 + w / 2) + "\" y=\"" +
         num(y + kLane / 2 + 4) + "\" text-anchor=\"middle\">" +
         std::to_string(mb) + "</text>\n";
}

/// The time axis at `y`: a line, ticks and grid lines up to `gridTop`.
void drawAxis(std::string &out, double stepTime, double plotWidth, double y,
              double gridTop) {
  double span = stepTime > 0 ? stepTime : 1;
  double spacing = tickSpacing(span);
  out += "<g class=\"axis\">\n<line x1=\"" + num(kLeft) + "\" y1=\"" +
         num(y) + "\" x2=\"" + num(kLeft + plotWidth) + "\" y2=\"" + num(y) +
         "\" stroke=\"#000\"/>\n";
  for (int i = 0; i * spacing <= span * (1 + 1e-9); ++i) {
    double t = i * spacing;
    double x = kLeft + t / span * plotWidth;
    out += "<line x1=\"" + num(x) + "\" y1=\"" + num(gridTop) + "\" x2=\"" +
           num(x) + "\" y2=\"" + num(y) +
           "\" stroke=\"#ddd\" stroke-width=\"0.5\"/>\n";
    out += "<line x1=\"" + num(x) + "\" y1=\"" + num(y) + "\" x2=\"" +
           num(x) + "\" y2=\"" + num(y + 5) + "\" stroke=\"#000\"/>\n";
    out += "<text x=\"" + num(x) + "\" y=\"" + num(y + 17) +
           "\" text-anchor=\"middle\">" + escapeXml(formatSeconds(t)) +
           "</text>\n";
  }
  out += "</g>\n";
}

/// The legend at `y`: the passes that occur, "other", communication.
void drawLegend(std::string &out, const std::set<std::string> &passes,
                bool comm, double y) {
  std::vector<std::pair<std::string, const char *>> items;
  for (const PassStyle &p : kPasses)
    if (passes.count(p.pass))
      items.push_back({std::string(p.pass) + " " + p.meaning, p.colour});
  for (const std::string &p : passes)
    if (passColour(p) == kOtherColour) {
      items.push_back({"other pass", kOtherColour});
      break;
    }
  if (comm)
    items.push_back({"communication", kCommColour});
  out += "<g class=\"legend\">\n";
  double x = kLeft;
  for (const auto &[text, colour] : items) {
    out += "<rect x=\"" + num(x) + "\" y=\"" + num(y) +
           "\" width=\"12\" height=\"12\" fill=\"" + colour +
           "\" stroke=\"#555\" stroke-width=\"0.5\"/>\n";
    out += "<text x=\"" + num(x + 16) + "\" y=\"" + num(y + 10) + "\">" +
           escapeXml(text) + "</text>\n";
    x += 16 + 7.0 * text.size() + 18;
  }
  out += "</g>\n";
}

} // namespace

int labelMicrobatch(const std::string &label) {
  for (size_t at = label.find("MB="); at != std::string::npos;
       at = label.find("MB=", at + 1)) {
    bool word = at == 0 || !std::isalnum(static_cast<unsigned char>(
                                label[at - 1]));
    size_t d = at + 3;
    if (!word || d >= label.size() ||
        !std::isdigit(static_cast<unsigned char>(label[d])))
      continue;
    int mb = 0;
    while (d < label.size() &&
           std::isdigit(static_cast<unsigned char>(label[d])) && mb < 1e8)
      mb = mb * 10 + (label[d++] - '0');
    return mb;
  }
  return -1;
}

std::string timelineSvg(const Simulation &sim, const std::vector<Plan> &plans) {
  const double plotWidth = kWidth - kLeft - kRight;
  const double span = sim.stepTime > 0 ? sim.stepTime : 1;
  auto xOf = [&](double t) { return kLeft + t / span * plotWidth; };
  std::string body;
  std::set<std::string> passes;
  bool comm = false;
  double y = kTop;
  for (size_t c = 0; c < sim.classes.size(); ++c) {
    const ClassTime &ct = sim.classes[c];
    char bubble[64];
    std::snprintf(bubble, sizeof bubble, "%.2f%%", 100 * ct.bubbleFraction);
    body += "<g class=\"device-class\" id=\"class-" +
            std::to_string(ct.deviceClass) + "\">\n<text class=\"row\" x=\"4\"" +
            " y=\"" + num(y + 13) + "\">class " +
            std::to_string(ct.deviceClass) + ": ranks [" +
            rankList(ct.ranks) + "]</text>\n<text x=\"" + num(kLeft) +
            "\" y=\"" + num(y + 13) + "\" fill=\"#555\">step " +
            escapeXml(formatSeconds(ct.stepTime)) + ", bubble " + bubble +
            "</text>\n";
    y += kHeader;
    // One lane per stream that has work, in stream order.
    std::map<int, std::vector<const TimelineEntry *>> lanes;
    for (const TimelineEntry &e : ct.timeline)
      if (drawn(e))
        lanes[e.stream].push_back(&e);
    for (const auto &[s, entries] : lanes) {
      std::string name = s < int(ct.streams.size()) ? ct.streams[s].name
                                                    : std::to_string(s);
      body += "<g class=\"lane\">\n<text x=\"" + num(kLeft - 6) + "\" y=\"" +
              num(y + kLane / 2 + 4) + "\" text-anchor=\"end\">" +
              escapeXml(name) + "</text>\n<rect x=\"" + num(kLeft) +
              "\" y=\"" + num(y) + "\" width=\"" + num(plotWidth) +
              "\" height=\"" + num(kLane) + "\" fill=\"#f6f6f6\"/>\n";
      for (const TimelineEntry *e : entries) {
        std::string pass =
            e->kind == Instruction::CALL ? callPass(plans, c, *e) : "";
        if (e->kind == Instruction::CALL)
          passes.insert(pass);
        else
          comm = true;
        drawBox(body, *e, pass, xOf(e->start), xOf(e->end), y);
      }
      body += "</g>\n";
      y += kLane + kLaneGap;
    }
    body += "</g>\n";
    y += kRowGap;
  }
  drawAxis(body, sim.stepTime, plotWidth, y, kTop);
  drawLegend(body, passes, comm, y + 30);
  double height = y + 30 + 24;
  std::string out =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(kWidth) +
      "\" height=\"" + num(height) + "\" viewBox=\"0 0 " + num(kWidth) + " " +
      num(height) + "\" font-family=\"sans-serif\" font-size=\"11\">\n" +
      "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n" +
      "<text x=\"4\" y=\"20\" font-size=\"14\">predicted step " +
      escapeXml(formatSeconds(sim.stepTime)) +
      " (piper-plan --simulate; docs/simulator.md)</text>\n" + body +
      "</svg>\n";
  return out;
}

std::string timelineTraceJson(const Simulation &sim) {
  nlohmann::json events = nlohmann::json::array();
  nlohmann::json bubbles = nlohmann::json::array();
  nlohmann::json steps = nlohmann::json::array();
  for (const ClassTime &ct : sim.classes) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", ct.deviceClass},
                      {"args",
                       {{"name", "class " + std::to_string(ct.deviceClass) +
                                     " ranks [" + rankList(ct.ranks) + "]"}}}});
    for (size_t s = 0; s < ct.streams.size(); ++s)
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", ct.deviceClass},
                        {"tid", s},
                        {"args", {{"name", ct.streams[s].name}}}});
    for (const TimelineEntry &e : ct.timeline) {
      if (e.kind == Instruction::RECORD || e.kind == Instruction::WAIT)
        continue;
      events.push_back({{"name", e.label.empty()
                                     ? Instruction::Kind_Name(e.kind)
                                     : e.label},
                        {"cat", Instruction::Kind_Name(e.kind)},
                        {"ph", "X"},
                        {"pid", ct.deviceClass},
                        {"tid", e.stream},
                        {"ts", e.start * 1e6},
                        {"dur", (e.end - e.start) * 1e6},
                        {"args", {{"instruction", e.inst}}}});
    }
    bubbles.push_back(ct.bubbleFraction);
    steps.push_back(ct.stepTime);
  }
  nlohmann::json trace = {
      {"traceEvents", events},
      {"displayTimeUnit", "ms"},
      {"metadata",
       {{"source", "simulated"},
        {"bubble_fraction", bubbles},
        {"step_seconds", steps}}}};
  return trace.dump(1) + "\n";
}

bool writeTimelineFiles(const std::vector<Plan> &plans, const std::string &dir,
                        std::string &reportLine, std::string &error) {
  Simulation sim;
  std::string why;
  if (!simulate(plans, Machine(), SimulateOptions(), sim, why)) {
    reportLine = "predicted timeline: none (the step could not be simulated)\n";
    return true;
  }
  const std::pair<const char *, std::string> files[] = {
      {kTimelineTraceFileName, timelineTraceJson(sim)},
      {kTimelineSvgFileName, timelineSvg(sim, plans)}};
  for (const auto &[name, text] : files) {
    std::string path = dir + "/" + name;
    std::ofstream out(path, std::ios::binary);
    out << text;
    out.close();
    if (!out) {
      error = "cannot write the timeline '" + path + "'";
      return false;
    }
  }
  reportLine = std::string("predicted timeline: ") + kTimelineTraceFileName +
               " (Chrome/Perfetto trace), " + kTimelineSvgFileName +
               " (picture)\n";
  return true;
}

} // namespace piper::plan
