#include "trainer/zero_optimizer.h"

#include <algorithm>
#include <cstring>

#include "converters/llama_sharding.h"

namespace ckpt::trainer {

namespace {

constexpr const char* kEmbedName = "model.embed_tokens.weight";

Region region_of(const Box& box, int64_t a, int64_t b) {
  if (a == 0 && b == box.numel()) return Region{box};
  return Region{box, a, b};
}

// Whether this rank counts parameter `p`'s gradient in the global norm (DP aside): not when a
// lower TP rank holds the same box (replicated norms, shared KV heads), not the tied embedding
// off the first stage.
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
                                                          int dp_rank, int tp_rank, const AdamWOptions& opt) {
  if (pp_rank < 0 || pp_rank >= layout.pp || dp_rank < 0 || dp_rank >= layout.dp || tp_rank < 0 ||
      tp_rank >= layout.tp)
    return Status::InvalidArgument("optimizer of rank (pp " + std::to_string(pp_rank) + ", dp " +
                                   std::to_string(dp_rank) + ", tp " + std::to_string(tp_rank) + ") outside " +
                                   layout.to_string());
  ParallelOptimizer o;
  o.layout_ = layout;
  o.pp_rank_ = pp_rank;
  o.dp_rank_ = dp_rank;
  o.tp_rank_ = tp_rank;
  o.adam_ = BasicAdamW<T>(opt);
  for (Param<T>* p : model.params())
    if (p->numel() > 0) o.params_.push_back({p->name, Region{p->box}, p->w.data(), p->g.data(), p->numel()});
  CKPT_RETURN_IF_ERROR(layout.zero == 1 ? o.build_zero1(model) : o.build_zero0(model));
  return o;
}

template <class T>
Status ParallelOptimizer<T>::build_zero0(Model<T>& model) {
  const LlamaShardingRules rules(model.config());
  int64_t total = 0;
  for (Param<T>* p : model.params()) {
    if (p->numel() == 0) continue;
    CKPT_ASSIGN_OR_RETURN(bool c, counted_here(*p, layout_, rules, pp_rank_, tp_rank_));
    adam_.add(p->name, p->shape, Region{p->box}, p->w.data(), p->g.data(), p->numel(), p->decay);
    counted_.push_back(c && dp_rank_ == 0);
    total += p->numel();
  }
  if (layout_.dp > 1) flat_.resize(static_cast<size_t>(total));
  return Status::Ok();
}

template <class T>
Status ParallelOptimizer<T>::build_zero1(Model<T>& model) {
  const LlamaShardingRules rules(model.config());
  const std::vector<TensorMeta> tensors = trainer_tensors(model.config());
  CKPT_ASSIGN_OR_RETURN(buf_, zero_buffer(tensors, layout_, rules, pp_rank_, tp_rank_,
                                          zero_kind(kExpAvgPrefix)));
  const auto [lo, hi] = buf_.range(dp_rank_);
  flat_.assign(static_cast<size_t>(buf_.padded), T(0));
  shard_w_.assign(static_cast<size_t>(hi - lo), T(0));
  shard_g_.assign(static_cast<size_t>(hi - lo), T(0));
  const size_t prefix = std::strlen(kExpAvgPrefix);
  size_t matched = 0;
  for (const ZeroSegment& seg : buf_.segments) {
    if (seg.numel == 0) continue;
    const std::string name = tensors[seg.tensor].name.substr(prefix);
    Param<T>* p = model.find(name);
    if (!p || p->box != seg.box)
      return Status::Internal("ZeRO-1 buffer of stage " + std::to_string(pp_rank_) + ", tp rank " +
                              std::to_string(tp_rank_) + " holds " + name + " " + seg.box.to_string() +
                              ", the model " + (p ? "holds " + p->box.to_string() : std::string("does not hold it")))
          .with_tensor(name);
    ++matched;
    parts_.push_back({p->w.data(), p->g.data(), seg.numel, seg.offset});
    const int64_t a = std::max(lo, seg.offset) - seg.offset;
    const int64_t b = std::min(hi, seg.offset + seg.numel) - seg.offset;
    if (a >= b) continue;
    CKPT_ASSIGN_OR_RETURN(bool c, counted_here(*p, layout_, rules, pp_rank_, tp_rank_));
    const size_t at = static_cast<size_t>(seg.offset + a - lo);
    adam_.add(name, p->shape, region_of(seg.box, a, b), shard_w_.data() + at, shard_g_.data() + at, b - a, p->decay);
    counted_.push_back(c);
  }
  if (matched != params_.size())
    return Status::Internal("ZeRO-1 buffer of stage " + std::to_string(pp_rank_) + " holds " + std::to_string(matched) +
                            " of the stage's " + std::to_string(params_.size()) + " parameters");
  return Status::Ok();
}

template <class T>
Status ParallelOptimizer<T>::reduce_gradients(Comm& dp) {
  if (dp.size() != layout_.dp)
    return Status::InvalidArgument("DP group of " + std::to_string(dp.size()) + " ranks for " + layout_.to_string());
  if (layout_.zero != 1) {
    if (layout_.dp == 1) return Status::Ok();
    size_t at = 0;
    for (const Whole& p : params_) std::copy(p.g, p.g + p.n, flat_.data() + at), at += static_cast<size_t>(p.n);
    CKPT_RETURN_IF_ERROR(dp.all_reduce_sum(flat_.data(), static_cast<int64_t>(at)));
    at = 0;
    for (const Whole& p : params_) std::copy(flat_.data() + at, flat_.data() + at + p.n, p.g), at += static_cast<size_t>(p.n);
    return Status::Ok();
  }
  std::fill(flat_.begin(), flat_.end(), T(0));
  for (const Part& p : parts_) std::copy(p.g, p.g + p.n, flat_.data() + p.flat);
  return dp.reduce_scatter_sum(flat_.data(), shard_g_.data(), buf_.shard());
}

template <class T>
double ParallelOptimizer<T>::grad_sq_share() const {
  double t = 0;
  const auto& slots = adam_.slots();
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
    const auto [lo, hi] = buf_.range(dp_rank_);
    for (const Part& p : parts_) {
      const int64_t a = std::max(lo, p.flat), b = std::min(hi, p.flat + p.n);
      if (a < b) std::copy(p.w + (a - p.flat), p.w + (b - p.flat), shard_w_.data() + (a - lo));
    }
  }
  adam_.step(lr, step);
}

template <class T>
Status ParallelOptimizer<T>::gather_params(Comm& dp) {
  if (layout_.zero != 1) return Status::Ok();
  if (dp.size() != layout_.dp)
    return Status::InvalidArgument("DP group of " + std::to_string(dp.size()) + " ranks for " + layout_.to_string());
  CKPT_RETURN_IF_ERROR(dp.all_gather(shard_w_.data(), flat_.data(), buf_.shard()));
  for (const Part& p : parts_) std::copy(flat_.data() + p.flat, flat_.data() + p.flat + p.n, p.w);
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

template <class T>
std::vector<HeldRegion> ParallelOptimizer<T>::held_regions()
  requires std::is_same_v<T, float>
{
  std::vector<HeldRegion> out;
  for (const Whole& p : params_) out.push_back({p.name, p.region, p.w});
  for (auto& s : adam_.slots()) out.push_back({kExpAvgPrefix + s.name, s.region, s.exp_avg.data()});
  for (auto& s : adam_.slots()) out.push_back({kExpAvgSqPrefix + s.name, s.region, s.exp_avg_sq.data()});
  return out;
}

template class ParallelOptimizer<float>;
template class ParallelOptimizer<double>;

}  // namespace ckpt::trainer
