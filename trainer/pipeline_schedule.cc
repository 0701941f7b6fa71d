#include "trainer/pipeline_schedule.h"

#include <algorithm>

namespace ckpt::trainer {

std::vector<PipeAction> one_f_one_b(int stage, int stages, int micro_batches) {
  const int m = std::max(micro_batches, 0);
  const int warm = std::clamp(stages - stage - 1, 0, m);
  const int steady = m - warm;
  std::vector<PipeAction> out;
  out.reserve(static_cast<size_t>(2 * m));
  for (int i = 0; i < warm; ++i) out.push_back({PipeKind::kForward, i});
  for (int i = 0; i < steady; ++i) {
    out.push_back({PipeKind::kForward, warm + i});
    out.push_back({PipeKind::kBackward, i});
  }
  for (int i = 0; i < warm; ++i) out.push_back({PipeKind::kBackward, steady + i});
  return out;
}

int pipe_slots(int stage, int stages, int micro_batches) {
  return std::max(1, std::min(stages - stage, micro_batches));
}

std::vector<PipeExchange> pipe_exchanges(const std::vector<PipeAction>& actions, int stage, int stages) {
  const bool first = stage == 0, last = stage == stages - 1;
  std::vector<PipeExchange> out(actions.size() + 1);
  for (size_t k = 0; k < actions.size(); ++k) {
    const PipeAction& a = actions[k];
    const bool fwd = a.kind == PipeKind::kForward;
    // Input of action k.
    if (fwd && !first) out[k].recv = {PipeKind::kForward, a.micro, stage - 1};
    if (!fwd && !last) out[k].recv = {PipeKind::kBackward, a.micro, stage + 1};
    // Output of action k, sent before action k + 1.
    if (fwd && !last) out[k + 1].send = {PipeKind::kForward, a.micro, stage + 1};
    if (!fwd && !first) out[k + 1].send = {PipeKind::kBackward, a.micro, stage - 1};
  }
  return out;
}

std::vector<int> pipe_receivers(int t, int tp_from, int tp_to) {
  std::vector<int> out;
  for (int j = t; j < tp_to && tp_from > 0; j += tp_from) out.push_back(j);
  return out;
}

}  // namespace ckpt::trainer
