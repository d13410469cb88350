// The watchdog's judgement (Watchdog.h): what a rank waits on at its plan
// position, the verdicts (a silent, stuck or failed rank, a lost store) and
// the hang report. The watchdog's thread and heartbeats are in Watchdog.cpp.
#include <algorithm>
#include <sstream>

#include <fmt/format.h>

#include "proto/PlanGroups.h"
#include "runtime/launch/watchdog/Watchdog.h"
#include "runtime/launch/watchdog/WatchdogInternal.h"

namespace piper::runtime {

using plan::Instruction;
using watchdog_detail::Clock;
using watchdog_detail::rankList;
using watchdog_detail::secondsSince;

// --- waits -------------------------------------------------------------------

std::vector<int> waitsOn(const plan::Plan &plan, int replica,
                         const Instruction &inst, int rank) {
  std::vector<int> ranks;
  if (plan::isGroupCollective(inst.kind())) {
    // The members it runs with: its group, or its subgroup of it.
    if (const plan::DeviceGroup *g = plan::memberGroup(plan, inst, rank))
      for (int r : g->ranks())
        if (r != rank)
          ranks.push_back(r);
  } else if (inst.kind() == Instruction::RECV) {
    if (inst.peer_group() >= 0 && inst.peer_group() < plan.groups_size() &&
        replica < plan.groups(inst.peer_group()).ranks_size())
      ranks.push_back(plan.groups(inst.peer_group()).ranks(replica));
  } else if (inst.kind() == Instruction::CLIP_GRADS) {
    for (int r = 0; r < plan.world_size(); ++r)
      if (r != rank)
        ranks.push_back(r);
  }
  return ranks;
}

bool Watchdog::communicating(const ExecPosition &pos) const {
  if (pos.phase == ExecPosition::kLossAllReduce)
    return true;
  int s = pos.failedStream;
  const plan::Plan &plan = exec.plan();
  if (s < 0 || s >= plan.streams_size())
    return false;
  int i = pos.instruction[s];
  if (i >= plan.streams(s).instructions_size())
    return true; // waiting for its sends
  return i >= 0 &&
         plan::isCommunication(plan.streams(s).instructions(i).kind());
}

std::string Watchdog::describeSelf(const ExecPosition &pos,
                                   std::vector<int> &waits) {
  const plan::Plan &plan = exec.plan();
  std::string out;
  waits.clear();
  if (!activity.empty()) {
    // Between steps, in world collectives of its own (setActivity).
    out += fmt::format("pos {}: with all {} ranks\n", activity, worldSize);
    for (int r = 0; r < worldSize; ++r)
      if (r != rank)
        waits.push_back(r);
  }
  for (int s = 0; s < plan.streams_size(); ++s) {
    const plan::Stream &stream = plan.streams(s);
    int i =
        s < static_cast<int>(pos.instruction.size()) ? pos.instruction[s] : -1;
    if (i < 0) {
      out +=
          fmt::format("pos stream '{}': no instruction yet\n", stream.name());
      continue;
    }
    if (i >= stream.instructions_size()) {
      // While the stepping thread fills the next step's batches, a stream
      // past its end has no more to do this step (the data line below says
      // where the rank is).
      const bool sending =
          pos.phase == ExecPosition::kStreams && pos.filling <= 0;
      out += fmt::format("pos stream '{}': after its last instruction ({}){}\n",
                         stream.name(), stream.instructions_size(),
                         sending ? ", waiting for its sends" : "");
      continue;
    }
    const Instruction &inst = stream.instructions(i);
    std::string what;
    std::vector<int> w = waitsOn(plan, exec.replicaIndex(), inst, rank);
    // Reached but not begun (stuck before it: the heartbeat is published
    // between the two): this rank never arrived at that communication, and
    // waits on nobody; its peers, in it, wait on this rank.
    const bool begun =
        s < static_cast<int>(pos.entered.size()) && pos.entered[s] == i;
    if (!begun)
      w.clear();
    switch (inst.kind()) {
    case Instruction::SEND:
      if (inst.peer_group() >= 0 && inst.peer_group() < plan.groups_size() &&
          exec.replicaIndex() < plan.groups(inst.peer_group()).ranks_size())
        what = fmt::format(
            ": to rank {}",
            plan.groups(inst.peer_group()).ranks(exec.replicaIndex()));
      break;
    case Instruction::RECV:
      what = w.empty() ? "" : fmt::format(": from rank {}", w[0]);
      break;
    case Instruction::CLIP_GRADS:
      what = ": all ranks";
      break;
    case Instruction::WAIT:
      what = fmt::format(": event {}", inst.event());
      break;
    case Instruction::CALL:
      if (inst.segment() >= 0 && inst.segment() < plan.segments_size())
        what =
            fmt::format(": segment '{}'", plan.segments(inst.segment()).name());
      break;
    default:
      if (plan::isGroupCollective(inst.kind())) {
        std::vector<int> group;
        const plan::DeviceGroup *g = plan::memberGroup(plan, inst, rank);
        if (g)
          group.assign(g->ranks().begin(), g->ranks().end());
        what = fmt::format(": group {} [{}]", g ? g->id() : inst.group(),
                           rankList(group));
      }
      break;
    }
    out += fmt::format(
        "pos stream '{}' instruction {} {} '{}'{}{}\n", stream.name(), i,
        Instruction::Kind_Name(inst.kind()), inst.label(), what,
        begun || !plan::isCommunication(inst.kind()) ? "" : " (not begun)");
    if (pos.phase == ExecPosition::kStreams)
      waits.insert(waits.end(), w.begin(), w.end());
  }
  if (pos.filling > 0)
    out += fmt::format("pos data: filling the batches of step {} from the "
                       "data source\n",
                       pos.filling);
  if (pos.phase == ExecPosition::kLossAllReduce) {
    out += fmt::format("pos end of step {}: loss all-reduce over all {} "
                       "ranks\n",
                       pos.step, worldSize);
    for (int r = 0; r < worldSize; ++r)
      if (r != rank)
        waits.push_back(r);
  }
  std::sort(waits.begin(), waits.end());
  waits.erase(std::unique(waits.begin(), waits.end()), waits.end());
  return out;
}

bool Watchdog::decide(Abort &verdict) {
  auto now = Clock::now();
  // A verdict that stands.
  std::string text;
  bool present = false;
  auto started = Clock::now();
  Status s = store->get(kAbortKey, text, present);
  if (!s) {
    if (!storeFailing)
      storeErrorSince = started;
    storeFailing = true;
    storeError = s.message();
  } else if (present && decodeAbort(text, verdict)) {
    return true;
  }
  if (storeFailing && now - storeErrorSince >= timeout) {
    verdict.culprit = storeOwner >= 0 ? storeOwner : rank;
    verdict.reason = fmt::format(
        "the rendezvous store{} failed for {:.1f} s: {}",
        storeOwner >= 0 ? fmt::format(" (served by rank {})", storeOwner) : "",
        secondsSince(storeErrorSince, now), storeError);
    return true;
  }
  // Dead or stopped: a heartbeat that no longer changes.
  int stale = -1;
  double staleFor = 0;
  for (int r = 0; r < worldSize; ++r) {
    if (!watches(r) || peers[r].state == "done")
      continue;
    double t = secondsSince(peers[r].changed, now);
    if (t >= std::chrono::duration<double>(timeout).count() && t > staleFor) {
      stale = r;
      staleFor = t;
    }
  }
  if (stale >= 0) {
    verdict.culprit = stale;
    verdict.reason =
        peers[stale].seen
            ? fmt::format("no heartbeat for {:.1f} s (killed, crashed or "
                          "stopped)",
                          staleFor)
            : fmt::format("no heartbeat at all in {:.1f} s", staleFor);
    return true;
  }
  // Stuck: alive, in a step, but its position has not changed. Only rank
  // 0 judges it: it alone reads every rank's position. Not while a rank is
  // silent: the ranks waiting on it look stuck too, and its own verdict (no
  // heartbeat) follows within a second or two.
  if (rank != 0)
    return false;
  const auto silentAfter = 2 * publishEvery + std::chrono::milliseconds(500);
  for (int r = 0; r < worldSize; ++r)
    if (r != rank && peers[r].state != "done" &&
        now - peers[r].changed > silentAfter)
      return false;
  struct Stuck {
    int rank;
    double still;
    std::vector<int> waits;
  };
  std::vector<Stuck> stuck;
  const double limit = std::chrono::duration<double>(timeout).count();
  {
    std::vector<int> waits;
    ExecPosition pos = exec.position();
    describeSelf(pos, waits);
    double still = secondsSince(progressAt, now);
    if (state == "run" && pos.phase != ExecPosition::kIdle && still >= limit)
      stuck.push_back({rank, still, waits});
  }
  for (int r = 0; r < worldSize; ++r) {
    const Peer &p = peers[r];
    if (r == rank || !p.seen || p.state != "run" ||
        p.phase == ExecPosition::kIdle)
      continue;
    double still = p.stillMs / 1000.0 + secondsSince(p.changed, now);
    if (still >= limit)
      stuck.push_back({r, still, p.waits});
  }
  if (stuck.empty())
    return false;
  // What rank `r` waits on now (its last heartbeat's for a peer).
  std::vector<int> selfWaits;
  describeSelf(exec.position(), selfWaits);
  auto waitsOf = [&](int r) -> const std::vector<int> & {
    return r == rank ? selfWaits : peers[r].waits;
  };
  // A stuck rank that waits on a rank which does not wait on it is a
  // victim: it may well have started waiting before that rank got stuck.
  // Among the others (stuck on no rank, or in a mutual wait, a deadlock),
  // the longest stuck, then the lowest rank.
  const Stuck *best = nullptr;
  for (const Stuck &x : stuck) {
    bool victim = false;
    for (int y : x.waits) {
      if (y < 0 || y >= worldSize || (y != rank && peers[y].state == "done"))
        continue;
      const std::vector<int> &back = waitsOf(y);
      if (std::find(back.begin(), back.end(), x.rank) == back.end())
        victim = true;
    }
    if (victim)
      continue;
    if (!best || x.still > best->still + 1e-9 ||
        (x.still > best->still - 1e-9 && x.rank < best->rank))
      best = &x;
  }
  // Only victims: wait for the rank they wait on to be stuck too, but not
  // past the communication timeout.
  if (!best) {
    for (const Stuck &x : stuck)
      if (!best || x.still > best->still)
        best = &x;
    if (best->still < limit + 1.5)
      return false;
  }
  verdict.culprit = best->rank;
  verdict.reason = fmt::format(
      "stuck: heartbeat alive, but no progress in its plan for {:.1f} s "
      "(--timeout-s {})",
      best->still, timeout.count() / 1000);
  // A rank that waits on one that waits back (both inside one collective,
  // or a deadlock): which of them failed cannot be told. Say so; a guess
  // promotes no spare (Abort::guess).
  for (int y : best->waits) {
    if (y < 0 || y >= worldSize || y == best->rank)
      continue;
    const std::vector<int> &back = waitsOf(y);
    if (std::find(back.begin(), back.end(), best->rank) != back.end()) {
      verdict.guess = true;
      verdict.reason += fmt::format(
          "; but ranks {} and {} wait on each other (both inside one "
          "communication, or a deadlock), so which one failed cannot be "
          "told: rank {} is the one stuck longest, a guess",
          best->rank, y, best->rank);
      break;
    }
  }
  return true;
}

std::string Watchdog::report(const Abort &verdict) {
  auto now = Clock::now();
  std::string out =
      fmt::format("piper-run: rank {}: watchdog: rank {} failed: {}\n"
                  "piper-run: rank {}: last plan positions:\n",
                  rank, verdict.culprit, verdict.reason, rank);
  for (int r = 0; r < worldSize; ++r) {
    std::string head, body;
    if (r == rank) {
      std::vector<int> waits;
      ExecPosition pos = exec.position();
      body = describeSelf(pos, waits);
      head = fmt::format("rank {} (this rank): step {}, {}, no progress for "
                         "{:.1f} s",
                         r, pos.step, state, secondsSince(progressAt, now));
    } else if (!peers[r].seen) {
      head = fmt::format("rank {}: no heartbeat seen", r);
    } else {
      const Peer &p = peers[r];
      double age = secondsSince(p.changed, now);
      head = fmt::format("rank {}: step {}, {}, ", r, p.step, p.state);
      head += age > 2.5 * std::chrono::duration<double>(publishEvery).count()
                  ? fmt::format("no heartbeat for {:.1f} s", age)
                  : fmt::format("no progress for {:.1f} s",
                                p.stillMs / 1000.0 + age);
      std::stringstream in(p.text);
      std::string line;
      while (std::getline(in, line))
        if (line.rfind("pos ", 0) == 0 || line.rfind("msg ", 0) == 0)
          body += line + "\n";
    }
    out += "  " + head + (r == verdict.culprit ? "  <-- failed" : "") + "\n";
    std::stringstream in(body);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("pos ", 0) == 0)
        out += "    " + line.substr(4) + "\n";
      else if (line.rfind("msg ", 0) == 0)
        out += "    error: " + line.substr(4) + "\n";
    }
  }
  return out;
}

} // namespace piper::runtime
