#include "trainer/memory_estimate.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "converters/model/llama_sharding.h"
#include "formats/base/byte_size.h"
#include "reshard/layout/zero_layout.h"
#include "reshard/planner.h"
#include "trainer/optim/held_region.h"
#include "trainer/pipeline_schedule.h"
#include "trainer/state/dist_checkpoint.h"

namespace ckpt::trainer {

namespace {

constexpr uint64_t kF = sizeof(float);
constexpr uint64_t kI = sizeof(int32_t);

uint64_t u(int64_t v) { return static_cast<uint64_t>(std::max<int64_t>(v, 0)); }

// What a (pipeline, stage, tp rank) holds, from the planner under the stage's view.
struct Held {
  int64_t weights = 0, optimizer = 0, vocab_rows = 0;
  int64_t zero_padded = 0, zero_shard = 0;
  int64_t expert_padded = 0, expert_shard = 0;  // ZeRO-1's expert buffer over the expert data-parallel group
};

bool est_is_expert(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

// The view's rank of `place`: stage s, DP rank p when the pipelines are uniform (the view has
// every pipeline) else 0, tp rank t.
int view_rank(const Layout& view, const RankPlace& place) {
  return view.rank_of(place.stage, view.dp == 1 ? 0 : place.pipeline, place.tp_rank);
}

Result<Held> held_of(const MemoryInputs& in, const RankPlace& place, const std::vector<TensorMeta>& tensors,
                     const LlamaShardingRules& rules) {
  const Layout view = in.layout.stage_view(place.pipeline, place.stage);
  const int vr = view_rank(view, place);
  Held h;
  CKPT_ASSIGN_OR_RETURN(std::vector<Piece> pieces, rank_view(tensors, view, rules, vr));
  const size_t pre = std::strlen("optimizer.");
  int64_t expert = 0;  // the rank's expert boxes (one kind's elements of its expert buffer)
  for (const Piece& p : pieces) {
    const bool opt = p.tensor.compare(0, pre, "optimizer.") == 0;
    (opt ? h.optimizer : h.weights) += p.region.numel();
    if (!opt && est_is_expert(p.tensor)) expert += p.region.numel();
  }
  const Shape vshape{in.config.vocab_size, in.config.hidden_size};
  CKPT_ASSIGN_OR_RETURN(TensorPlacement emb, rules.place(TensorMeta{"model.embed_tokens.weight", DType::kF32, vshape}, view));
  h.vocab_rows = emb.tp_boxes.at(static_cast<size_t>(place.tp_rank)).extent[0];
  if (view.zero == 1 && !view.expert_parallel()) {
    CKPT_ASSIGN_OR_RETURN(ZeroBuffer b, zero_buffer(tensors, view, rules, place.stage, place.tp_rank,
                                                    zero_kind(kExpAvgPrefix)));
    h.zero_padded = b.padded;
    h.zero_shard = b.shard();
  } else if (view.zero == 1) {
    // zero_layout.h's buffers of an expert-parallel layout: the dense one holds the rank's boxes of
    // the other parameters (one kind), padded to kZeroPadElements * dp and split over dp; the expert
    // one its expert boxes, padded to kZeroPadElements * edp and split over edp.
    const int64_t edp = std::max<int64_t>(1, static_cast<int64_t>(view.tp) * view.dp / (static_cast<int64_t>(view.ep) * view.expert_tp()));
    auto pad = [](int64_t n, int64_t ways) { return (n + kZeroPadElements * ways - 1) / (kZeroPadElements * ways) * (kZeroPadElements * ways); };
    h.zero_padded = pad(h.weights - expert, view.dp);
    h.zero_shard = h.zero_padded / view.dp;
    h.expert_padded = pad(expert, edp);
    h.expert_shard = h.expert_padded / edp;
    h.optimizer = 2 * (h.zero_shard + h.expert_shard);  // both moments of its two shards (as allocated: padding included)
  }
  return h;
}

// What an MoE layer keeps for one micro-batch of n tokens (trainer/model/moe_mlp.h MoeActs), in
// elements: probs [n, E], picks and weights [n, k], the rows R = n k etp / tp this rank computes
// under balanced routing (row token and pick, gathered inputs and outputs [R, D], gate, up and
// their product [R, F / etp]), the shared expert's [n, Fs / tp] x 3 and [n, D], its gate [n].
int64_t moe_layer_acts(const LlamaConfig& c, int64_t tp, int64_t etp, int64_t n) {
  const MoeConfig& m = *c.moe;
  const int64_t R = (n * m.top_k * etp + tp - 1) / tp, D = c.hidden_size;
  int64_t e = n * m.num_experts + 2 * n * m.top_k + 2 * (m.num_experts + 1) + 2 * R + 2 * R * D + 3 * R * (m.expert_intermediate / etp) + n;
  if (m.shared_intermediate > 0) e += 3 * n * (m.shared_intermediate / tp) + n * D;
  return e;
}

// Activations of one micro-batch slot and the shared scratch, bytes (see the header).
struct ActBytes {
  uint64_t per_slot = 0, workspace = 0;
};

ActBytes activation_bytes(const MemoryInputs& in, const RankPlace& place, int64_t vocab_rows) {
  const LlamaConfig& c = in.config;
  const Layout& l = in.layout;
  const int p = place.pipeline, s = place.stage;
  const int64_t tp = l.stage_tp(p, s), S = in.seq_len, b = l.pipeline_micro_batch(p), n = b * S;
  const int64_t D = c.hidden_size, Ql = c.num_attention_heads / tp * c.head_dim,
                KVl = c.num_key_value_heads / tp * c.head_dim, Fl = c.intermediate_size / tp,
                Hl = c.num_attention_heads / tp, L = l.stage_layers(p, s);
  const bool first = s == 0, last = s + 1 == l.num_stages(p);
  const int64_t attn = 3 * n * D + 2 * n + 2 * n * Ql + 2 * n * KVl + b * Hl * S * S;
  int64_t layers = 0;
  for (int64_t i = l.stage_first_layer(p, s); i < l.stage_first_layer(p, s) + L; ++i)
    layers += attn + (c.moe && c.moe->is_moe_layer(i) ? moe_layer_acts(c, tp, l.stage_expert_tp(p, s), n) : 3 * n * Fl);
  ActBytes a;
  a.per_slot = kF * u(layers + (last ? L + 1 : L) * n * D);
  if (first) a.per_slot += kI * u(n);
  if (last) a.per_slot += kF * u(n * D + n + n * vocab_rows);
  const int64_t ws = 3 * n * Fl + n * D + 2 * n * Ql + 2 * n * KVl + S * S + 2 * n * D;
  a.workspace = kF * u(ws + S * c.head_dim + 4 * n * D) + kI * u(2 * n);
  return a;
}

// One rank's estimate at `place` with `slots` activation slots (pipe_slots for a run).
RankMemory rank_memory(const MemoryInputs& in, int rank, const RankPlace& place, int slots, const Held& h, int64_t staging,
                       int64_t largest_piece) {
  const Layout& l = in.layout;
  RankMemory m;
  m.rank = rank;
  m.place = place;
  const int p = m.place.pipeline, s = m.place.stage;
  m.device = l.stage_device(p, s);
  m.weights = kF * u(h.weights);
  m.grads = m.weights;
  m.optimizer = kF * u(h.optimizer);
  const ActBytes a = activation_bytes(in, m.place, h.vocab_rows);
  m.activations = a.per_slot * static_cast<uint64_t>(slots);
  m.workspace = a.workspace;
  if (l.zero == 1)
    m.buffers = kF * u(h.zero_padded + 2 * h.zero_shard + h.expert_padded + 2 * h.expert_shard);
  else if (l.num_pipelines() > 1)
    m.buffers = m.grads;  // the packed gradients of the DP / replica sum
  m.buffers += in.data_bytes;
  m.checkpoint = kF * u(staging) + save_write_pool_touched(kF * u(staging), kF * u(largest_piece));  // + the write pool's pages
  m.process = process_bytes(in.mpi, l.world_size());
  return m;
}

// The saver's share: the elements the planner gives each rank to write, under the real layout
// (replicas in other pipelines share the writing, also when the pipelines split differently), and
// each rank's largest piece; zeros without checkpoints.
Status staging_of(const MemoryInputs& in, const std::vector<TensorMeta>& tensors, const LlamaShardingRules& rules,
                  std::vector<int64_t>& staging, std::vector<int64_t>& largest) {
  staging.assign(static_cast<size_t>(in.layout.world_size()), 0);
  largest.assign(staging.size(), 0);
  if (!in.checkpoints) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(auto placed, place_tensors(tensors, in.layout, rules));
  for (const auto& t : placed)
    for (const RankRegion& rr : t) {
      staging.at(static_cast<size_t>(rr.rank)) += rr.region.numel();
      largest[static_cast<size_t>(rr.rank)] = std::max(largest[static_cast<size_t>(rr.rank)], rr.region.numel());
    }
  return Status::Ok();
}

}  // namespace

uint64_t process_bytes(bool mpi, int world_size) {
  if (!mpi) return kProcessBytes;
  return kMpiProcessBytes + kMpiPeerBytes * static_cast<uint64_t>(std::clamp(world_size, 1, 64));
}

std::string RankMemory::breakdown() const {
  return "weights " + human_bytes(weights) + ", gradients " + human_bytes(grads) + ", optimizer " +
         human_bytes(optimizer) + ", activations " + human_bytes(activations) + ", workspace " +
         human_bytes(workspace) + ", buffers " + human_bytes(buffers) + ", checkpoint staging " +
         human_bytes(checkpoint) + ", process " + human_bytes(process);
}

nlohmann::json RankMemory::to_json() const {
  return {{"rank", rank},           {"pipeline", place.pipeline}, {"stage", place.stage},
          {"tp_rank", place.tp_rank}, {"device", device},           {"weights", weights},
          {"grads", grads},         {"optimizer", optimizer},     {"activations", activations},
          {"workspace", workspace}, {"buffers", buffers},         {"checkpoint", checkpoint},
          {"process", process},     {"total", total()}};
}

Result<std::vector<RankMemory>> estimate_memory(const MemoryInputs& in) {
  CKPT_RETURN_IF_ERROR(in.layout.validate());
  if (in.seq_len < 1 || in.grad_accum < 1)
    return Status::InvalidArgument("memory estimate: seq_len and grad_accum must be >= 1");
  const LlamaShardingRules rules(in.config);
  const std::vector<TensorMeta> tensors = trainer_tensors(in.config);
  // Uniform pipelines hold the same on every pipeline.
  const bool per_pipeline = !in.layout.uniform_pipelines();
  std::map<std::tuple<int, int, int>, Held> cache;
  std::vector<int64_t> staging, largest;
  CKPT_RETURN_IF_ERROR(staging_of(in, tensors, rules, staging, largest));
  std::vector<RankMemory> out;
  for (int r = 0; r < in.layout.world_size(); ++r) {
    const RankPlace pl = in.layout.place_of_rank(r);
    const auto key = std::make_tuple(per_pipeline ? pl.pipeline : 0, pl.stage, pl.tp_rank);
    auto it = cache.find(key);
    if (it == cache.end()) {
      auto h = held_of(in, pl, tensors, rules);
      if (!h.ok())
        return h.take_status().with_context("memory estimate of rank " + std::to_string(r) + " (pipeline " +
                                             std::to_string(pl.pipeline) + ", stage " + std::to_string(pl.stage) +
                                             ")");
      it = cache.emplace(key, *h).first;
    }
    const int slots = pipe_slots(pl.stage, in.layout.num_stages(pl.pipeline), static_cast<int>(std::min<int64_t>(in.grad_accum, 1 << 20)));
    out.push_back(rank_memory(in, r, pl, slots, it->second, staging[static_cast<size_t>(r)], largest[static_cast<size_t>(r)]));
  }
  return out;
}

namespace {

// One pipeline holding the stage of `q` between a 1-tp stage of the layers before it (unless
// first) and one of the layers after it (unless last); zero_ways copies under ZeRO-1.
Result<Layout> stage_query_layout(const LlamaConfig& c, const StageMemoryQuery& q, int& index) {
  const int L = static_cast<int>(c.num_hidden_layers);
  const int after = q.last ? 0 : (q.first ? L - q.layers : 1);
  const int before = q.first ? 0 : L - q.layers - after;
  if (q.layers < 1 || q.tp < 1 || q.micro_batch < 1 || (!q.first && before < 1) || (!q.last && after < 1) || before + q.layers + after != L)
    return Status::InvalidArgument("memory estimate: a stage of " + std::to_string(q.layers) + " layers (first " +
                                   std::to_string(q.first) + ", last " + std::to_string(q.last) + ") in a model of " +
                                   std::to_string(L) + " layers");
  PipelineSpec ps;
  ps.micro_batch = static_cast<int>(q.micro_batch);
  if (before) ps.stages.push_back({before, 1, ""});
  index = static_cast<int>(ps.stages.size());
  ps.stages.push_back({q.layers, q.tp, ""});
  if (after) ps.stages.push_back({after, 1, ""});
  const bool zero = q.zero_ways > 1;
  if (q.ep > 1 || (q.etp > 0 && q.etp != q.tp)) {  // expert parallel: the symmetric form
    int dp = zero ? q.zero_ways : 1;
    while (!zero && (static_cast<int64_t>(q.tp) * dp) % (static_cast<int64_t>(q.ep) * std::max(q.etp, 1)) != 0 && dp < (1 << 20)) ++dp;
    std::vector<int> per;
    for (const StageSpec& st : ps.stages) per.push_back(st.layers);
    CKPT_ASSIGN_OR_RETURN(Layout l, Layout::make(q.tp, static_cast<int>(per.size()), dp, zero ? 1 : 0, L, per));
    l.micro_batch.assign(static_cast<size_t>(dp), static_cast<int>(q.micro_batch));
    l.ep = q.ep, l.etp = q.etp > 0 ? q.etp : q.tp;
    return l;
  }
  return Layout::from_pipelines(std::vector<PipelineSpec>(static_cast<size_t>(zero ? q.zero_ways : 1), ps), zero ? 1 : 0);
}

}  // namespace

Result<RankMemory> estimate_stage_memory(const LlamaConfig& config, const StageMemoryQuery& q) {
  int index = 0;
  MemoryInputs in;
  in.config = config;
  CKPT_ASSIGN_OR_RETURN(in.layout, stage_query_layout(config, q, index));
  in.seq_len = q.seq_len;
  in.checkpoints = q.checkpoints;
  in.mpi = q.mpi;
  CKPT_RETURN_IF_ERROR(in.layout.validate());
  const LlamaShardingRules rules(config);
  const std::vector<TensorMeta> tensors = trainer_tensors(config);
  std::vector<int64_t> staging, largest;
  CKPT_RETURN_IF_ERROR(staging_of(in, tensors, rules, staging, largest));
  RankMemory worst;
  for (int j = 0; j < q.tp; ++j) {
    const RankPlace pl{0, index, j};
    CKPT_ASSIGN_OR_RETURN(Held h, held_of(in, pl, tensors, rules));
    const int r = in.layout.rank_of(index, 0, j);
    RankMemory m = rank_memory(in, r, pl, static_cast<int>(std::max<int64_t>(q.slots, 1)), h, staging[static_cast<size_t>(r)],
                               largest[static_cast<size_t>(r)]);
    if (q.zero_ways <= 1) m.buffers = q.pipelines > 1 ? m.grads : 0;  // the packed gradients of the replica sum
    m.process = process_bytes(q.mpi, q.world_size);
    if (j == 0 || m.total() > worst.total()) worst = m;
  }
  return worst;
}

Status check_memory(const std::vector<RankMemory>& est, const Cluster& cluster) {
  for (const RankMemory& m : est) {
    if (m.rank < 0 || m.rank >= cluster.world_size())
      return Status::Error("ClusterMismatch", "the cluster file has " + std::to_string(cluster.world_size()) +
                                                  " ranks, the estimate names rank " + std::to_string(m.rank));
    const DeviceType& d = cluster.device_of(m.rank);
    if (m.total() <= d.memory_bytes) continue;
    return Status::Error("RankOutOfMemory",
                         "rank " + std::to_string(m.rank) + " (pipeline " + std::to_string(m.place.pipeline) +
                             ", stage " + std::to_string(m.place.stage) + ", tp rank " +
                             std::to_string(m.place.tp_rank) + ") on device type '" + d.name +
                             "' needs an estimated " + human_bytes(m.total()) + " (" + m.breakdown() +
                             ") but the device has " + human_bytes(d.memory_bytes) +
                             ": give it fewer layers, a larger tp or a smaller micro-batch, or ZeRO-1 (`ckpt plan "
                             "--memory-model embedded` plans with this estimate)");
  }
  return Status::Ok();
}

uint64_t peak_rss_bytes() {
  struct rusage ru;
  std::memset(&ru, 0, sizeof ru);
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // Linux: KiB
}

}  // namespace ckpt::trainer
