// The watchdog of a rank (Watchdog.h): its thread, heartbeats through the
// rendezvous store, concluding and exiting. Plan positions, verdicts and the
// hang report are in WatchdogVerdict.cpp, PIPER_FAULT in FaultInjection.cpp.
#include "runtime/launch/watchdog/Watchdog.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include "runtime/launch/rendezvous/Rendezvous.h"
#include "runtime/launch/watchdog/WatchdogInternal.h"
#include "support/AtomicFile.h"

namespace piper::runtime {

using watchdog_detail::Clock;
using watchdog_detail::millisSince;
using watchdog_detail::rankList;

namespace {

std::vector<int> parseRankList(const std::string &s) {
  std::vector<int> ranks;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty())
      ranks.push_back(std::atoi(item.c_str()));
  return ranks;
}

/// exitRank's hook: the running watchdog, if any.
Watchdog *activeWatchdog = nullptr;
void exitHook(const std::string &message) {
  if (activeWatchdog)
    activeWatchdog->ownFailure(message);
}

} // namespace

std::string heartbeatKey(int rank) {
  return fmt::format("piper-watch-heartbeat-{}", rank);
}

std::string encodeAbort(const Abort &abort) {
  return fmt::format("{}{}\n{}", abort.culprit, abort.guess ? " guess" : "",
                     abort.reason);
}

bool decodeAbort(const std::string &text, Abort &abort) {
  size_t eol = text.find('\n');
  if (eol == std::string::npos || eol == 0)
    return false;
  char *end = nullptr;
  long r = std::strtol(text.c_str(), &end, 10);
  const char *eolAt = text.c_str() + eol;
  bool guess = eolAt - end == 6 && std::strncmp(end, " guess", 6) == 0;
  if (end != eolAt && !guess)
    return false;
  abort.culprit = static_cast<int>(r);
  abort.guess = guess;
  abort.reason = text.substr(eol + 1);
  return true;
}

// --- the watchdog
// --------------------------------------------------------------

Watchdog::Watchdog(int rank, int worldSize, std::chrono::milliseconds timeout,
                   std::unique_ptr<WatchStore> store, const Executor &exec)
    : rank(rank), worldSize(worldSize), timeout(timeout),
      store(std::move(store)), exec(exec), peers(worldSize) {}

Watchdog::~Watchdog() {
  if (activeWatchdog == this) {
    activeWatchdog = nullptr;
    setExitHook(nullptr);
  }
  stopping = true;
  wake.notify_all();
  if (thread.joinable())
    thread.join();
}

void Watchdog::start() {
  startedAt = progressAt = Clock::now();
  lastPos = exec.position();
  for (Peer &p : peers)
    p.changed = startedAt;
  {
    std::lock_guard<std::mutex> lock(mu);
    publish("run");
  }
  activeWatchdog = this;
  setExitHook(exitHook);
  thread = std::thread([this] { loop(); });
}

void Watchdog::publishActive() {
  if (activeWatchdog)
    activeWatchdog->publishNow();
}

void Watchdog::publishNow() {
  std::lock_guard<std::mutex> lock(mu);
  publish(state.c_str());
}

void Watchdog::finish() {
  stopping = true;
  wake.notify_all();
  if (thread.joinable())
    thread.join();
  std::lock_guard<std::mutex> lock(mu);
  state = "done";
  publish("done");
  if (activeWatchdog == this) {
    activeWatchdog = nullptr;
    setExitHook(nullptr);
  }
}

void Watchdog::publish(const char *st) {
  auto now = Clock::now();
  ExecPosition pos = exec.position();
  std::vector<int> waits;
  std::string positions = describeSelf(pos, waits);
  std::string text = fmt::format(
      "seq {}\nstate {}\nstep {}\nphase {}\nstill_ms {}\nwaits {}\n", ++seq, st,
      pos.step, pos.phase, millisSince(progressAt, now), rankList(waits));
  if (!errorMessage.empty()) {
    std::string msg = errorMessage;
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    text += "msg " + msg + "\n";
  }
  text += positions;
  publishedAt = now;
  auto started = Clock::now();
  Status s = store->put(heartbeatKey(rank), text);
  if (!s) {
    if (!storeFailing)
      storeErrorSince = started;
    storeFailing = true;
    storeError = s.message();
  } else {
    storeFailing = false;
  }
}

void Watchdog::readPeers(bool all) {
  auto now = Clock::now();
  for (int r = 0; r < worldSize; ++r) {
    if (r == rank || (!all && !watches(r)))
      continue;
    std::string text;
    bool present = false;
    auto started = Clock::now();
    Status s = store->get(heartbeatKey(r), text, present);
    if (!s) {
      if (!storeFailing)
        storeErrorSince = started;
      storeFailing = true;
      storeError = s.message();
      return;
    }
    storeFailing = false;
    if (!present)
      continue;
    Peer &p = peers[r];
    std::string seqLine = text.substr(0, text.find('\n'));
    if (p.seen && seqLine == p.seq)
      continue;
    p.seen = true;
    p.seq = seqLine;
    p.text = text;
    p.changed = now;
    std::stringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      size_t sp = line.find(' ');
      std::string key = line.substr(0, sp),
                  value = sp == std::string::npos ? "" : line.substr(sp + 1);
      if (key == "state")
        p.state = value;
      else if (key == "still_ms")
        p.stillMs = std::atoll(value.c_str());
      else if (key == "waits")
        p.waits = parseRankList(value);
      else if (key == "step")
        p.step = std::atoll(value.c_str());
      else if (key == "phase")
        p.phase = std::atoi(value.c_str());
    }
  }
}

