// The 1F1B schedule against a naive simulation of the pipeline: every micro-batch runs forward
// then backward once per stage, the stages' lists are executable together (a forward needs the
// previous stage's forward, a backward the next stage's backward), the in-flight count stays
// within the slots, and the point-to-point exchanges complete under rendezvous sends (a send
// waits for the matching receive to be posted), messages matching in order; and the same rank by
// rank when the stages have different TP sizes (pipe_receivers / pipe_sender: one rank may send
// to several peers in one exchange, all posted at once).
#include "trainer/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

namespace ckpt::trainer {
namespace {

using Sched = std::vector<std::vector<PipeAction>>;

Sched all_stages(int p, int m) {
  Sched s;
  for (int st = 0; st < p; ++st) s.push_back(one_f_one_b(st, p, m));
  return s;
}

// Runs the stages' action lists, each in order, an action only when its inputs exist.
// Returns "" when all finish, else a description of the stuck state.
std::string simulate_actions(const Sched& sc, int p, int m) {
  std::vector<std::vector<bool>> fdone(p, std::vector<bool>(m)), bdone(p, std::vector<bool>(m));
  std::vector<size_t> pc(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      if (pc[s] == sc[s].size()) continue;
      const PipeAction& a = sc[s][pc[s]];
      bool ready;
      if (a.kind == PipeKind::kForward) {
        ready = s == 0 || fdone[s - 1][a.micro];
        if (ready) fdone[s][a.micro] = true;
      } else {
        ready = fdone[s][a.micro] && (s == p - 1 || bdone[s + 1][a.micro]);
        if (ready) bdone[s][a.micro] = true;
      }
      if (ready) ++pc[s], progress = true;
    }
  }
  for (int s = 0; s < p; ++s)
    if (pc[s] != sc[s].size()) return "stage " + std::to_string(s) + " stuck at action " + std::to_string(pc[s]);
  return "";
}

// Rendezvous model of Comm::sendrecv: each stage is inside one exchange at a time; a send and
// the peer's receive complete together when both are posted (same sender, tag = kind). An
// exchange ends when both of its halves completed.
std::string simulate_exchanges(const std::vector<std::vector<PipeExchange>>& ex, int p) {
  std::vector<size_t> pc(p, 0);
  std::vector<bool> sent(p, false), got(p, false);
  auto settle = [&](int s) {
    while (pc[s] < ex[s].size()) {
      const PipeExchange& e = ex[s][pc[s]];
      if (e.send.none()) sent[s] = true;
      if (e.recv.none()) got[s] = true;
      if (!sent[s] || !got[s]) return;
      ++pc[s];
      sent[s] = got[s] = false;
    }
  };
  for (int s = 0; s < p; ++s) settle(s);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      if (pc[s] == ex[s].size() || sent[s]) continue;
      const PipeMessage& msg = ex[s][pc[s]].send;
      const int q = msg.peer;
      if (q < 0 || q >= p) return "stage " + std::to_string(s) + " sends to stage " + std::to_string(q);
      if (pc[q] == ex[q].size() || got[q]) continue;
      const PipeMessage& want = ex[q][pc[q]].recv;
      if (want.none() || want.peer != s || want.kind != msg.kind) continue;
      if (want.micro != msg.micro)
        return "stage " + std::to_string(q) + " receives micro " + std::to_string(want.micro) + " but stage " +
               std::to_string(s) + " sends micro " + std::to_string(msg.micro);
      sent[s] = got[q] = true;
      settle(s);
      settle(q);
      progress = true;
    }
  }
  for (int s = 0; s < p; ++s)
    if (pc[s] != ex[s].size()) return "deadlock: stage " + std::to_string(s) + " at exchange " + std::to_string(pc[s]);
  return "";
}

// Rank-level rendezvous model of Comm::exchange for stages of TP sizes `tps`: rank (s, t) posts,
// in its current exchange, one send to every TP rank pipe_receivers(t, tp(s), tp(q)) of the peer
// stage q and its receive from TP rank pipe_sender(t, tp(q)) of q; a send completes with the
// receiver's matching receive; an exchange ends when all its messages completed.
struct SimRank {
  int s = 0, t = 0;
  size_t pc = 0;
  std::vector<bool> sent;  // per receiver of the current exchange's send
  bool got = false;
};

