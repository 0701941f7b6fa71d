#include "reshard/dist/comm_wait.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace ckpt::comm_detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kFailTag = 1;                // fail_all messages on the control communicator
constexpr double kDefaultTimeoutS = 600;   // CKPT_COMM_TIMEOUT_S unset or invalid
constexpr double kExitBarrierMaxS = 10;    // abandon(): longest wait for the other ranks
constexpr double kPeerFailureGraceS = 0.5;  // wait(): an operation in flight may still complete
// wait(): for its first 200 us a wait only yields the CPU between tests (an operation whose peers
// are there completes at the latency of a blocking call: 1000 floats over 2 oversubscribed ranks
// in ~6 us, against ~0.5 ms with sleeps alone); then it sleeps, 20 us growing to 1 ms.
constexpr double kYieldPhaseS = 200e-6;

struct State {
  bool started = false;
  bool skip_finalize = false;  // requests were left pending, or abandon() ran
  int rank = 0, size = 1;
  MPI_Comm ctrl = MPI_COMM_NULL;
  double timeout_s = kDefaultTimeoutS;
  double waited_s = 0;               // total time spent in wait() (Comm::seconds_waiting)
  Status failure;
  std::string sent_text;             // the JSON fail_local() sends (alive while the sends are)
  std::vector<MPI_Request> sends;    // fail_local()'s sends, never waited for
};

double timeout_from_env();

State& state() {
  static State s = [] {
    State st;
    st.timeout_s = timeout_from_env();
    return st;
  }();
  return s;
}

double timeout_from_env() {
  const char* v = std::getenv("CKPT_COMM_TIMEOUT_S");
  if (!v || !*v) return kDefaultTimeoutS;
  char* end = nullptr;
  const double t = std::strtod(v, &end);
  return end && *end == '\0' && t > 0 ? t : kDefaultTimeoutS;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sleeps `pause`, then doubles it up to 1 ms.
void back_off(std::chrono::microseconds& pause) {
  std::this_thread::sleep_for(pause);
  pause = std::min(pause * 2, std::chrono::microseconds(1000));
}

// Lets MPI progress fail_local()'s sends (their completion is never required).
void push_sends() {
  State& s = state();
  if (s.sends.empty()) return;
  int done = 0;
  MPI_Testall(static_cast<int>(s.sends.size()), s.sends.data(), &done, MPI_STATUSES_IGNORE);
  if (done) s.sends.clear();
}

// Receives a failure a peer sent on the control channel, if one is there: the failure of this
// process from now on ("rank R: ..."). Returns whether one arrived.
bool peer_failure() {
  State& s = state();
  if (s.ctrl == MPI_COMM_NULL) return false;
  int flag = 0;
  MPI_Status ms;
  if (MPI_Iprobe(MPI_ANY_SOURCE, kFailTag, s.ctrl, &flag, &ms) != MPI_SUCCESS || !flag) return false;
  int len = 0;
  MPI_Get_count(&ms, MPI_CHAR, &len);
  std::string text(static_cast<size_t>(std::max(len, 0)), '\0');
  MPI_Request req = MPI_REQUEST_NULL;
  int done = 0;
  if (MPI_Irecv(text.data(), len, MPI_CHAR, ms.MPI_SOURCE, kFailTag, s.ctrl, &req) == MPI_SUCCESS) {
    // The sender progresses its send while it waits to exit (abandon); bounded all the same.
    const auto t0 = Clock::now();
    auto pause = std::chrono::microseconds(20);
    while (MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && seconds_since(t0) < kExitBarrierMaxS)
      back_off(pause);
  }
  Status why = done ? Status::from_json(text) : Status();
  if (why.ok()) why = Status::Error("PeerFailed", "a rank stopped the job (its message could not be received)");
  if (s.failure.ok()) s.failure = std::move(why).with_context("rank " + std::to_string(ms.MPI_SOURCE));
  if (!done) s.skip_finalize = true;
  return true;
}

void finalize_at_exit() {
  State& s = state();
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) return;
  (void)peer_failure();  // a peer failed: MPI_Finalize could wait for it forever
  if (s.skip_finalize || !s.failure.ok()) return;
  MPI_Comm_free(&s.ctrl);
  MPI_Finalize();
}

// Leaves the requests of a failed wait to MPI: receives (index >= first_recv) are cancelled so
// that a late message does not land in the caller's buffer; MPI_Finalize will be skipped.
void leave(MPI_Request* reqs, int n, int first_recv) {
  state().skip_finalize = true;
  if (first_recv < 0) return;
  for (int i = first_recv; i < n; ++i)
    if (reqs[i] != MPI_REQUEST_NULL) {
      MPI_Cancel(&reqs[i]);
      MPI_Request_free(&reqs[i]);
    }
}