std::string Watchdog::settle(Abort &verdict) {
  std::lock_guard<std::mutex> lock(mu);
  std::string text;
  bool wrote = false, present = false;
  if (store->putOnce(kAbortKey, encodeAbort(verdict), wrote) &&
      store->get(kAbortKey, text, present) && present)
    decodeAbort(text, verdict);
  readPeers(/*all=*/true);
  return report(verdict);
}

void Watchdog::conclude(Abort verdict) {
  if (concluding.exchange(true))
    while (true)
      std::this_thread::sleep_for(std::chrono::seconds(1)); // another exits
  std::string text = settle(verdict);
  activeWatchdog = nullptr;
  setExitHook(nullptr);
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
  {
    // What the store's owner waits for (serveUntilPeersStop).
    std::lock_guard<std::mutex> lock(mu);
    state = "stopped";
    if (!storeFailing)
      publish("stopped");
  }
  if (storeOwner == rank)
    serveUntilPeersStop();
  if (verdict.culprit == rank)
    exitRank(fmt::format("rank {}: watchdog: this rank failed: {}", rank,
                         verdict.reason),
             1);
  std::fflush(stderr);
  if (beforePeerFailedExit)
    beforePeerFailedExit();
  exitRank(fmt::format("rank {}: stopping: rank {} failed (exit code {})", rank,
                       verdict.culprit, kExitPeerFailed),
           kExitPeerFailed);
}

void Watchdog::serveUntilPeersStop() {
  // The other ranks learn the verdict from the store this process serves
  // (they read only rank 0's heartbeat, not every rank's): keep it up until
  // each has stopped, gone silent, or `timeout` has passed.
  const auto silentAfter = 2 * publishEvery + std::chrono::milliseconds(500);
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu);
      readPeers(/*all=*/true);
    }
    auto now = Clock::now();
    bool waiting = false;
    for (int r = 0; r < worldSize; ++r)
      if (r != rank && peers[r].state != "stopped" &&
          peers[r].state != "done" && now - peers[r].changed < silentAfter)
        waiting = true;
    if (!waiting || storeFailing)
      return;
    std::this_thread::sleep_for(pollEvery);
  }
}

void Watchdog::ownFailure(const std::string &message) {
  if (concluding.exchange(true))
    return;
  Abort verdict{rank, message};
  std::replace(verdict.reason.begin(), verdict.reason.end(), '\n', ' ');
  std::string text = settle(verdict);
  activeWatchdog = nullptr;
  std::fputs(text.c_str(), stderr);
}

void Watchdog::streamFailed(const Status &status) {
  ExecPosition pos = exec.position();
  if (status.isDiverged() || !communicating(pos))
    exitRank(status.message());
  collectiveFailed(status);
}

void Watchdog::setActivity(const std::string &what) {
  std::lock_guard<std::mutex> lock(mu);
  activity = what;
  publish(state.c_str());
}

void Watchdog::collectiveFailed(const Status &status) {
  const std::string &message = status.message();
  {
    std::lock_guard<std::mutex> lock(mu);
    state = "error";
    errorMessage = message;
    publish("error");
  }
  std::fprintf(stderr,
               "piper-run: %s\npiper-run: rank %d: a communication failed; "
               "waiting up to %lld s for the watchdog to name the rank that "
               "failed\n",
               message.c_str(), rank,
               static_cast<long long>(timeout.count() / 1000 + 1));
  std::fflush(stderr);
  wake.notify_all();
  auto deadline = Clock::now() + timeout + std::chrono::seconds(1);
  while (Clock::now() < deadline && !concluding.load())
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (concluding.load())
    while (true) // the watchdog thread is exiting
      std::this_thread::sleep_for(std::chrono::seconds(1));
  exitRank(message);
}

void Watchdog::loop() {
  auto nextPublish = Clock::now() + publishEvery;
  auto nextPeers = Clock::now();
  while (!stopping.load()) {
    auto now = Clock::now();
    ExecPosition pos = exec.position();
    Abort verdict;
    bool found = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (pos.step != lastPos.step || pos.phase != lastPos.phase ||
          pos.instruction != lastPos.instruction) {
        lastPos = pos;
        progressAt = now;
      }
      // Every second, and at every poll where the position moved, so that a
      // rank that dies leaves a position at most a poll old.
      if (now >= nextPublish || progressAt > publishedAt) {
        publish(state.c_str());
        nextPublish = now + publishEvery;
      }
      if (now >= nextPeers) {
        readPeers();
        nextPeers = now + publishEvery / 2;
      }
      found = decide(verdict);
    }
    if (found && !stopping.load())
      conclude(verdict);
    std::unique_lock<std::mutex> lock(wakeMu);
    wake.wait_for(lock, pollEvery, [&] { return stopping.load(); });
  }
}

} // namespace piper::runtime