std::string simulate_ranks(const std::vector<int>& tps, int m) {
  const int p = static_cast<int>(tps.size());
  std::vector<std::vector<PipeExchange>> ex;
  for (int s = 0; s < p; ++s) ex.push_back(pipe_exchanges(one_f_one_b(s, p, m), s, p));
  std::vector<SimRank> ranks;
  std::vector<int> first(p + 1, 0);
  for (int s = 0; s < p; ++s) {
    first[s + 1] = first[s] + tps[s];
    for (int t = 0; t < tps[s]; ++t) ranks.push_back({s, t, 0, {}, false});
  }
  auto receivers = [&](const SimRank& r) {
    const PipeMessage& msg = ex[r.s][r.pc].send;
    return msg.none() ? std::vector<int>{} : pipe_receivers(r.t, tps[r.s], tps[msg.peer]);
  };
  auto settle = [&](SimRank& r) {
    while (r.pc < ex[r.s].size()) {
      if (r.sent.empty()) r.sent.assign(receivers(r).size(), false);
      const bool all_sent = std::find(r.sent.begin(), r.sent.end(), false) == r.sent.end();
      if (!all_sent || !(r.got || ex[r.s][r.pc].recv.none())) return;
      ++r.pc;
      r.sent.clear();
      r.got = false;
    }
  };
  for (SimRank& r : ranks) settle(r);
  for (bool progress = true; progress;) {
    progress = false;
    for (SimRank& r : ranks) {
      if (r.pc == ex[r.s].size()) continue;
      const PipeMessage& msg = ex[r.s][r.pc].send;
      const std::vector<int> to = receivers(r);
      for (size_t i = 0; i < to.size() && r.pc < ex[r.s].size(); ++i) {
        if (r.sent[i]) continue;
        SimRank& q = ranks[static_cast<size_t>(first[msg.peer] + to[i])];
        if (q.pc == ex[q.s].size() || q.got) continue;
        const PipeMessage& want = ex[q.s][q.pc].recv;
        if (want.none() || want.peer != r.s || want.kind != msg.kind || pipe_sender(q.t, tps[r.s]) != r.t) continue;
        if (want.micro != msg.micro) return "micro-batches out of order at stage " + std::to_string(q.s);
        r.sent[i] = q.got = true;
        settle(q);
        progress = true;
      }
      settle(r);
    }
  }
  for (const SimRank& r : ranks)
    if (r.pc != ex[r.s].size())
      return "deadlock: stage " + std::to_string(r.s) + " tp rank " + std::to_string(r.t) + " at exchange " +
             std::to_string(r.pc);
  return "";
}

TEST(PipelineSchedule, BoundaryPeersCoverEveryReceiverOnce) {
  for (int a = 1; a <= 4; ++a)
    for (int b = 1; b <= 4; ++b) {
      std::vector<int> from(b, -1);
      for (int t = 0; t < a; ++t)
        for (int j : pipe_receivers(t, a, b)) {
          ASSERT_EQ(from[j], -1) << a << "->" << b;
          from[j] = t;
        }
      for (int j = 0; j < b; ++j) EXPECT_EQ(from[j], pipe_sender(j, a)) << a << "->" << b << " receiver " << j;
    }
}

TEST(PipelineSchedule, RanksOfMixedTpStagesCompleteTheirExchanges) {
  const std::vector<std::vector<int>> cases = {{2, 1}, {1, 2}, {1, 2, 1}, {2, 1, 1}, {1, 3, 2}, {3, 2, 1, 2}, {4, 1, 4}};
  for (const auto& tps : cases)
    for (int m = 1; m <= 6; ++m) {
      std::string name;
      for (int t : tps) name += std::to_string(t) + " ";
      EXPECT_EQ(simulate_ranks(tps, m), "") << "tps " << name << "m=" << m;
    }
}

TEST(PipelineSchedule, EveryMicroBatchForwardThenBackwardOnce) {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 9; ++m)
      for (int s = 0; s < p; ++s) {
        auto acts = one_f_one_b(s, p, m);
        ASSERT_EQ(acts.size(), static_cast<size_t>(2 * m));
        std::vector<int> fpos(m, -1), bpos(m, -1);
        for (size_t k = 0; k < acts.size(); ++k) {
          auto& pos = acts[k].kind == PipeKind::kForward ? fpos : bpos;
          ASSERT_EQ(pos[acts[k].micro], -1) << "p=" << p << " m=" << m << " s=" << s;
          pos[acts[k].micro] = static_cast<int>(k);
        }
        for (int j = 0; j < m; ++j) EXPECT_LT(fpos[j], bpos[j]) << "p=" << p << " m=" << m << " s=" << s;
      }
}

