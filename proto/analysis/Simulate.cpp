// The step-time simulator's event loop (see Simulate.h and
// docs/simulator.md): every class's streams advance in order; transfers and
// collectives wait for their peers, WAITs for their events. What each
// instruction costs is SimulateCost.cpp; the text reports SimulateReport.cpp.
#include "proto/analysis/Simulate.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "proto/PlanGroups.h"
#include "proto/analysis/MemoryPlan.h"
#include "proto/analysis/SimulateCost.h"
#include "proto/analysis/StreamOrder.h"

namespace piper::plan {
namespace {

using namespace simcost;

struct EntryRef {
  int cls = -1;
  int index = -1;
};

/// One point-to-point transfer: a SEND and its RECV.
struct Transfer {
  bool sendIssued = false, recvIssued = false;
  double sendIssue = 0, recvIssue = 0;
  double bytes = 0;
  bool hasOverride = false;
  double override = 0;
  /// Whether the two ranks (replica 0 of each class) share a node.
  bool withinNode = false;
  bool done = false;
  double start = 0, end = 0;
  EntryRef
      sendEntry; // an asynchronous send's timeline entry, filled at the end
};

/// One collective instance: every member class arrives, then all start
/// together.
struct Collective {
  std::set<int> members;
  std::map<int, double> arrival;
  /// By member: a fixed duration (an override), or the member's local
  /// work after the ring.
  std::map<int, std::pair<bool, double>> duration;
  bool done = false;
  double start = 0;
  double commBytes = 0;
  int ranks = 1;
  /// Ring passes over commBytes: 2 for an all-reduce (reduce-scatter then
  /// all-gather), 1 for a reduce-scatter, an all-gather or an all-to-all.
  double passes = 2;
  /// Whether every rank of the group shares one node (the node's link).
  bool withinNode = false;
};

using TransferKey =
    std::tuple<int, int, std::string, int>; // from, to, stream, tag

class Simulator {
public:
  Simulator(const std::vector<Plan> &plans, const Machine &machine,
            const SimulateOptions &options)
      : plans(plans), m(machine), opt(options) {}

