// The search space of trainer/plan/search.h: TP groups and their arrangements into pipelines.
// Pure functions; thread safe.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "reshard/dist/cluster.h"
#include "trainer/plan/cost_model.h"

namespace ckpt::trainer::search_detail {

struct TpGroup {
  int type = 0, tp = 1, node = 0;
  std::vector<int> ranks;  // cluster ranks, tp order
  int cls = 0;             // groups of one class (node, type) are interchangeable
};

using Arrangement = std::vector<std::vector<int>>;  // pipelines of group indices in stage order

// The device types with devices, and for each the tp sizes that divide heads, kv heads, ffn and
// (cross_node false) every node's count of that type.
std::vector<int> used_types(const Cluster& c);
std::vector<std::vector<int>> tp_choices(const ModelSpec& m, const Cluster& c, const std::vector<int>& types, bool cross_node);
// The groups for one tp per used type (tp_of[i] for types[i]): per node, consecutive devices of the
// type (cross_node: the type's devices in rank order).
std::vector<TpGroup> make_groups(const Cluster& c, const std::vector<int>& types, const std::vector<int>& tp_of, bool cross_node);
// Every arrangement of the groups into ordered pipelines of at most max_stages stages, one per
// class pattern (interchangeable groups swapped count once).
void all_arrangements(const std::vector<TpGroup>& g, int max_stages, std::vector<Arrangement>& out);
// Pipelines of equal composition: P divides every type's group count; each pipeline takes its
// share of each type's groups (in rank order), the types in blocks, in every order of the types.
void uniform_arrangements(const std::vector<TpGroup>& g, int num_types, int max_stages, std::vector<Arrangement>& out);
// The same space described instead of listed (the search builds an arrangement when it visits
// it): the pipeline counts P (ascending), the types of the groups (ascending; every permutation is
// an order), and the arrangement of one P and order.
std::vector<int> uniform_pipeline_counts(const std::vector<TpGroup>& g, int max_stages);
std::vector<int> group_types(const std::vector<TpGroup>& g);
Arrangement uniform_arrangement(const std::vector<TpGroup>& g, int P, const std::vector<int>& order);
// The MoE expert-parallel dimension (docs/PLAN.md "Mixture of experts") is not a point of this
// space: it changes stage costs and memory, not the arrangement of the groups; the search values
// every (ep, etp) of an arrangement of identical pipelines of one tp (ep_choices; search.cc).
// Every (ep, etp) but (1, tp) that the model and a stage of tp ranks in P replicas take
// (ModelSpec::ep_fits): ep dividing the experts, etp dividing tp, ep x etp dividing tp x P.
std::vector<std::pair<int, int>> ep_choices(const ModelSpec& m, int tp, int P);

}  // namespace ckpt::trainer::search_detail