Status timeout_status(const OpInfo& info, double waited) {
  std::string what = std::string(info.op) + (*info.type ? std::string(" (") + info.type + ")" : std::string()) +
                     " on a communicator of " + std::to_string(info.comm_size) + " ranks, " +
                     std::to_string(info.count) + " elements";
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.1f", waited);
  return Status::Error("CommTimeout", what + ": not complete after " + secs +
                                          " s (CKPT_COMM_TIMEOUT_S); a rank did not reach the matching call");
}

}  // namespace

void start_mpi(int* rank, int* size) {
  State& s = state();
  if (!s.started) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
      int provided = 0;
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
      std::atexit(finalize_at_exit);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s.size);
    MPI_Comm_dup(MPI_COMM_WORLD, &s.ctrl);
    MPI_Comm_set_errhandler(s.ctrl, MPI_ERRORS_RETURN);
    s.started = true;
  }
  *rank = s.rank;
  *size = s.size;
}

bool mpi_started() { return state().started; }
double timeout_s() { return state().timeout_s; }
void set_timeout_s(double seconds) { state().timeout_s = seconds; }
int world_rank() { return state().rank; }
const Status& failure() { return state().failure; }

void fail_local(const Status& why) {
  State& s = state();
  if (!s.failure.ok()) return;
  const Status w = why.ok() ? Status::Error("PeerFailed", "fail_all() was called without an error") : why;
  s.failure = Status(w).with_context("rank " + std::to_string(s.rank));
  if (!s.started || s.size == 1) return;
  s.sent_text = w.to_json();
  for (int r = 0; r < s.size; ++r) {
    if (r == s.rank) continue;
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Isend(s.sent_text.data(), static_cast<int>(s.sent_text.size()), MPI_CHAR, r, kFailTag, s.ctrl, &req) ==
        MPI_SUCCESS)
      s.sends.push_back(req);
  }
  push_sends();
}

Status mpi_status(int rc, const char* op) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return Status::Error("Mpi", std::string("MPI ") + op + " failed: " + std::string(msg, static_cast<size_t>(len)));
}

Status wait(MPI_Request* reqs, int n, const OpInfo& info, int first_recv) {
  State& s = state();
  const auto t0 = Clock::now();
  struct AddWaited {
    State& s;
    Clock::time_point t0;
    ~AddWaited() { s.waited_s += seconds_since(t0); }
  } add_waited{s, t0};
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    int done = 0;
    const int rc = MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) {
      leave(reqs, n, first_recv);
      fail_local(mpi_status(rc, info.op));
      return s.failure;
    }
    if (done) return Status::Ok();
    if (peer_failure()) {
      // A peer that completed this operation may fail right after it (e.g. it printed an error
      // all ranks agreed on): let an operation already in flight finish first, so every rank
      // returns the agreed status rather than the peer's failure notice.
      const auto grace = Clock::now();
      while (!done && seconds_since(grace) < kPeerFailureGraceS) {
        std::this_thread::yield();
        if (MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) break;
      }
      if (done) return Status::Ok();
      leave(reqs, n, first_recv);
      return s.failure;
    }
    const double waited = seconds_since(t0);
    if (waited > s.timeout_s) {
      leave(reqs, n, first_recv);
      fail_local(timeout_status(info, waited));
      return s.failure;
    }
    if (waited < kYieldPhaseS)
      std::this_thread::yield();
    else
      back_off(pause);
  }
}

double seconds_waiting() { return state().waited_s; }

void abandon(const Status& why) {
  State& s = state();
  if (!s.started) return;
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) return;
  fail_local(why);  // no-op when a failure is already known (a peer's, or this rank's own)
  s.skip_finalize = true;
  if (s.size == 1) return;
  // Exit barrier on the control communicator: every rank stopping on this failure reaches it
  // after printing its message; a rank that does not (busy, or finished) is not waited for long.
  MPI_Request b = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(s.ctrl, &b) != MPI_SUCCESS) return;
  const auto t0 = Clock::now();
  const double bound = std::min(s.timeout_s, kExitBarrierMaxS);
  auto pause = std::chrono::microseconds(20);
  int done = 0;
  while (MPI_Test(&b, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done && seconds_since(t0) < bound) {
    push_sends();
    back_off(pause);
  }
}

}  // namespace ckpt::comm_detail
