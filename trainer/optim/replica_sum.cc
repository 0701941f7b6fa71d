#include "trainer/optim/replica_sum.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "reshard/layout/tensor_placement.h"

namespace ckpt::trainer {

namespace replica_sum_internal {  // named: its types appear in ReplicaSum::Impl (unity builds)

// A rank whose box of a tensor is not empty.
struct Holder {
  int rank = 0;
  RankPlace place;
  Box box;
};

// A part of a tensor and the holders (indices into the holder list, ascending) whose box holds it.
struct Piece {
  Box box;
  std::vector<int> holders;
};

// A piece of one tensor (index into the tensor list) in a holder set's buffer.
struct Cell {
  int tensor = 0;
  Box box;
};

// One holder set of the world's plan: the ranks holding its cells and the ranks adding their
// values (the lowest TP rank of each (pipeline, stage) among them).
struct SetPlan {
  std::vector<int> ranks;          // ascending
  std::vector<int> contributors;   // ascending
  std::map<int, std::vector<Box>> cells;  // tensor index -> disjoint boxes
};

struct Plan {
  std::vector<SetPlan> sets;                  // in the global order (first appearance)
  std::map<std::vector<int>, int> set_index;  // ranks -> index into sets
};

std::string ranks_to_string(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s + "]";
}

// Cuts the holders' boxes into disjoint pieces, each wholly inside or wholly outside every holder's
// box: every holder's box in turn splits the pieces so far (intersect / subtract_box) and adds the
// part of it that no piece covers yet.
std::vector<Piece> cut_pieces(const std::vector<Holder>& hs) {
  std::vector<Piece> pieces;
  for (int k = 0; k < static_cast<int>(hs.size()); ++k) {
    std::vector<Piece> next;
    std::vector<Box> rest{hs[k].box};  // the part of holder k's box outside every piece so far
    for (Piece& p : pieces) {
      const std::optional<Box> x = intersect(p.box, hs[k].box);
      if (!x) {
        next.push_back(std::move(p));
        continue;
      }
      std::vector<Box> outside, rest2;
      subtract_box(p.box, *x, outside);
      for (Box& b : outside) next.push_back({std::move(b), p.holders});
      for (const Box& r : rest) {
        if (const std::optional<Box> y = intersect(r, *x)) {
          subtract_box(r, *y, rest2);
        } else {
          rest2.push_back(r);
        }
      }
      rest = std::move(rest2);
      p.holders.push_back(k);
      next.push_back({*x, std::move(p.holders)});
    }
    for (Box& r : rest) next.push_back({std::move(r), {k}});
    pieces = std::move(next);
  }
  return pieces;
}

// The lowest rank holding piece `pc`.
int lowest_rank(const std::vector<Holder>& hs, const Piece& pc) {
  int r = hs[static_cast<size_t>(pc.holders.at(0))].rank;
  for (int k : pc.holders) r = std::min(r, hs[static_cast<size_t>(k)].rank);
  return r;
}

bool row_major_less(const Box& a, const Box& b) {
  return a.offset != b.offset ? a.offset < b.offset : a.extent < b.extent;
}

// True when a and b agree in every dimension but d and b follows a along d.
bool adjacent_along(const Box& a, const Box& b, size_t d) {
  for (size_t i = 0; i < a.ndim(); ++i)
    if (i != d && (a.offset[i] != b.offset[i] || a.extent[i] != b.extent[i])) return false;
  return a.offset[d] + a.extent[d] == b.offset[d];
}

// Merges disjoint boxes that are neighbours along one dimension and equal in the others, until
// none are left; the result is sorted by offset (row-major).
void merge_boxes(std::vector<Box>& boxes) {
  const size_t nd = boxes.empty() ? 0 : boxes[0].ndim();
  for (bool merged = true; merged;) {
    merged = false;
    for (size_t d = 0; d < nd; ++d) {
      auto key = [d](const Box& b) {  // the other dimensions, then the offset along d
        Shape k;
        for (size_t i = 0; i < b.ndim(); ++i)
          if (i != d) k.insert(k.end(), {b.offset[i], b.extent[i]});
        k.push_back(b.offset[d]);
        return k;
      };
      std::sort(boxes.begin(), boxes.end(), [&](const Box& a, const Box& b) { return key(a) < key(b); });
      std::vector<Box> out;
      for (Box& b : boxes) {
        if (!out.empty() && adjacent_along(out.back(), b, d)) {
          out.back().extent[d] += b.extent[d];
          merged = true;
        } else {
          out.push_back(std::move(b));
        }
      }
      boxes = std::move(out);
    }
  }
  std::sort(boxes.begin(), boxes.end(), row_major_less);
}

// The holders of `t` (ranks with a non-empty box) and this rank's box (nullopt: not held here).
Result<std::vector<Holder>> holders_of(const TensorMeta& t, const Layout& layout, const ShardingRules& rules, int me,
                                       std::optional<Box>* my_box, bool* expert) {
  CKPT_ASSIGN_OR_RETURN(std::vector<StagePlacement> places, place_in_layout(t, layout, rules));
  std::vector<Holder> hs;
  *expert = false;
  for (const StagePlacement& sp : places) {
    *expert = *expert || sp.expert;
    for (int r = 0; r < static_cast<int>(sp.tp_boxes.size()); ++r) {
      const int rank = layout.rank_of(sp.stage, sp.pipeline, r);
      if (rank == me) *my_box = sp.tp_boxes[static_cast<size_t>(r)];
      if (!sp.tp_boxes[static_cast<size_t>(r)].empty())
        hs.push_back({rank, RankPlace{sp.pipeline, sp.stage, r}, sp.tp_boxes[static_cast<size_t>(r)]});
    }
  }
  return hs;
}

// Adds the pieces of tensor `ti` to the holder sets of the plan: the holders of a piece, split by
// pipeline under Scope::kPipeline, form a set when they span more than one (pipeline, stage).
// An expert tensor (expert parallelism): every holder adds its own gradient (each computed other rows).
void add_to_sets(int ti, const std::vector<Holder>& hs, const std::vector<Piece>& pieces, ReplicaSum::Scope scope,
                 bool expert, Plan* plan) {
  for (const Piece& pc : pieces) {
    struct ScopeGroup {
      std::map<std::pair<int, int>, std::pair<int, int>> lowest;  // (pipeline, stage) -> (tp rank, rank)
      std::vector<int> ranks;
    };
    std::map<int, ScopeGroup> groups;  // the world (0), or each pipeline under kPipeline
    for (int k : pc.holders) {
      const Holder& h = hs[static_cast<size_t>(k)];
      ScopeGroup& g = groups[scope == ReplicaSum::Scope::kPipeline ? h.place.pipeline : 0];
      const std::pair<int, int> me{h.place.tp_rank, h.rank};
      const std::pair<int, int> key = expert ? std::pair<int, int>{h.rank, -1} : std::pair<int, int>{h.place.pipeline, h.place.stage};
      auto [it, fresh] = g.lowest.try_emplace(key, me);
      if (!fresh) it->second = std::min(it->second, me);
      g.ranks.push_back(h.rank);
    }
    for (auto& [id, g] : groups) {
      if (g.lowest.size() < 2) continue;  // TP replicas of one stage hold equal gradients
      std::vector<int> ranks = std::move(g.ranks), contributors;
      for (const auto& [ps, lowest] : g.lowest) contributors.push_back(lowest.second);
      std::sort(ranks.begin(), ranks.end());
      std::sort(contributors.begin(), contributors.end());
      auto [it, fresh] = plan->set_index.try_emplace(ranks, static_cast<int>(plan->sets.size()));
      if (fresh) plan->sets.push_back({ranks, contributors, {}});
      plan->sets[static_cast<size_t>(it->second)].cells[ti].push_back(pc.box);
    }
  }
}

// Every rank must pass the same tensor list: rank 0's fingerprint is compared on every rank.
Status check_same_tensors(Comm& world, const std::vector<TensorMeta>& tensors) {
  std::string mine;
  for (const TensorMeta& t : tensors) mine += t.name + shape_to_string(t.shape) + ";";
  CKPT_ASSIGN_OR_RETURN(std::string root, world.broadcast(mine));
  Status st;
  if (root != mine)
    st = Status::Error("ReplicaSumMismatch", "rank " + std::to_string(world.rank()) + " passed " +
                                                 std::to_string(tensors.size()) +
                                                 " tensors that differ from rank 0's list (names and shapes)");
  return world.agree(st);
}

}  // namespace replica_sum_internal

struct ReplicaSum::Impl {
  struct Group {  // a holder set this rank belongs to
    Comm comm;
    std::vector<int> ranks;
    bool contribute = false;
    std::vector<replica_sum_internal::Cell> cells;  // tensor order, then cell order
    int64_t numel = 0;
  };
  int rank = 0;
  std::vector<std::string> names;
  std::map<std::string, int> index;
  std::vector<std::optional<Box>> mine;   // per tensor: this rank's box (nullopt: not held)
  std::vector<std::vector<Box>> counted;  // per tensor: the cells this rank counts
  std::vector<Group> groups;              // in the global order of the sets
  int64_t elements = 0;