  bool run(Simulation &out, std::string &error) {
    out = Simulation();
    out.machine = m;
    int world = 0;
    for (size_t c = 0; c < plans.size(); ++c) {
      const Plan &plan = plans[c];
      world = std::max(world, plan.world_size());
      if (plan.ranks_size() == 0) {
        error = "class " + std::to_string(plan.device_class()) +
                ": the plan has no ranks";
        return false;
      }
      for (int i = 0; i < plan.ranks_size(); ++i) {
        if (classOfRank.count(plan.ranks(i))) {
          error = "rank " + std::to_string(plan.ranks(i)) +
                  " appears in two device classes";
          return false;
        }
        classOfRank[plan.ranks(i)] = int(c);
      }
      world = std::max(world, int(classOfRank.size()));
    }
    worldSize = world;

    st.resize(plans.size());
    for (size_t c = 0; c < plans.size(); ++c) {
      const Plan &plan = plans[c];
      ClassState &cs = st[c];
      int n = plan.streams_size();
      cs.pc.assign(n, 0);
      cs.t.assign(n, 0);
      cs.busy.assign(n, 0);
      cs.registered.assign(n, 0);
      cs.pendingKey.assign(n, "");
      cs.sendsEnd.assign(n, 0);
      int events = std::max(0, plan.num_events());
      cs.recorded.assign(events, 0);
      cs.eventTime.assign(events, 0);
    }

    if (m.shareCompute) {
      // A shared engine serves CALLs in the order their streams reach
      // them: advance, one instruction at a time, the earliest stream that
      // can move.
      if (!runInTimeOrder(error))
        return false;
    } else {
      bool progress = true;
      while (progress) {
        progress = false;
        for (size_t c = 0; c < plans.size(); ++c)
          for (int s = 0; s < plans[c].streams_size(); ++s)
            while (st[c].pc[s] < plans[c].streams(s).instructions_size()) {
              int r = advance(int(c), s, error);
              if (r < 0)
                return false;
              if (r == 0)
                break;
              progress = true;
            }
      }
    }

    std::string blocked;
    for (size_t c = 0; c < plans.size(); ++c)
      for (int s = 0; s < plans[c].streams_size(); ++s)
        if (st[c].pc[s] < plans[c].streams(s).instructions_size())
          blocked += (blocked.empty() ? "" : "; ") + where(int(c), s) +
                     " waits for " + waitingFor(int(c), s);
    if (!blocked.empty()) {
      error = "the plans cannot finish the step (deadlock): " + blocked;
      return false;
    }

    // Asynchronous sends: their entries and their streams' ends.
    for (auto &[key, x] : transfers) {
      if (x.sendEntry.cls < 0)
        continue;
      TimelineEntry &e = timeline(x.sendEntry.cls)[x.sendEntry.index];
      if (!x.done) {
        error = where(x.sendEntry.cls, e.stream, e.inst) + ": SEND tag " +
                std::to_string(std::get<3>(key)) + " to class " +
                classId(std::get<1>(key)) +
                " is never received (no RECV of that tag on a stream named '" +
                std::get<2>(key) + "')";
        return false;
      }
      e.start = x.start;
      e.end = x.end;
      ClassState &cs = st[x.sendEntry.cls];
      cs.busy[e.stream] += x.end - x.start;
      cs.sendsEnd[e.stream] = std::max(cs.sendsEnd[e.stream], x.end);
    }

    for (size_t c = 0; c < plans.size(); ++c) {
      ClassTime ct = summarize(int(c));
      out.stepTime = std::max(out.stepTime, ct.stepTime);
      out.classes.push_back(std::move(ct));
    }
    return true;
  }

private:
  struct ClassState {
    std::vector<int> pc;
    std::vector<double> t;
    std::vector<double> busy;
    std::vector<char> registered;        // the instruction at pc has arrived
    std::vector<std::string> pendingKey; // its collective instance
    std::vector<double> sendsEnd;
    std::vector<char> recorded;
    std::vector<double> eventTime;
    std::map<std::string, int> collectiveCount;
    std::vector<TimelineEntry> timeline;
    double computeFree =
        0; // Machine::shareCompute: the engine's next free time
  };

  /// Class `c`'s times once the step has run: per stream its busy time and
  /// end, the compute busy time and bubble, and its timeline (moved out).
  ClassTime summarize(int c) {
    const Plan &plan = plans[c];
    ClassState &cs = st[c];
    ClassTime ct;
    ct.deviceClass = plan.device_class();
    ct.ranks.assign(plan.ranks().begin(), plan.ranks().end());
    std::vector<std::pair<double, double>> calls;
    for (int s = 0; s < plan.streams_size(); ++s) {
      StreamTime stream;
      stream.name = plan.streams(s).name();
      stream.busy = cs.busy[s];
      stream.end = std::max(cs.t[s], cs.sendsEnd[s]);
      ct.stepTime = std::max(ct.stepTime, stream.end);
      ct.streams.push_back(stream);
    }
    for (const TimelineEntry &e : cs.timeline)
      if (e.kind == Instruction::CALL) {
        ct.streams[e.stream].compute = true;
        if (e.end > e.start)
          calls.push_back({e.start, e.end});
      }
    std::sort(calls.begin(), calls.end());
    double covered = 0, until = -1;
    for (auto [a, b] : calls) {
      a = std::max(a, until);
      if (b > a)
        covered += b - a;
      until = std::max(until, b);
    }
    ct.computeBusy = covered;
    if (!calls.empty())
      ct.spanIdle = until - calls.front().first - covered;
    ct.bubbleFraction =
        ct.stepTime > 0 ? (ct.stepTime - covered) / ct.stepTime : 0;
    ct.timeline = std::move(cs.timeline);
    std::sort(ct.timeline.begin(), ct.timeline.end(),
              [](const TimelineEntry &a, const TimelineEntry &b) {
                return std::tie(a.stream, a.inst) < std::tie(b.stream, b.inst);
              });
    return ct;
  }

