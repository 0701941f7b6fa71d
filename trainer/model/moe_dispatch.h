// Expert parallelism of the MoE MLP (docs/MOE.md "Expert parallelism in the trainer"): the groups
// of a rank and the collectives that move routed rows between them.
// Groups (both layout forms, from the rank's stage view): the tp x dp ranks of a stage view regrouped as etp x ep x edp by
// Layout::expert_coord (the store's definition of the expert boxes):
//   ep  group: same stage, etp and edp rank; ordered by ep rank (the all-to-all of the rows)
//   etp group: same stage, ep and edp rank; ordered by etp rank (the gather / reduce-scatter of
//              the rows an expert's F slices see)
// (the edp group, same stage, etp and ep rank, shares ZeRO-1's expert buffers: the optimizer
// splits it from the buffers' members, trainer/optim/zero_optimizer.h) and the stage's TP group
// (each TP rank routes its block of the replicated tokens).
// Row collectives: rows of D values, counts known on both sides (exchanged first as int64), every
// send and receive posted at once (Comm::exchange), own blocks copied locally, empty ones skipped.
// Thread safety: main thread only (Comm).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "formats/base/status.h"
#include "reshard/dist/comm.h"
#include "reshard/layout/layout.h"

namespace ckpt::trainer {

// Whether the MoE layers of a stage (its view, Layout::stage_view) run through expert groups:
// expert parallel, or tp > 1 at ep 1 (the store places the experts as dense MLPs then, their
// width split over TP: the groups of etp = tp, the same path).
inline bool stage_uses_expert_groups(const Layout& view) { return view.expert_parallel() || view.tp > 1; }
// Whether any stage of `layout` does (both forms).
bool layout_uses_expert_groups(const Layout& layout);

struct ExpertGroups {
  Layout::ExpertCoord coord;  // this rank's (etp, ep, edp) ranks
  int ep_size = 1, etp_size = 1, edp_size = 1;
  Comm ep, etp;               // split from the world (ranks in the order above)
  Comm* tp = nullptr;         // the stage's TP group (not owned); null or size 1: no token split
  double a2a_s = 0;           // seconds in the dispatch / combine collectives since the last take_a2a_s
  double take_a2a_s() {
    const double s = a2a_s;
    a2a_s = 0;
    return s;
  }

  // Collective over `world` (every rank calls it with the same expert-parallel layout, either
  // form): the groups of rank (pipeline, stage, tp_rank) from its stage view
  // (Layout::stage_view: the stage's tp, ep, etp; its experts over the stage's ranks of every
  // pipeline when the pipelines are uniform, else over the pipeline's own tp ranks); null when
  // the rank's stage uses none (stage_uses_expert_groups). tp: the stage's TP group.
  static Result<std::unique_ptr<ExpertGroups>> make(Comm& world, const Layout& layout, int pipeline, int stage,
                                                    int tp_rank, Comm* tp);
  // make() for an MoE model (`moe`) under a layout_uses_expert_groups layout, else null (the groups: g's).
  static Result<std::unique_ptr<ExpertGroups>> make_if_expert_parallel(Comm& world, const Layout& layout, bool moe,
                                                                       LayoutGroups& g);
};

// The first of the rows [n*r/size, n*(r+1)/size) that rank r of `size` takes of n rows.
inline int64_t row_block_begin(int64_t n, int r, int size) { return n * r / size; }

// counts out: block j (m values) of `send` [size*m] goes to peer j; recv [size*m]: block i from peer i.
Status exchange_counts(Comm& c, const std::vector<int64_t>& send, int64_t m, std::vector<int64_t>* recv);

// All-to-all of rows: send [sum send_rows, D], send_rows[j] rows for peer j in peer order; recv
// [sum recv_rows, D], recv_rows[i] rows from peer i in peer order.
template <class T>
Status exchange_rows(Comm& c, const T* send, const std::vector<int64_t>& send_rows, T* recv,
                     const std::vector<int64_t>& recv_rows, int64_t D);

// All-gather of blocks of rows[i] rows: out [sum rows, D] in peer order; mine [rows[me], D] may be
// out's own block (in place).
template <class T>
Status gather_rows(Comm& c, const T* mine, const std::vector<int64_t>& rows, T* out, int64_t D);

// Reduce-scatter of blocks of rows[i] rows: out [rows[me], D] = the sum over peers of their
// block `me` of in [sum rows, D]. out must not overlap in.
template <class T>
Status scatter_sum_rows(Comm& c, const T* in, const std::vector<int64_t>& rows, T* out, int64_t D);

}  // namespace ckpt::trainer
