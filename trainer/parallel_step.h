// One optimizer step of the parallel trainer on one rank of a Layout (TP x PP x DP, ZeRO 0/1):
// DP rank d runs state->grad_accum micro-batches of layout.micro_batch[d] sequences, the
// contiguous sample range that starts at grad_accum * sum(micro_batch[0..d-1]) (micro-batch j =
// samples start + j*mb .. +mb of step state->step), through the pipeline in the 1F1B order of
// trainer/pipeline_schedule.h (activations and their gradients exchanged with the neighbouring
// stages over groups.pp, one Comm::sendrecv per exchange); loss_scale = 1 / (global_batch *
// seq_len), so the summed gradients are those of the one-process mean loss. Then: the tied
// embedding's gradient summed over groups.embedding (pp > 1), the DP reduction of the optimizer
// (zero 0 all-reduce, zero 1 reduce-scatter), the global gradient norm (each element once, summed
// over the world), torch clip_grad_norm_, AdamW at the schedule's LR (zero 1: all-gather of the
// updated weights), state->step++.
// Every rank returns the same StepStats: the step's mean token loss, the norm before clipping,
// and compute / comm / idle seconds (idle: inside the pipeline exchanges), each the maximum over
// ranks. A rank whose step fails calls Comm::world().fail_all so that no peer waits for it.
// Thread safety: main thread only (Comm).
#pragma once

#include <functional>
#include <vector>

#include "formats/status.h"
#include "reshard/comm.h"
#include "reshard/layout.h"
#include "trainer/trainer_state.h"
#include "trainer/data.h"
#include "trainer/model.h"
#include "trainer/train_loop.h"
#include "trainer/zero_optimizer.h"

namespace ckpt::trainer {

// Called once per step, after the DP reduction and before clipping, with this rank's reduced
// gradients (ParallelOptimizer::grad_regions: zero 0 every Param box, zero 1 the own flat range;
// replicas included, so several ranks may give the same elements, equal).
template <class T>
using GradDump = std::function<Status(const std::vector<GradRegion<T>>&)>;

template <class T>
Result<StepStats> parallel_step(Model<T>& model, ParallelOptimizer<T>& opt, const TokenStream& data,
                                TrainerState* state, const Layout& layout, LayoutGroups& groups,
                                const GradDump<T>& dump = nullptr);

}  // namespace ckpt::trainer