  /// The event loop for a shared compute engine: each round advances the
  /// stream with the earliest time that can move (ties by class, then
  /// stream), so a CALL ready earlier takes the engine first. Stops when
  /// no stream can move (done, or a deadlock the caller reports).
  bool runInTimeOrder(std::string &error) {
    // The unfinished streams by (time, class, stream). Only the stream that
    // moves changes its time, so the order is kept, not rebuilt per round.
    std::set<std::tuple<double, int, int>> order;
    for (size_t c = 0; c < plans.size(); ++c)
      for (int s = 0; s < plans[c].streams_size(); ++s)
        if (st[c].pc[s] < plans[c].streams(s).instructions_size())
          order.emplace(st[c].t[s], int(c), s);
    while (true) {
      bool moved = false;
      for (auto it = order.begin(); it != order.end(); ++it) {
        auto [t, c, s] = *it;
        int r = advance(c, s, error);
        if (r < 0)
          return false;
        if (r == 1) {
          order.erase(it);
          if (st[c].pc[s] < plans[c].streams(s).instructions_size())
            order.emplace(st[c].t[s], c, s);
          moved = true;
          break;
        }
      }
      if (!moved)
        return true;
    }
  }

  std::vector<TimelineEntry> &timeline(int c) { return st[c].timeline; }

  std::string classId(int c) const {
    return std::to_string(plans[c].device_class());
  }

  std::string where(int c, int s, int inst = -1) const {
    return "class " + classId(c) + ", " +
           describePosition(plans[c], {s, inst < 0 ? st[c].pc[s] : inst});
  }

  void push(int c, int s, const Instruction &inst, double issue, double start,
            double end) {
    TimelineEntry e;
    e.stream = s;
    e.inst = st[c].pc[s];
    e.kind = inst.kind();
    e.label = inst.label();
    e.issue = issue;
    e.start = start;
    e.end = end;
    st[c].timeline.push_back(std::move(e));
  }

  /// Moves stream `s` of class `c` past its current instruction, which ran
  /// from `start` to `end` (`work`: counts as busy).
  void finish(int c, int s, const Instruction &inst, double start, double end,
              bool work) {
    ClassState &cs = st[c];
    push(c, s, inst, cs.t[s], start, end);
    if (work)
      cs.busy[s] += end - start;
    cs.t[s] = end;
    cs.registered[s] = 0;
    cs.pendingKey[s].clear();
    ++cs.pc[s];
  }

  bool peerClass(int c, int s, const Instruction &inst, int &peer,
                 std::string &error) {
    const Plan &plan = plans[c];
    if (inst.peer_group() < 0 || inst.peer_group() >= plan.groups_size() ||
        plan.groups(inst.peer_group()).ranks_size() == 0) {
      error = where(c, s) + ": peer group " +
              std::to_string(inst.peer_group()) + " is not a group of the plan";
      return false;
    }
    auto it = classOfRank.find(plan.groups(inst.peer_group()).ranks(0));
    if (it == classOfRank.end()) {
      error = where(c, s) + ": peer rank " +
              std::to_string(plan.groups(inst.peer_group()).ranks(0)) +
              " belongs to no plan given";
      return false;
    }
    peer = it->second;
    return true;
  }

  /// Machine::commUsesCompute: class `c`'s engine also spends `seconds`
  /// on communication that starts at `start`.
  void occupyEngine(int c, double start, double seconds) {
    if (!m.commUsesCompute || !m.shareCompute || seconds <= 0)
      return;
    st[c].computeFree = std::max(st[c].computeFree, start) + seconds;
  }