TEST(PipelineSchedule, InFlightWithinSlotsAndSlotsDistinct) {
  for (int p = 1; p <= 6; ++p)
    for (int m = 1; m <= 9; ++m)
      for (int s = 0; s < p; ++s) {
        const int slots = pipe_slots(s, p, m);
        EXPECT_EQ(slots, std::min(p - s, m));
        std::set<int> live;  // slots of the micro-batches in flight
        int max_in_flight = 0;
        for (const PipeAction& a : one_f_one_b(s, p, m)) {
          if (a.kind == PipeKind::kForward) {
            ASSERT_TRUE(live.insert(a.micro % slots).second) << "slot reused while in flight, p=" << p << " m=" << m;
          } else {
            live.erase(a.micro % slots);
          }
          max_in_flight = std::max(max_in_flight, static_cast<int>(live.size()));
        }
        EXPECT_LE(max_in_flight, p - s);
        EXPECT_EQ(max_in_flight, slots) << "p=" << p << " m=" << m << " s=" << s;
      }
}

TEST(PipelineSchedule, WarmUpSteadyCoolDownCounts) {
  auto acts = one_f_one_b(0, 4, 6);  // warm-up 3
  std::string got;
  for (auto& a : acts) got += (a.kind == PipeKind::kForward ? "F" : "B") + std::to_string(a.micro) + " ";
  EXPECT_EQ(got, "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  acts = one_f_one_b(3, 4, 3);  // last stage: no warm-up
  got.clear();
  for (auto& a : acts) got += (a.kind == PipeKind::kForward ? "F" : "B") + std::to_string(a.micro) + " ";
  EXPECT_EQ(got, "F0 B0 F1 B1 F2 B2 ");
  acts = one_f_one_b(0, 5, 2);  // fewer micro-batches than stages: all forwards first
  got.clear();
  for (auto& a : acts) got += (a.kind == PipeKind::kForward ? "F" : "B") + std::to_string(a.micro) + " ";
  EXPECT_EQ(got, "F0 F1 B0 B1 ");
}

TEST(PipelineSchedule, StagesExecutableTogether) {
  for (int p = 1; p <= 7; ++p)
    for (int m = 1; m <= 10; ++m) EXPECT_EQ(simulate_actions(all_stages(p, m), p, m), "") << "p=" << p << " m=" << m;
}

TEST(PipelineSchedule, ExchangesCompleteUnderRendezvousSends) {
  for (int p = 1; p <= 7; ++p)
    for (int m = 1; m <= 10; ++m) {
      std::vector<std::vector<PipeExchange>> ex;
      for (int s = 0; s < p; ++s) ex.push_back(pipe_exchanges(one_f_one_b(s, p, m), s, p));
      EXPECT_EQ(simulate_exchanges(ex, p), "") << "p=" << p << " m=" << m;
    }
}

TEST(PipelineSchedule, ExchangesCarryEveryMessageOnce) {
  const int p = 4, m = 5;
  for (int s = 0; s < p; ++s) {
    int sends = 0, recvs = 0;
    for (const PipeExchange& e : pipe_exchanges(one_f_one_b(s, p, m), s, p)) sends += !e.send.none(), recvs += !e.recv.none();
    const int links = (s > 0) + (s < p - 1);
    EXPECT_EQ(sends, links * m);
    EXPECT_EQ(recvs, links * m);
  }
  // The simulator catches a wrong order: a stage that receives the gradients in reverse order.
  std::vector<std::vector<PipeExchange>> ex;
  for (int s = 0; s < 2; ++s) ex.push_back(pipe_exchanges(one_f_one_b(s, 2, 3), s, 2));
  std::vector<PipeAction> bad = {{PipeKind::kForward, 0}, {PipeKind::kForward, 1}, {PipeKind::kForward, 2},
                                 {PipeKind::kBackward, 2}, {PipeKind::kBackward, 1}, {PipeKind::kBackward, 0}};
  ex[0] = pipe_exchanges(bad, 0, 2);
  EXPECT_NE(simulate_exchanges(ex, 2), "");
}

TEST(PipelineSchedule, OneStageIsForwardBackwardPerMicroBatch) {
  auto acts = one_f_one_b(0, 1, 4);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(acts[2 * j], (PipeAction{PipeKind::kForward, j}));
    EXPECT_EQ(acts[2 * j + 1], (PipeAction{PipeKind::kBackward, j}));
  }
  for (const PipeExchange& e : pipe_exchanges(acts, 0, 1)) EXPECT_TRUE(e.send.none() && e.recv.none());
}

}  // namespace
}  // namespace ckpt::trainer
