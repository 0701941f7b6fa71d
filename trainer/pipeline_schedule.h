// The 1F1B pipeline schedule (Megatron-LM forward_backward_pipelining_without_interleaving):
// stage s of p with m micro-batches runs w = min(p-s-1, m) forwards (warm-up), then m-w pairs of
// one forward and one backward (steady state), then w backwards (cool-down). At most
// min(p-s, m) micro-batches are in flight on stage s (forward done, backward not yet), so the
// stage keeps that many activation slots; micro-batch j uses slot j % slots (in flight ones are
// consecutive).
// The point-to-point traffic around the actions is a list of exchanges, each one Comm::sendrecv:
// before action k, send what action k-1 produced for a neighbour and receive what action k needs.
// tests/trainer/pipeline_schedule_test.cc checks, for many (p, m), that every stage's exchanges
// complete under rendezvous sends (no deadlock) and match in order, also rank by rank when the
// stages have different TP sizes (pipe_receivers below).
// Pure functions; thread safe.
#pragma once

#include <vector>

namespace ckpt::trainer {

enum class PipeKind { kForward, kBackward };

struct PipeAction {
  PipeKind kind = PipeKind::kForward;
  int micro = 0;
  bool operator==(const PipeAction&) const = default;
};

// The actions of `stage` (0-based) of `stages` over micro-batches 0..micro_batches-1.
std::vector<PipeAction> one_f_one_b(int stage, int stages, int micro_batches);

// Activation slots stage `stage` needs: min(stages - stage, micro_batches), at least 1.
int pipe_slots(int stage, int stages, int micro_batches);

// One message of the pipeline: the activation (kForward) or its gradient (kBackward) of
// micro-batch `micro`, to or from stage `peer`. micro < 0: no message.
struct PipeMessage {
  PipeKind kind = PipeKind::kForward;
  int micro = -1;
  int peer = -1;
  bool none() const { return micro < 0; }
};

struct PipeExchange {
  PipeMessage send;  // the output of the previous action (forward, not last stage: activation to
                     // stage+1; backward, not first stage: input gradient to stage-1)
  PipeMessage recv;  // the input of the next action (forward, not first stage: activation from
                     // stage-1; backward, not last stage: output gradient from stage+1)
};

// exchanges[k] for k in 0..actions.size(): runs before action k (the last one after every action).
std::vector<PipeExchange> pipe_exchanges(const std::vector<PipeAction>& actions, int stage, int stages);

// Stage boundaries with different tensor-parallel sizes (the activation and its gradient are
// replicated over a stage's TP ranks): TP rank j of the receiving stage reads from TP rank
// j % tp_from of the sending stage. The TP ranks of the receiving stage (size tp_to) that TP rank
// t of the sending stage (size tp_from) sends to: t, t + tp_from, ... below tp_to (none when
// t >= tp_to). Each exchange of a rank posts all of them at once with its receive.
std::vector<int> pipe_receivers(int t, int tp_from, int tp_to);
inline int pipe_sender(int j, int tp_from) { return j % tp_from; }

}  // namespace ckpt::trainer