  void tryComplete(const TransferKey &key, Transfer &x) {
    if (x.done || !x.sendIssued || !x.recvIssued)
      return;
    x.done = true;
    x.start = std::max(x.sendIssue, x.recvIssue);
    if (x.hasOverride) {
      x.end = x.start + x.override;
      return;
    }
    double onWire = 0;
    x.end = x.start + pointToPoint(m, x.bytes, x.withinNode, &onWire);
    occupyEngine(std::get<0>(key), x.start, onWire);
    occupyEngine(std::get<1>(key), x.start, onWire);
  }

  void tryComplete(Collective &k) {
    if (k.done || k.arrival.size() != k.members.size())
      return;
    k.done = true;
    for (auto [c, at] : k.arrival)
      k.start = std::max(k.start, at);
  }

  /// 1: the stream moved on; 0: it is blocked; -1: error.
  int advance(int c, int s, std::string &error) {
    const Plan &plan = plans[c];
    ClassState &cs = st[c];
    const Stream &stream = plan.streams(s);
    const Instruction &inst = stream.instructions(cs.pc[s]);
    double t = cs.t[s];
    double fixed = 0;
    bool hasFixed = overrideFor(opt, plan, inst, fixed);
    if (isCollective(inst.kind()))
      return advanceCollective(c, s, inst, t, hasFixed, fixed, error);
    switch (inst.kind()) {
    case Instruction::CALL: {
      if (inst.segment() < 0 || inst.segment() >= plan.segments_size()) {
        error = where(c, s) + ": segment " + std::to_string(inst.segment()) +
                " is out of range";
        return -1;
      }
      const Segment &seg = plan.segments(inst.segment());
      double d = hasFixed ? fixed : callTime(m, seg);
      double start = m.shareCompute ? std::max(t, cs.computeFree) : t;
      if (m.shareCompute)
        cs.computeFree = start + d;
      finish(c, s, inst, start, start + d, true);
      return 1;
    }
    case Instruction::LOAD_BATCH:
      finish(c, s, inst, t, t + (hasFixed ? fixed : 0), true);
      return 1;
    case Instruction::RECORD:
    case Instruction::WAIT: {
      int e = inst.event();
      if (e < 0 || e >= int(cs.recorded.size())) {
        error =
            where(c, s) + ": event " + std::to_string(e) + " is out of range";
        return -1;
      }
      if (inst.kind() == Instruction::RECORD) {
        cs.recorded[e] = 1;
        cs.eventTime[e] = t;
        finish(c, s, inst, t, t, false);
        return 1;
      }
      if (!cs.recorded[e])
        return 0;
      double at = std::max(t, cs.eventTime[e]);
      finish(c, s, inst, at, at, false);
      return 1;
    }
    case Instruction::SEND:
    case Instruction::RECV: {
      bool send = inst.kind() == Instruction::SEND;
      int peer = -1;
      if (!peerClass(c, s, inst, peer, error))
        return -1;
      TransferKey key = send ? TransferKey{c, peer, stream.name(), inst.tag()}
                             : TransferKey{peer, c, stream.name(), inst.tag()};
      Transfer &x = transfers[key];
      if (!cs.registered[s]) {
        const auto &ids = send ? inst.inputs() : inst.outputs();
        if (ids.size() != 1 || ids[0] < 0 || ids[0] >= plan.buffers_size()) {
          error = where(c, s) + ": " + (send ? "SEND" : "RECV") +
                  " needs one buffer in range";
          return -1;
        }
        if (send ? x.sendIssued : x.recvIssued) {
          error = where(c, s) + ": a second " + (send ? "SEND" : "RECV") +
                  " of tag " + std::to_string(inst.tag()) +
                  " between classes " + classId(std::get<0>(key)) + " and " +
                  classId(std::get<1>(key)) + " on stream '" + stream.name() +
                  "'";
          return -1;
        }
        x.bytes =
            std::max(x.bytes, wireBytes(plan, plan.buffers(ids[0]).type()));
        if (hasFixed) {
          x.override = x.hasOverride ? std::max(x.override, fixed) : fixed;
          x.hasOverride = true;
        }
        (send ? x.sendIssued : x.recvIssued) = true;
        (send ? x.sendIssue : x.recvIssue) = t;
        // Replica 0 of this class and the first rank of its peer group.
        if (plan.ranks_size() > 0)
          x.withinNode = withinOneNode(
              m, {plan.ranks(0), plan.groups(inst.peer_group()).ranks(0)});
        cs.registered[s] = 1;
        tryComplete(key, x);
        if (send && !opt.blockingSends) {
          // The stream moves on; the transfer is accounted at the end.
          x.sendEntry = {c, int(cs.timeline.size())};
          finish(c, s, inst, t, t, false);
          return 1;
        }
      }
      if (!x.done)
        return 0;
      cs.t[s] = send ? x.sendIssue : x.recvIssue; // the entry's issue time
      finish(c, s, inst, x.start, x.end, true);
      return 1;
    }
    default:
      error = where(c, s) + ": cannot simulate instruction kind " +
              (Instruction::Kind_IsValid(inst.kind())
                   ? Instruction::Kind_Name(inst.kind())
                   : std::to_string(inst.kind()));
      return -1;
    }
  }

