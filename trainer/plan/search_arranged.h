// One arrangement of TP groups into pipelines as the search values it (trainer/plan/search.h,
// docs/PLAN.md "Search at scale"): pipelines whose stages sit on equal places form a class, valued
// once (stage splits per class and micro-batch size, micro-batch allocation over the classes with
// their sizes), so that the work per arrangement grows with the distinct places, not the devices.
// Not thread safe (memoizes); one per visited arrangement.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "reshard/dist/cluster.h"
#include "trainer/plan/cost_model.h"
#include "trainer/plan/memory_model.h"
#include "trainer/plan/search_space.h"
#include "trainer/plan/stage_split.h"

namespace ckpt::trainer::search_detail {

struct Arranged {
  const ModelSpec* model = nullptr;
  // The groups and the arrangement (pipelines of group indices): make_classes reads them; the
  // search may drop them afterwards (the classes below are all the valuing needs).
  const std::vector<TpGroup>* groups = nullptr;
  Arrangement a;
  EmbeddedStageMemory* embedded = nullptr;      // memory model embedded; null: the formula
  std::vector<int> cls;                         // per pipeline: its class
  std::vector<int64_t> members;                 // per class: its pipelines
  std::vector<std::vector<StagePlace>> places;  // per class, per stage
  std::vector<std::vector<int>> tps;            // per class, per stage
  int64_t s = 1, m = 1;
  int zero_ways = 1;
  int ep = 1, etp = 0;  // expert parallelism of every stage (etp 0: = the stage's tp); the search sets them
  // Splits valued at or above it are not looked for (stage_split.h best_split): the search sets the
  // K-th best step time found; the allocation below is exact whenever its result is below it.
  double cutoff = kInfeasible;
  std::map<std::pair<size_t, int64_t>, SplitResult> memo;

  size_t classes() const { return places.size(); }
  StageCost cost(size_t k, int st, int n, int64_t b) const;
  // Class k's best split and value at micro-batch b (memoized).
  const SplitResult& pipeline(size_t k, int64_t b);
  double value(size_t k, int64_t b) { return pipeline(k, b).value; }
};

// The classes of x.a and their places. Two pipelines share a class when every stage has the same
// key: the class of its node (intra-node link, devices on the node), device type, tp, each
// neighbour's type and whether it shares the node, and the data-parallel link of its replicas
// (stage by stage: the first ranks of that stage index in every pipeline, as evaluate() takes
// them). With cross_node (TP groups spanning nodes) no two stages share a key.
void make_classes(const Cluster& c, const CostCalibration& cal, bool cross_node, Arranged& x);

// The min-max allocation of B sequences per micro-batch round over the pipelines (each >= 1):
// per pipeline b, and the predicted step time (the largest class value at its b). Empty b when
// nothing fits. Identical pipelines (one class) get the balanced allocation.
struct Allocation {
  std::vector<int64_t> b;
  double value = kInfeasible;
};
Allocation allocate(Arranged& x, int64_t B);

}  // namespace ckpt::trainer::search_detail