  Status make_comms(Comm& world, replica_sum_internal::Plan& plan);
  template <class T>
  Result<std::vector<const HeldBox<T>*>> match(const std::vector<HeldBox<T>>& held) const;
};

// One split per round of disjoint sets (greedy, in set order): members pass the set's number in
// the round, the other ranks a colour of their own.
Status ReplicaSum::Impl::make_comms(Comm& world, replica_sum_internal::Plan& plan) {
  using namespace replica_sum_internal;
  std::vector<std::vector<int>> rounds;     // set indices
  std::vector<std::vector<char>> busy;      // per round: ranks in one of its sets
  for (int s = 0; s < static_cast<int>(plan.sets.size()); ++s) {
    const std::vector<int>& ranks = plan.sets[static_cast<size_t>(s)].ranks;
    size_t r = 0;
    while (r < rounds.size() &&
           std::any_of(ranks.begin(), ranks.end(), [&](int k) { return busy[r][static_cast<size_t>(k)] != 0; }))
      ++r;
    if (r == rounds.size()) {
      rounds.emplace_back();
      busy.emplace_back(static_cast<size_t>(world.size()), 0);
    }
    rounds[r].push_back(s);
    for (int k : ranks) busy[r][static_cast<size_t>(k)] = 1;
  }
  std::map<int, Comm> comm_of;  // set index -> its communicator (member sets only)
  for (const std::vector<int>& round : rounds) {
    int color = static_cast<int>(round.size()) + world.rank(), set = -1;
    for (size_t i = 0; i < round.size(); ++i) {
      const std::vector<int>& rk = plan.sets[static_cast<size_t>(round[i])].ranks;
      if (std::binary_search(rk.begin(), rk.end(), world.rank())) {
        color = static_cast<int>(i);
        set = round[i];
      }
    }
    CKPT_ASSIGN_OR_RETURN(Comm c, world.split(color, world.rank()));
    if (set >= 0) comm_of.emplace(set, std::move(c));
  }
  for (auto& [s, comm] : comm_of) {
    SetPlan& sp = plan.sets[static_cast<size_t>(s)];
    Group g;
    g.comm = std::move(comm);
    g.ranks = sp.ranks;
    g.contribute = std::binary_search(sp.contributors.begin(), sp.contributors.end(), rank);
    for (auto& [ti, boxes] : sp.cells) {
      merge_boxes(boxes);
      for (Box& b : boxes) {
        g.numel += b.numel();
        g.cells.push_back({ti, std::move(b)});
      }
    }
    elements += g.numel;
    groups.push_back(std::move(g));
  }
  return Status::Ok();
}

Result<ReplicaSum> ReplicaSum::make(Comm& world, const Layout& layout, const ShardingRules& rules,
                                    const std::vector<TensorMeta>& tensors, Scope scope) {
  using namespace replica_sum_internal;
  if (world.size() != layout.world_size())
    return Status::Error("WorldSizeMismatch", "replica sum: the communicator has " + std::to_string(world.size()) +
                                                  " ranks, the layout " + layout.to_string() + " needs " +
                                                  std::to_string(layout.world_size()));
  CKPT_RETURN_IF_ERROR(check_same_tensors(world, tensors));
  CKPT_RETURN_IF_ERROR(check_layout_views(layout, rules));
  auto impl = std::make_shared<Impl>();
  impl->rank = world.rank();
  impl->mine.resize(tensors.size());
  impl->counted.resize(tensors.size());
  Plan plan;
  for (int ti = 0; ti < static_cast<int>(tensors.size()); ++ti) {
    const TensorMeta& t = tensors[static_cast<size_t>(ti)];
    if (!impl->index.emplace(t.name, ti).second)
      return Status::Error("ReplicaSumMismatch", "tensor '" + t.name + "' listed twice").with_tensor(t.name);
    impl->names.push_back(t.name);
    bool expert = false;
    CKPT_ASSIGN_OR_RETURN(std::vector<Holder> hs,
                          holders_of(t, layout, rules, world.rank(), &impl->mine[static_cast<size_t>(ti)], &expert));
    const std::vector<Piece> pieces = cut_pieces(hs);
    add_to_sets(ti, hs, pieces, scope, expert, &plan);
    std::vector<Box>& counted = impl->counted[static_cast<size_t>(ti)];
    for (const Piece& pc : pieces)
      if (lowest_rank(hs, pc) == world.rank()) counted.push_back(pc.box);
    merge_boxes(counted);
  }
  CKPT_RETURN_IF_ERROR(impl->make_comms(world, plan));
  ReplicaSum out;
  out.impl_ = std::move(impl);
  return out;
}

// `held` against the plan: every box this rank holds once (empty boxes may be left out), nothing
// else. Returns the box of each tensor (null: not held or empty).
template <class T>
Result<std::vector<const HeldBox<T>*>> ReplicaSum::Impl::match(const std::vector<HeldBox<T>>& held) const {
  using namespace replica_sum_internal;
  std::vector<const HeldBox<T>*> by(names.size(), nullptr);
  auto bad = [&](const std::string& t, const std::string& msg) {
  using namespace replica_sum_internal;
    return Status::Error("ReplicaSumMismatch", "replica sum, rank " + std::to_string(rank) + ", tensor '" + t +
                                                   "': " + msg)
        .with_tensor(t);
  };
  for (const HeldBox<T>& h : held) {
    auto it = index.find(h.tensor);
    if (it == index.end()) return bad(h.tensor, "box " + h.box.to_string() + " of a tensor not in the plan");
    const std::optional<Box>& want = mine[static_cast<size_t>(it->second)];
    if (!want) return bad(h.tensor, "box " + h.box.to_string() + " given, but this rank holds none of it");
    if (!(h.box == *want))
      return bad(h.tensor, "box " + h.box.to_string() + " given, the layout gives this rank " + want->to_string());
    const HeldBox<T>*& slot = by[static_cast<size_t>(it->second)];
    if (slot) return bad(h.tensor, "box " + h.box.to_string() + " given twice");
    if (!h.data && !h.box.empty()) return bad(h.tensor, "box " + h.box.to_string() + " without data");
    slot = &h;
  }
  for (size_t i = 0; i < names.size(); ++i)
    if (mine[i] && !mine[i]->empty() && !by[i])
      return bad(names[i], "box " + mine[i]->to_string() + " of this rank missing");
  return by;
}

template <class T>
Status ReplicaSum::sum(const std::vector<HeldBox<T>>& mine) {
  using namespace replica_sum_internal;
  if (!impl_) return Status::Internal("ReplicaSum::sum on an empty ReplicaSum (use ReplicaSum::make)");
  CKPT_ASSIGN_OR_RETURN(std::vector<const HeldBox<T>*> by, impl_->match(mine));
  std::vector<T> buf;
  for (Impl::Group& g : impl_->groups) {
    buf.assign(static_cast<size_t>(g.numel), T(0));
    int64_t off = 0;
    for (const Cell& c : g.cells) {
      const HeldBox<T>& h = *by[static_cast<size_t>(c.tensor)];
      if (g.contribute) copy_box(h.data, h.box, buf.data() + off, c.box, c.box, sizeof(T));
      off += c.box.numel();
    }
    Status st = g.comm.all_reduce_sum<T>(buf.data(), g.numel);
    if (!st.ok()) return std::move(st).with_context("replica sum over ranks " + ranks_to_string(g.ranks));
    off = 0;
    for (const Cell& c : g.cells) {
      const HeldBox<T>& h = *by[static_cast<size_t>(c.tensor)];
      copy_box(buf.data() + off, c.box, h.data, h.box, c.box, sizeof(T));
      off += c.box.numel();
    }
  }
  return Status::Ok();
}

std::vector<Box> ReplicaSum::counted(const std::string& tensor, const Box& box) const {
  using namespace replica_sum_internal;
  std::vector<Box> out;
  if (!impl_) return out;
  auto it = impl_->index.find(tensor);
  if (it == impl_->index.end()) return out;
  for (const Box& c : impl_->counted[static_cast<size_t>(it->second)])
    if (std::optional<Box> x = intersect(c, box)) out.push_back(std::move(*x));
  return out;
}

int64_t ReplicaSum::elements_per_sum() const { return impl_ ? impl_->elements : 0; }

template Status ReplicaSum::sum<float>(const std::vector<HeldBox<float>>&);
template Status ReplicaSum::sum<double>(const std::vector<HeldBox<double>>&);

}  // namespace ckpt::trainer
