// One optimizer step of the parallel trainer on one rank of a Layout (either form of
// reshard/layout/layout.h: pipelines of stages, each stage with its own tp; ZeRO 0/1). The rank is
// (pipeline p, stage s, TP rank t) = layout.place_of_rank(rank) = (groups.dp_rank, pp_rank,
// tp_rank). Pipeline p runs state->grad_accum micro-batches of layout.pipeline_micro_batch(p)
// sequences, the contiguous sample range that starts at grad_accum * sum(micro-batch of the
// pipelines before p) (micro-batch j = samples start + j*mb .. +mb of step state->step), through
// its stages in the 1F1B order of trainer/pipeline_schedule.h. Activations at a stage boundary
// are the full [mb*seq, D], replicated over the TP ranks of a stage, so the sizes on both sides
// may differ: forward, TP rank j of stage s+1 receives from TP rank j % tp(s) of stage s;
// backward, TP rank i of stage s receives from TP rank i % tp(s+1) of stage s+1; one rank may
// thus send to several peers. Every exchange of the paired schedule posts all its sends and its
// receive at once (Comm::exchange over groups.world); all TP ranks of a stage run the same
// schedule, so the pairing stays deadlock-free. MoE models (ep = 1: every expert whole on its stage):
// each forward message also carries the micro-batch's router statistics so far and each backward
// one the load-balancing loss's aux_dp (Model::forward_tail), so every pipeline has one
// load-balancing loss per micro-batch, as one process running the same micro-batches. loss_scale = 1 / (global_batch * seq_len), so the
// summed gradients are those of the one-process mean loss. Then: the replica sums of the
// optimizer (ParallelOptimizer::reduce_gradients: zero 0 every gradient over every (pipeline,
// stage) holding it, tied embedding included; zero 1 the tied embedding over the pipeline, then
// the reduce-scatter over the DP group), the global gradient norm (each element once, summed
// over the world), torch clip_grad_norm_, AdamW at the schedule's LR (zero 1: all-gather of the
// updated weights), state->step++.
// Every rank returns the same StepStats: the step's mean token loss, the norm before clipping,
// and compute / comm / idle seconds (idle: inside the pipeline exchanges), each the maximum over
// ranks. A rank whose step fails calls Comm::world().fail_all so that no peer waits for it.
// stretch > 1 (`ckpt train --emulate`, trainer/emulate.h): after every compute section (the
// forward or backward of a micro-batch without its TP all-reduces, the optimizer update) the rank
// sleeps its length x (stretch - 1), counted as compute; the numbers are unchanged.
// StepStats::rank_compute_s: every rank's own compute seconds, in rank order.
// Thread safety: main thread only (Comm).
#pragma once

#include <functional>
#include <vector>

#include "formats/base/status.h"
#include "reshard/dist/comm.h"
#include "reshard/layout/layout.h"
#include "trainer/data.h"
#include "trainer/model/model.h"
#include "trainer/optim/zero_optimizer.h"
#include "trainer/state/trainer_state.h"
#include "trainer/train_loop.h"

namespace ckpt::trainer {

// Called once per step, after the replica sums and before clipping, with this rank's reduced
// gradients (ParallelOptimizer::grad_regions: zero 0 every Param box, zero 1 the own flat range;
// replicas included, so several ranks may give the same elements, equal).
template <class T>
using GradDump = std::function<Status(const std::vector<GradRegion<T>>&)>;

template <class T>
Result<StepStats> parallel_step(Model<T>& model, ParallelOptimizer<T>& opt, const TokenStream& data,
                                TrainerState* state, const Layout& layout, LayoutGroups& groups,
                                const GradDump<T>& dump = nullptr, double stretch = 1.0);

}  // namespace ckpt::trainer