  /// advance() for a collective (isCollective): it arrives, then waits for
  /// every member class; all start together.
  int advanceCollective(int c, int s, const Instruction &inst, double t,
                        bool hasFixed, double fixed, std::string &error) {
    const Plan &plan = plans[c];
    ClassState &cs = st[c];
    const Stream &stream = plan.streams(s);
    // A blocked collective is polled again on every round: the group, the
    // cost and the registration happen on its first visit only.
    if (!cs.registered[s]) {
      bool clip = inst.kind() == Instruction::CLIP_GRADS;
      std::set<int> members;
      std::vector<int> ranks;
      if (clip) {
        for (size_t k = 0; k < plans.size(); ++k)
          members.insert(int(k));
        for (int r = 0; r < worldSize; ++r)
          ranks.push_back(r);
      } else {
        // The class's first rank stands for every replica: all of them run
        // with a group (or subgroup) of the same size.
        const DeviceGroup *g = plan.ranks_size()
                                   ? memberGroup(plan, inst, plan.ranks(0))
                                   : nullptr;
        if (!g) {
          error = where(c, s) + ": group " + std::to_string(inst.group()) +
                  " (or its subgroup of rank " +
                  std::to_string(plan.ranks_size() ? plan.ranks(0) : -1) +
                  ") is not a group of the plan";
          return -1;
        }
        ranks.assign(g->ranks().begin(), g->ranks().end());
        std::sort(ranks.begin(), ranks.end());
        for (int r : ranks) {
          auto it = classOfRank.find(r);
          if (it == classOfRank.end()) {
            error = where(c, s) + ": group rank " + std::to_string(r) +
                    " belongs to no plan given";
            return -1;
          }
          members.insert(it->second);
        }
      }
      double bytes = 0, local = 0;
      std::string problem;
      if (!collectiveCost(m, plan, inst, bytes, local, problem)) {
        error = where(c, s) + ": " + problem;
        return -1;
      }
      std::string kindName = inst.kind() == Instruction::ALL_REDUCE
                                 ? "all-reduce"
                                 : Instruction::Kind_Name(inst.kind());
      std::string base =
          clip ? std::string("clip") : kindName + " '" + stream.name() + "' [";
      if (!clip)
        for (size_t i = 0; i < ranks.size(); ++i)
          base += (i ? "," : "") + std::to_string(ranks[i]);
      int seq = cs.collectiveCount[base]++;
      std::string key = base + "#" + std::to_string(seq);
      Collective &k = collectives[key];
      if (k.members.empty()) {
        k.members = members;
        k.ranks = int(ranks.size());
        k.passes = ringPasses(inst.kind());
        k.withinNode = withinOneNode(m, ranks);
      }
      k.arrival[c] = t;
      k.commBytes = std::max(k.commBytes, bytes);
      cs.pendingKey[s] = key;
      cs.registered[s] = 1;
      k.duration[c] =
          hasFixed ? std::make_pair(true, fixed) : std::make_pair(false, local);
      tryComplete(k);
    }
    Collective &k = collectives[cs.pendingKey[s]];
    if (!k.done)
      return 0;
    auto [isFixed, d] = k.duration[c];
    if (!isFixed) { // the ring, then the local part
      double onWire = 0;
      d += ringCollective(m, k.ranks, k.commBytes, k.passes, k.withinNode,
                          &onWire);
      occupyEngine(c, k.start, onWire);
    }
    cs.t[s] = k.arrival[c];
    finish(c, s, inst, k.start, k.start + d, true);
    return 1;
  }

