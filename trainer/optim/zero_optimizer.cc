#include "trainer/optim/zero_optimizer.h"

#include <algorithm>
#include <cstring>

#include "converters/model/llama_sharding.h"
#include "reshard/layout/tensor_placement.h"

namespace ckpt::trainer {

namespace {

constexpr const char* kEmbedName = "model.embed_tokens.weight";

Region region_of(const Box& box, int64_t a, int64_t b) {
  if (a == 0 && b == box.numel()) return Region{box};
  return Region{box, a, b};
}

// zero 1: whether this rank counts parameter `p`'s gradient in the global norm (DP aside; `layout`
// is the stage view): not when a lower TP rank holds the same box (replicated norms, shared KV
// heads), not the tied embedding off the first stage (which holds all of it).
template <class T>
Result<bool> counted_here(const Param<T>& p, const Layout& layout, const LlamaShardingRules& rules, int pp_rank,
                          int tp_rank) {
  if (pp_rank != 0 && p.name == kEmbedName) return false;
  if (tp_rank == 0) return true;
  auto pl = rules.place(TensorMeta{p.name, DType::kF32, p.shape}, layout);
  if (!pl.ok()) return pl.take_status().with_tensor(p.name);
  for (int t = 0; t < tp_rank && t < static_cast<int>(pl->tp_boxes.size()); ++t)
    if (pl->tp_boxes[static_cast<size_t>(t)] == p.box) return false;
  return true;
}

}  // namespace

template <class T>
Result<ParallelOptimizer<T>> ParallelOptimizer<T>::create(Model<T>& model, const Layout& layout, int pp_rank,
                                                          int dp_rank, int tp_rank, Comm* world,
                                                          const AdamWOptions& opt) {
  if (dp_rank < 0 || dp_rank >= layout.num_pipelines() || pp_rank < 0 || pp_rank >= layout.num_stages(dp_rank) ||
      tp_rank < 0 || tp_rank >= layout.stage_tp(dp_rank, pp_rank))
    return Status::InvalidArgument("optimizer of rank (stage " + std::to_string(pp_rank) + ", pipeline " +
                                   std::to_string(dp_rank) + ", tp " + std::to_string(tp_rank) + ") outside " +
                                   layout.to_string());
  if (world && world->size() != layout.world_size())
    return Status::Error("WorldSizeMismatch", "optimizer over a world of " + std::to_string(world->size()) +
                                                  " ranks for " + layout.to_string());
  ParallelOptimizer o;
  o.layout_ = layout;
  o.view_ = layout.stage_view(dp_rank, pp_rank);
  o.pp_rank_ = pp_rank;
  o.dp_rank_ = dp_rank;
  o.tp_rank_ = tp_rank;
  o.adam_ = BasicAdamW<T>(opt);
  for (Param<T>* p : model.params())
    if (p->numel() > 0) o.params_.push_back({p->name, Region{p->box}, p->w.data(), p->g.data(), p->numel()});
  CKPT_RETURN_IF_ERROR(layout.zero == 1 ? o.build_zero1(model, world) : o.build_zero0(model, world));
  return o;
}

template <class T>
Status ParallelOptimizer<T>::needs_world(const char* what) const {
  if (replicas_ || layout_.world_size() == 1) return Status::Ok();
  return Status::Internal(std::string(what) + ": the optimizer of " + layout_.to_string() +
                          " was created without a world communicator");
}

template <class T>
Status ParallelOptimizer<T>::build_zero0(Model<T>& model, Comm* world) {
  const LlamaShardingRules rules(model.config());
  if (world && layout_.world_size() > 1) {
    CKPT_ASSIGN_OR_RETURN(ReplicaSum rs, ReplicaSum::make(*world, layout_, rules,
                                                          llama_model_tensors(model.config(), DType::kF32),
                                                          ReplicaSum::Scope::kWorld));
    replicas_ = std::make_shared<ReplicaSum>(std::move(rs));
  }
  for (Param<T>* p : model.params()) {
    if (p->numel() == 0) continue;
    summed_.push_back({p->name, p->box, p->g.data()});
    adam_.add(p->name, p->shape, Region{p->box}, p->w.data(), p->g.data(), p->numel(), p->decay);
    counted_boxes_.push_back(replicas_ ? replicas_->counted(p->name, p->box) : std::vector<Box>{p->box});
  }
  return Status::Ok();
}

template <class T>
Status ParallelOptimizer<T>::build_zero1(Model<T>& model, Comm* world) {
  const LlamaShardingRules rules(model.config());
  const LlamaConfig& cfg = model.config();
  if (!layout_.uniform_pipelines())
    return Status::InvalidArgument("zero=1 needs pipelines holding the same layers at the same tp: " +
                                   layout_.to_string());
  if (world && cfg.tie_word_embeddings && layout_.num_stages(0) > 1) {
    // The tied embedding lives on the first and the last stage (maybe at different tp).
    std::vector<TensorMeta> emb;
    for (const TensorMeta& t : llama_model_tensors(cfg, DType::kF32))
      if (t.name == kEmbedName) emb.push_back(t);
    CKPT_ASSIGN_OR_RETURN(ReplicaSum rs, ReplicaSum::make(*world, layout_, rules, emb, ReplicaSum::Scope::kPipeline));
    replicas_ = std::make_shared<ReplicaSum>(std::move(rs));
    if (Param<T>* e = model.find(kEmbedName); e && e->numel() > 0) summed_.push_back({e->name, e->box, e->g.data()});
  }
  const std::vector<TensorMeta> tensors = trainer_tensors(cfg);
  if (cfg.moe && layout_.expert_parallel()) {
    CKPT_RETURN_IF_ERROR(find_expert_buffer(model, tensors, world));
  } else {
    CKPT_ASSIGN_OR_RETURN(dense_.buf, zero_buffer(tensors, view_, rules, pp_rank_, tp_rank_, zero_kind(kExpAvgPrefix)));
    dense_.d = dp_rank_;
  }
  CKPT_RETURN_IF_ERROR(add_flat(model, tensors, dense_, false));
  if (!expert_.buf.segments.empty()) CKPT_RETURN_IF_ERROR(add_flat(model, tensors, expert_, true));
  const size_t matched = dense_.parts.size() + expert_.parts.size();
  if (matched != params_.size())
    return Status::Internal("ZeRO-1 buffer of stage " + std::to_string(pp_rank_) + " holds " + std::to_string(matched) +
                            " of the stage's " + std::to_string(params_.size()) + " parameters");
  return Status::Ok();
}

// Expert parallel: the stage's buffers from zero_buffers (placements of every pipeline); the
// dense one of this TP rank, the expert one whose members include this rank; the communicator
// of those members (a split of the world: every rank takes part).
template <class T>
Status ParallelOptimizer<T>::find_expert_buffer(Model<T>& model, const std::vector<TensorMeta>& tensors, Comm* world) {
  const LlamaShardingRules rules(model.config());
  std::vector<std::vector<StagePlacement>> placed;
  for (const TensorMeta& t : tensors) {
    CKPT_ASSIGN_OR_RETURN(auto pl, place_in_layout(t, layout_, rules));
    placed.push_back(std::move(pl));
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<ZeroBuffer> bufs, zero_buffers(tensors, placed, layout_));
  const std::string kind = zero_kind(kExpAvgPrefix);
  const std::pair<int, int> me{dp_rank_, tp_rank_};
  int color = -1;
  for (ZeroBuffer& b : bufs) {
    if (b.stage != pp_rank_ || b.kind != kind) continue;
    if (b.members.empty() && b.tp_rank == tp_rank_) {
      dense_.buf = std::move(b);
      dense_.d = dp_rank_;
      continue;
    }
    const auto at = std::find(b.members.begin(), b.members.end(), me);
    if (at == b.members.end()) continue;
    expert_.d = static_cast<int>(at - b.members.begin());
    color = layout_.rank_of(pp_rank_, b.members[0].first, b.members[0].second);  // the first member's world rank
    expert_.buf = std::move(b);
  }
  if (!world) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(Comm c, world->split(color >= 0 ? color : layout_.world_size() + world->rank(), expert_.d));
  edp_ = std::make_shared<Comm>(std::move(c));
  return Status::Ok();
}

template <class T>
Status ParallelOptimizer<T>::add_flat(Model<T>& model, const std::vector<TensorMeta>& tensors, Flat& f, bool expert) {
  const LlamaShardingRules rules(model.config());
  const auto [lo, hi] = f.buf.range(f.d);
  f.flat.assign(static_cast<size_t>(f.buf.padded), T(0));
  f.shard_w.assign(static_cast<size_t>(hi - lo), T(0));
  f.shard_g.assign(static_cast<size_t>(hi - lo), T(0));
  const size_t prefix = std::strlen(kExpAvgPrefix);
  for (const ZeroSegment& seg : f.buf.segments) {
    if (seg.numel == 0) continue;
    const std::string name = tensors[seg.tensor].name.substr(prefix);
    Param<T>* p = model.find(name);
    if (!p || p->box != seg.box)
      return Status::Internal("ZeRO-1 buffer of stage " + std::to_string(pp_rank_) + ", tp rank " +
                              std::to_string(tp_rank_) + " holds " + name + " " + seg.box.to_string() +
                              ", the model " + (p ? "holds " + p->box.to_string() : std::string("does not hold it")))
          .with_tensor(name);
    f.parts.push_back({p->w.data(), p->g.data(), seg.numel, seg.offset});
    const int64_t a = std::max(lo, seg.offset) - seg.offset;
    const int64_t b = std::min(hi, seg.offset + seg.numel) - seg.offset;
    if (a >= b) continue;
    bool c = true;  // expert buffer: each element in one shard of one group of the world
    if (!expert) {
      CKPT_ASSIGN_OR_RETURN(c, counted_here(*p, view_, rules, pp_rank_, tp_rank_));
    }
    const size_t at = static_cast<size_t>(seg.offset + a - lo);
    adam_.add(name, p->shape, region_of(seg.box, a, b), f.shard_w.data() + at, f.shard_g.data() + at, b - a, p->decay);
    counted_.push_back(c);
  }
  return Status::Ok();
}

template <class T>
Status ParallelOptimizer<T>::reduce_gradients(Comm& dp) {
  if (layout_.zero != 1) {
    CKPT_RETURN_IF_ERROR(needs_world("reduce_gradients"));
    return replicas_ ? replicas_->sum(summed_) : Status::Ok();
  }
  if (dp.size() != view_.dp)
    return Status::InvalidArgument("DP group of " + std::to_string(dp.size()) + " ranks for " + layout_.to_string());
  if (replicas_) CKPT_RETURN_IF_ERROR(replicas_->sum(summed_));
  for (Flat* f : {&dense_, &expert_}) {
    if (f->buf.padded == 0) continue;
    Comm* c = f == &dense_ ? &dp : edp_.get();
    if (!c) return Status::Internal("ZeRO-1 expert buffer without its group (optimizer created without a world)");
    std::fill(f->flat.begin(), f->flat.end(), T(0));
    for (const Part& p : f->parts) std::copy(p.g, p.g + p.n, f->flat.data() + p.flat);
    CKPT_RETURN_IF_ERROR(c->reduce_scatter_sum(f->flat.data(), f->shard_g.data(), f->buf.shard()));
  }
  return Status::Ok();
}

template <class T>
Result<double> ParallelOptimizer<T>::grad_sq_share() const {
  double t = 0;
  const auto& slots = adam_.slots();
  if (layout_.zero != 1) {
    CKPT_RETURN_IF_ERROR(needs_world("grad_sq_share"));
    std::vector<T> part;
    for (size_t k = 0; k < slots.size(); ++k)
      for (const Box& b : counted_boxes_[k]) {
        const Box& box = slots[k].region.box;
        const T* g = slots[k].g;
        int64_t n = slots[k].n;
        if (b != box) {  // a part of the box: gather its elements first
          part.resize(static_cast<size_t>(b.numel()));
          copy_box(slots[k].g, box, part.data(), b, b, sizeof(T));
          g = part.data();
          n = b.numel();
        }
        for (int64_t i = 0; i < n; ++i) t += static_cast<double>(g[i]) * g[i];
      }
    return t;
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    if (!counted_[k]) continue;
    for (int64_t i = 0; i < slots[k].n; ++i) t += static_cast<double>(slots[k].g[i]) * slots[k].g[i];
  }
  return t;
}

template <class T>
void ParallelOptimizer<T>::update(double lr, int64_t step) {
  if (layout_.zero == 1) {
    // Master values of the own range from the Params (equal on every DP rank after the last gather).
    for (Flat* f : {&dense_, &expert_}) {
      if (f->buf.padded == 0) continue;
      const auto [lo, hi] = f->buf.range(f->d);
      for (const Part& p : f->parts) {
        const int64_t a = std::max(lo, p.flat), b = std::min(hi, p.flat + p.n);
        if (a < b) std::copy(p.w + (a - p.flat), p.w + (b - p.flat), f->shard_w.data() + (a - lo));
      }
    }
  }
  adam_.step(lr, step);
}

template <class T>
Status ParallelOptimizer<T>::gather_params(Comm& dp) {
  if (layout_.zero != 1) return Status::Ok();
  if (dp.size() != view_.dp)
    return Status::InvalidArgument("DP group of " + std::to_string(dp.size()) + " ranks for " + layout_.to_string());
  for (Flat* f : {&dense_, &expert_}) {
    if (f->buf.padded == 0) continue;
    Comm* c = f == &dense_ ? &dp : edp_.get();
    if (!c) return Status::Internal("ZeRO-1 expert buffer without its group (optimizer created without a world)");
    CKPT_RETURN_IF_ERROR(c->all_gather(f->shard_w.data(), f->flat.data(), f->buf.shard()));
    for (const Part& p : f->parts) std::copy(f->flat.data() + p.flat, f->flat.data() + p.flat + p.n, p.w);
  }
  return Status::Ok();
}

template <class T>
std::vector<GradRegion<T>> ParallelOptimizer<T>::grad_regions() const {
  std::vector<GradRegion<T>> out;
  if (layout_.zero == 1) {
    for (const auto& s : adam_.slots()) out.push_back({s.name, s.region, s.g});
  } else {
    for (const Whole& p : params_) out.push_back({p.name, p.region, p.g});
  }
  return out;
}

// An explicit specialization, not a constrained member: clang 14 instantiates a constrained member in
// `template class ParallelOptimizer<double>` below whatever its constraint says.
template <>
std::vector<HeldRegion> ParallelOptimizer<float>::held_regions() {
  std::vector<HeldRegion> out;
  for (const Whole& p : params_) out.push_back({p.name, p.region, p.w});
  for (auto& s : adam_.slots()) out.push_back({kExpAvgPrefix + s.name, s.region, s.exp_avg.data()});
  for (auto& s : adam_.slots()) out.push_back({kExpAvgSqPrefix + s.name, s.region, s.exp_avg_sq.data()});
  return out;
}

template class ParallelOptimizer<float>;
template class ParallelOptimizer<double>;

}  // namespace ckpt::trainer
