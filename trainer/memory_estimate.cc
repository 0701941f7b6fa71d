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
};

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
  for (const Piece& p : pieces) (p.tensor.compare(0, pre, "optimizer.") == 0 ? h.optimizer : h.weights) += p.region.numel();
  const Shape vshape{in.config.vocab_size, in.config.hidden_size};
  CKPT_ASSIGN_OR_RETURN(TensorPlacement emb, rules.place(TensorMeta{"model.embed_tokens.weight", DType::kF32, vshape}, view));
  h.vocab_rows = emb.tp_boxes.at(static_cast<size_t>(place.tp_rank)).extent[0];
  if (view.zero == 1) {
    CKPT_ASSIGN_OR_RETURN(ZeroBuffer b, zero_buffer(tensors, view, rules, place.stage, place.tp_rank,
                                                    zero_kind(kExpAvgPrefix)));
    h.zero_padded = b.padded;
    h.zero_shard = b.shard();
  }
  return h;
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
  const int64_t layer = 3 * n * D + 2 * n + 2 * n * Ql + 2 * n * KVl + b * Hl * S * S + 3 * n * Fl;
  ActBytes a;
  a.per_slot = kF * u(L * layer + (last ? L + 1 : L) * n * D);
  if (first) a.per_slot += kI * u(n);
  if (last) a.per_slot += kF * u(n * D + n + n * vocab_rows);
  const int64_t ws = 3 * n * Fl + n * D + 2 * n * Ql + 2 * n * KVl + S * S + 2 * n * D;
  a.workspace = kF * u(ws + S * c.head_dim + 4 * n * D) + kI * u(2 * n);
  return a;
}

RankMemory rank_memory(const MemoryInputs& in, int rank, const Held& h, int64_t staging, int64_t largest_piece) {
  const Layout& l = in.layout;
  RankMemory m;
  m.rank = rank;
  m.place = l.place_of_rank(rank);
  const int p = m.place.pipeline, s = m.place.stage;
  m.device = l.stage_device(p, s);
  m.weights = kF * u(h.weights);
  m.grads = m.weights;
  m.optimizer = kF * u(h.optimizer);
  const ActBytes a = activation_bytes(in, m.place, h.vocab_rows);
  const int slots = pipe_slots(s, l.num_stages(p), static_cast<int>(std::min<int64_t>(in.grad_accum, 1 << 20)));
  m.activations = a.per_slot * static_cast<uint64_t>(slots);
  m.workspace = a.workspace;
  if (l.zero == 1)
    m.buffers = kF * u(h.zero_padded + 2 * h.zero_shard);
  else if (l.num_pipelines() > 1)
    m.buffers = m.grads;  // the packed gradients of the DP / replica sum
  m.buffers += in.data_bytes;
  m.checkpoint = kF * u(staging) + save_write_pool_touched(kF * u(staging), kF * u(largest_piece));  // + the write pool's pages
  m.process = process_bytes(in.mpi, l.world_size());
  return m;
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
  // The saver's share: the elements the planner gives each rank to write, under the real layout
  // (replicas in other pipelines share the writing, also when the pipelines split differently).
  std::vector<int64_t> staging(static_cast<size_t>(in.layout.world_size()), 0), largest(staging.size(), 0);
  if (in.checkpoints) {
    CKPT_ASSIGN_OR_RETURN(auto placed, place_tensors(tensors, in.layout, rules));
    for (const auto& t : placed)
      for (const RankRegion& rr : t) {
        staging.at(static_cast<size_t>(rr.rank)) += rr.region.numel();
        largest[static_cast<size_t>(rr.rank)] = std::max(largest[static_cast<size_t>(rr.rank)], rr.region.numel());
      }
  }
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
    out.push_back(rank_memory(in, r, it->second, staging[static_cast<size_t>(r)], largest[static_cast<size_t>(r)]));
  }
  return out;
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
                             ": give it fewer layers, a larger tp or a smaller micro-batch, or ZeRO-1");
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