  /// What the blocked instruction at stream `s` of class `c` waits for.
  std::string waitingFor(int c, int s) {
    const Plan &plan = plans[c];
    const Stream &stream = plan.streams(s);
    const Instruction &inst = stream.instructions(st[c].pc[s]);
    if (isCollective(inst.kind())) {
      auto it = collectives.find(st[c].pendingKey[s]);
      if (it == collectives.end())
        return "a collective";
      std::string missing;
      for (int member : it->second.members)
        if (!it->second.arrival.count(member))
          missing += (missing.empty() ? "" : ", ") + classId(member);
      std::string key = it->first.substr(0, it->first.rfind('#'));
      return (inst.kind() == Instruction::CLIP_GRADS
                  ? std::string("the world's CLIP_GRADS")
                  : "the " + key + "]") +
             ", which class(es) " + missing + " have not reached";
    }
    switch (inst.kind()) {
    case Instruction::WAIT: {
      int e = inst.event();
      for (int t = 0; t < plan.streams_size(); ++t)
        for (int i = 0; i < plan.streams(t).instructions_size(); ++i) {
          const Instruction &r = plan.streams(t).instructions(i);
          if (r.kind() == Instruction::RECORD && r.event() == e)
            return "event " + std::to_string(e) + ", recorded by " +
                   describePosition(plan, {t, i}) + ", not reached";
        }
      return "event " + std::to_string(e) + ", which no instruction records";
    }
    case Instruction::SEND:
    case Instruction::RECV: {
      bool send = inst.kind() == Instruction::SEND;
      int peer = -1;
      std::string ignored;
      if (!peerClass(c, s, inst, peer, ignored))
        return "an unknown peer";
      const Plan &other = plans[peer];
      std::string what = std::string(send ? "its RECV" : "its SEND") +
                         " (tag " + std::to_string(inst.tag()) + ", class " +
                         classId(peer) + ")";
      for (int t = 0; t < other.streams_size(); ++t) {
        if (other.streams(t).name() != stream.name())
          continue;
        for (int i = 0; i < other.streams(t).instructions_size(); ++i) {
          const Instruction &o = other.streams(t).instructions(i);
          int back = -1;
          if (o.kind() == (send ? Instruction::RECV : Instruction::SEND) &&
              o.tag() == inst.tag() && peerClass(peer, t, o, back, ignored) &&
              back == c)
            return what + ", " + describePosition(other, {t, i}) +
                   ", not reached";
        }
      }
      return what + ", which class " + classId(peer) +
             " never issues on a stream named '" + stream.name() + "'";
    }
    default:
      return "nothing it can know";
    }
  }

  const std::vector<Plan> &plans;
  Machine m;
  const SimulateOptions &opt;
  std::map<int, int> classOfRank;
  int worldSize = 0;
  std::vector<ClassState> st;
  std::map<TransferKey, Transfer> transfers;
  std::map<std::string, Collective> collectives;
};

} // namespace

bool simulate(const std::vector<Plan> &plans, const Machine &machine,
              const SimulateOptions &options, Simulation &out,
              std::string &error) {
  Simulator sim(plans, machine, options);
  return sim.run(out, error);
}

} // namespace piper::plan
