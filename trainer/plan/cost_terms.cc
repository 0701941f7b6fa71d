// The per-stage terms of the cost model (trainer/plan/cost_model.h; formulas in docs/PLAN.md).
#include <algorithm>
#include <cmath>
#include <map>

#include "trainer/plan/cost_model.h"

namespace ckpt::trainer {

ModelSpec ModelSpec::from_config(const LlamaConfig& c) {
  ModelSpec m;
  m.layers = c.num_hidden_layers;
  m.hidden = c.hidden_size;
  m.ffn = c.intermediate_size;
  m.heads = c.num_attention_heads;
  m.kv_heads = c.num_key_value_heads;
  m.head_dim = c.head_dim;
  m.vocab = c.vocab_size;
  m.tied = c.tie_word_embeddings;
  if (c.moe) {
    m.experts = c.moe->num_experts, m.top_k = c.moe->top_k;
    m.expert_ffn = c.moe->expert_intermediate, m.shared_ffn = c.moe->shared_intermediate;
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) m.moe_layers += c.moe->is_moe_layer(i) ? 1 : 0;
  }
  return m;
}

namespace {
// The average over the layers of a term worth `dense` on a dense layer and `moe` on an MoE one (rounded up).
int64_t terms_avg(const ModelSpec& m, int64_t dense, int64_t moe) {
  return ((m.layers - m.moe_layers) * dense + m.moe_layers * moe + m.layers - 1) / m.layers;
}
}  // namespace

int64_t ModelSpec::layer_split_params() const {
  const int64_t q = heads * head_dim, kv = kv_heads * head_dim;
  return hidden * q + 2 * hidden * kv + q * hidden + terms_avg(*this, 3 * hidden * ffn, 3 * hidden * shared_ffn);
}

int64_t ModelSpec::layer_norm_params() const { return 2 * hidden + terms_avg(*this, 0, experts * hidden); }

int64_t ModelSpec::layer_expert_params() const { return terms_avg(*this, 0, 3 * experts * hidden * expert_ffn); }

int64_t ModelSpec::total_params() const {
  return layers * (layer_split_params() + layer_norm_params() + layer_expert_params()) + vocab * hidden * (tied ? 1 : 2) + hidden;
}

bool ModelSpec::tp_divides(int t) const {
  if (heads % t || kv_heads % t) return false;
  if (moe_layers < layers && ffn % t) return false;
  return !moe() || (expert_ffn % t == 0 && shared_ffn % t == 0);
}

bool ModelSpec::ep_fits(int ep, int etp, int tp, int replicas) const {
  if (!moe() || ep < 1 || etp < 1 || tp % etp || expert_ffn % etp || experts % ep) return false;
  return (static_cast<int64_t>(tp) * replicas) % (static_cast<int64_t>(ep) * etp) == 0;
}

double ModelSpec::layer_forward_flops(int64_t b, int64_t s) const {
  const double n = static_cast<double>(b) * static_cast<double>(s);
  const double D = static_cast<double>(hidden), q = static_cast<double>(heads * head_dim),
               kv = static_cast<double>(kv_heads * head_dim), F = static_cast<double>(ffn);
  const double proj = 2 * n * D * (q + 2 * kv) + 2 * n * q * D;  // q, k, v, o
  const double attn = 2 * 2 * static_cast<double>(b) * static_cast<double>(heads) * static_cast<double>(s) *
                      static_cast<double>(s) * static_cast<double>(head_dim);  // Q K^T and P V
  const double mlp = 3 * 2 * n * D * F;                                      // gate, up, down
  if (!moe()) return proj + attn + mlp;
  // Router, the top-k experts each token runs, the shared expert (Model::train_flops_per_token).
  const double moe_mlp = 2 * n * D * static_cast<double>(experts + 3 * top_k * expert_ffn + 3 * shared_ffn);
  const double Lm = static_cast<double>(moe_layers), L = static_cast<double>(layers);
  return proj + attn + ((L - Lm) * mlp + Lm * moe_mlp) / L;
}

double ModelSpec::head_forward_flops(int64_t b, int64_t s) const {
  return 2.0 * static_cast<double>(b) * static_cast<double>(s) * static_cast<double>(hidden) * static_cast<double>(vocab);
}

double ModelSpec::step_flops(int64_t sequences, int64_t s) const {
  return 3 * (static_cast<double>(layers) * layer_forward_flops(sequences, s) + head_forward_flops(sequences, s));
}

int dtype_bytes_of(const DeviceType& d) { return d.dtype == "fp32" ? 4 : 2; }

int64_t stage_rank_params(const ModelSpec& m, const StageShape& st) {
  const int64_t t = st.tp;
  int64_t p = st.layers * (m.layer_split_params() / t + m.layer_norm_params() + m.layer_expert_params() / (st.ep * st.expert_tp()));
  const int64_t emb = (m.vocab + t - 1) / t * m.hidden;
  if (st.first) p += emb;
  if (st.last) p += m.hidden + ((st.first && m.tied) ? 0 : emb);  // final norm; head (or tied copy)
  return p;
}

double stage_rank_flops(const ModelSpec& m, const StageShape& st, int64_t b, int64_t s) {
  double f = static_cast<double>(st.layers) * m.layer_forward_flops(b, s);
  if (m.moe() && m.expert_load(st.ep) > 1)  // the busiest EP rank's extra routed rows
    f += (m.expert_load(st.ep) - 1) * st.layers * static_cast<double>(m.moe_layers) / static_cast<double>(m.layers) * 6.0 *
         static_cast<double>(b) * static_cast<double>(s) * static_cast<double>(m.hidden * m.top_k * m.expert_ffn);
  if (st.last) f += m.head_forward_flops(b, s);
  return 3 * f / st.tp;
}

double ring_allreduce_s(double bytes, int n, const LinkSpec& link) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / link.bytes_per_s + 2.0 * (n - 1) * std::max(0.0, link.latency_s);
}

double stage_etp_comm_s(const ModelSpec& m, const StageShape& st, int64_t b, int64_t s, int act_bytes, const LinkSpec& link) {
  const int etp = st.expert_tp();
  if (!m.moe() || st.ep <= 1 || etp <= 1) return 0;
  // The ETP all-gather and reduce-scatter of the rank's routed rows, forward and backward.
  const double rows = static_cast<double>(b) * static_cast<double>(s) * static_cast<double>(m.top_k) * etp / st.tp;
  const double calls = 4.0 * st.layers * static_cast<double>(m.moe_layers) / static_cast<double>(m.layers);
  return calls * ring_allreduce_s(rows * static_cast<double>(m.hidden) * act_bytes, etp, link) / 2;  // half a ring all-reduce each
}

double stage_tp_comm_s(const ModelSpec& m, const StageShape& st, int64_t b, int64_t s, int act_bytes, const LinkSpec& link) {
  if (st.tp <= 1) return 0;
  const double bytes = static_cast<double>(b) * static_cast<double>(s) * static_cast<double>(m.hidden) * act_bytes;
  const int count = 4 * st.layers + (st.first ? 1 : 0) + (st.last ? 1 : 0);
  return count * ring_allreduce_s(bytes, st.tp, link) + stage_etp_comm_s(m, st, b, s, act_bytes, link);
}

double stage_a2a_bytes(const ModelSpec& m, const StageShape& st, int64_t b, int64_t s, int act_bytes) {
  if (st.ep <= 1 || !m.moe()) return 0;
  return static_cast<double>(b) * static_cast<double>(s) / st.tp * static_cast<double>(m.top_k) * static_cast<double>(m.hidden) *
         act_bytes * (st.ep - 1) / st.ep * m.expert_load(st.ep);
}

double stage_a2a_s(const ModelSpec& m, const StageShape& st, int64_t b, int64_t s, int act_bytes, const LinkSpec& link) {
  if (st.ep <= 1 || !m.moe()) return 0;
  const double calls = 4.0 * st.layers * static_cast<double>(m.moe_layers) / static_cast<double>(m.layers);
  return calls * (stage_a2a_bytes(m, st, b, s, act_bytes) / link.bytes_per_s + (st.ep - 1) * std::max(0.0, link.latency_s));
}

int64_t stage_rank_updated_params(const ModelSpec& m, const StageShape& st, int zero_ways) {
  const int64_t params = stage_rank_params(m, st);
  const int64_t expert = st.layers * (m.layer_expert_params() / (st.ep * st.expert_tp()));
  if (zero_ways <= 1) return params;
  // ZeRO-1: the dense part over zero_ways, the experts' over their group (stage_rank_memory).
  const int64_t eways = std::max<int64_t>(1, static_cast<int64_t>(zero_ways) * st.tp / (st.ep * st.expert_tp()));
  return (params - expert + zero_ways - 1) / zero_ways + (expert + eways - 1) / eways;
}

MemoryTerms stage_rank_memory(const ModelSpec& m, const StageShape& st, int64_t b, int64_t s, int dtype_bytes,
                              int64_t slots, int zero_ways) {
  MemoryTerms r;
  const uint64_t params = static_cast<uint64_t>(stage_rank_params(m, st));
  const uint64_t wb = static_cast<uint64_t>(dtype_bytes);
  r.weights = params * wb;
  r.grads = params * wb;
  const uint64_t per_param = dtype_bytes >= 4 ? 8 : 12;  // fp32 master (not for fp32) + 2 moments
  const uint64_t expert = static_cast<uint64_t>(st.layers * (m.layer_expert_params() / (st.ep * st.expert_tp())));
  const uint64_t ways = static_cast<uint64_t>(std::max(1, zero_ways));
  // The experts' ZeRO-1 group: the stage's tp x zero_ways ranks over ep x etp.
  const uint64_t eways = zero_ways > 1 ? std::max<uint64_t>(1, ways * static_cast<uint64_t>(st.tp) /
                                                                     static_cast<uint64_t>(st.ep * st.expert_tp()))
                                       : 1;
  r.optimizer = ((params - expert) * per_param + ways - 1) / ways + (expert * per_param + eways - 1) / eways;
  const int64_t t = st.tp;
  // Activation width of the MLP per token: the dense ffn, or the top-k experts' rows and the shared expert.
  const int64_t act_ffn = terms_avg(m, m.ffn, m.top_k * m.expert_ffn + m.shared_ffn);
  const int64_t per_token_layer = 4 * m.hidden + (2 * m.heads * m.head_dim + 2 * m.kv_heads * m.head_dim +
                                                  3 * act_ffn + m.heads * s) / t;
  const int64_t n = b * s;
  uint64_t act = static_cast<uint64_t>(slots) * static_cast<uint64_t>(n) *
                 static_cast<uint64_t>(st.layers * per_token_layer + m.hidden) * wb;
  if (st.last) act += static_cast<uint64_t>(n) * static_cast<uint64_t>((m.vocab + t - 1) / t) * 8;  // fp32 logits + grad
  r.activations = act;
  return r;
}

}  // namespace ckpt::trainer

namespace ckpt::trainer {

namespace {
LinkSpec terms_pair_link(const Cluster& c, const std::vector<int>& from, const std::vector<int>& to) {
  LinkSpec w{1e300, 0};
  for (size_t j = 0; j < to.size(); ++j) {
    const LinkSpec l = c.link(from[j % from.size()], to[j]);
    if (l.bytes_per_s < w.bytes_per_s || (l.bytes_per_s == w.bytes_per_s && l.latency_s > w.latency_s)) w = l;
  }
  return w;
}
}  // namespace

namespace {
// The expert all-to-all's link of a stage (StagePlace::a2a_link): the measured one when set, else
// the TP group's when the EP group (ep x etp consecutive stage ranks) stays inside it, else the
// slower of the TP and data-parallel links.
LinkSpec terms_a2a_link(const StagePlace& p, const StageShape& st) {
  if (p.a2a_link.bytes_per_s > 0) return p.a2a_link;
  if (st.ep * st.expert_tp() <= st.tp || !(p.dp_link.bytes_per_s > 0)) return p.tp_link;
  return p.dp_link.bytes_per_s < p.tp_link.bytes_per_s ? p.dp_link : p.tp_link;
}
}  // namespace

StagePlace make_stage_place(const Cluster& c, const std::vector<int>& ranks, const std::vector<int>& prev,
                            const std::vector<int>& next, const std::vector<int>& replicas) {
  StagePlace p;
  p.capacity = UINT64_MAX;
  for (int r : ranks) {
    const DeviceType& d = c.device_of(r);
    if (!p.device || d.peak_flops * Cluster::efficiency_of(d) < p.device->peak_flops * Cluster::efficiency_of(*p.device)) p.device = &d;
    p.capacity = std::min(p.capacity, d.memory_bytes);
  }
  p.tp_link = c.slowest_link(ranks);
  p.has_prev = !prev.empty();
  p.has_next = !next.empty();
  if (p.has_prev) p.prev_link = terms_pair_link(c, ranks, prev);  // our input gradient goes back
  if (p.has_next) p.next_link = terms_pair_link(c, ranks, next);  // our activation goes forward
  if (replicas.size() > 1) p.dp_link = c.slowest_link(replicas);
  return p;
}

StageCost stage_cost(const ModelSpec& model, const StagePlace& place, const StageShape& shape, int64_t b, int64_t s,
                     int64_t m, int stage, int stages, int pipelines, int zero_ways, EmbeddedStageMemory* embedded) {
  StageCost c;
  c.stage = stage;
  c.layers = shape.layers;
  c.tp = shape.tp;
  c.ep = shape.ep, c.etp = shape.expert_tp();
  c.device = place.device->name;
  const int ab = dtype_bytes_of(*place.device);
  c.flops = stage_rank_flops(model, shape, b, s);
  c.compute_s = c.flops / place.speed();
  c.overhead_s = place.micro_batch_overhead_s;
  c.tp_comm_s = stage_tp_comm_s(model, shape, b, s, ab, place.tp_link);
  c.a2a_s = stage_a2a_s(model, shape, b, s, ab, terms_a2a_link(place, shape));
  const double act = static_cast<double>(b) * static_cast<double>(s) * static_cast<double>(model.hidden) * ab;
  if (place.has_next) c.p2p_s += act / place.next_link.bytes_per_s + place.next_link.latency_s;
  if (place.has_prev) c.p2p_s += act / place.prev_link.bytes_per_s + place.prev_link.latency_s;
  const int64_t slots = std::min<int64_t>(stages - stage, m);
  if (embedded) {
    const StageMemoryBytes e = embedded->get(shape.layers, shape.tp, shape.first, shape.last, b, s, slots, zero_ways, pipelines, shape.ep,
                                                  shape.expert_tp());
    c.weights = e.weights, c.grads = e.grads, c.optimizer = e.optimizer, c.activations = e.activations, c.other = e.other;
  } else {
    const MemoryTerms mem = stage_rank_memory(model, shape, b, s, ab, slots, zero_ways);
    c.weights = mem.weights, c.grads = mem.grads, c.optimizer = mem.optimizer, c.activations = mem.activations;
  }
  c.capacity = place.capacity;
  const bool measured_sync = place.sync_link.bytes_per_s > 0;
  const int edp = std::max(1, shape.tp * pipelines / (shape.ep * shape.expert_tp()));
  if (pipelines > 1 || (model.moe() && edp > 1)) {  // dense gradients over the pipelines, the experts' over their data-parallel group
    const int64_t expert = shape.layers * (model.layer_expert_params() / (shape.ep * shape.expert_tp()));
    const LinkSpec& dense_link = measured_sync ? place.sync_link : place.dp_link;
    const LinkSpec& expert_link = measured_sync ? place.sync_link : pipelines > 1 ? place.dp_link : place.tp_link;
    c.dp_sync_s = ring_allreduce_s(static_cast<double>(stage_rank_params(model, shape) - expert) * ab, pipelines, dense_link);
    if (expert > 0) c.dp_sync_s += ring_allreduce_s(static_cast<double>(expert) * ab, edp, expert_link);
  }
  if (place.update_params_per_s > 0)
    c.update_s = static_cast<double>(stage_rank_updated_params(model, shape, zero_ways)) / (place.update_params_per_s * place.speed_scale);
  // What the trainer's a2a_s counts: the all-to-alls, the ETP collectives and, under imbalance, the
  // wait of the other EP ranks for the busiest one (its extra expert rows: stage_rank_flops).
  c.a2a_trainer_s = c.a2a_s + stage_etp_comm_s(model, shape, b, s, ab, place.tp_link);
  if (model.moe() && model.expert_load(shape.ep) > 1) {
    ModelSpec balanced = model;
    balanced.router_load = 1;
    c.a2a_trainer_s += (c.flops - stage_rank_flops(balanced, shape, b, s)) / place.speed();
  }
  return c;
}

LinkSpec slowest_link_of(const Cluster& c, const std::vector<int>& ranks) {
  if (ranks.size() < 3) return c.slowest_link(ranks);
  // One rank per distinct (node, type); per type up to two ranks on distinct nodes (a pair across
  // nodes exists for two types unless both sit on one same node only).
  std::vector<std::pair<std::pair<int, int>, int>> keys;
  keys.reserve(ranks.size());
  for (int r : ranks) keys.push_back({{c.node_of(r), c.rank_type.at(static_cast<size_t>(r))}, r});
  std::sort(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  keys.erase(std::unique(keys.begin(), keys.end(), [](const auto& a, const auto& b) { return a.first == b.first; }), keys.end());
  LinkSpec worst = c.link(ranks[0], ranks[0]);
  auto take = [&worst](const LinkSpec& l) {
    if (l.bytes_per_s < worst.bytes_per_s || (l.bytes_per_s == worst.bytes_per_s && l.latency_s > worst.latency_s)) worst = l;
  };
  std::map<int, std::vector<int>> two;  // type -> up to 2 ranks on distinct nodes
  for (size_t i = 0; i < keys.size(); ++i) {
    for (size_t k = i; k < keys.size() && keys[k].first.first == keys[i].first.first; ++k) take(c.link(keys[i].second, keys[k].second));
    auto& v = two[keys[i].first.second];
    if (v.size() < 2 && (v.empty() || c.node_of(v[0]) != keys[i].first.first)) v.push_back(keys[i].second);
  }
  for (auto& [ta, va] : two)
    for (auto& [tb, vb] : two)
      for (int a : va)
        for (int b : vb)
          if (c.node_of(a) != c.node_of(b)) take(c.link(a, b));
  return worst;
}

std::vector<std::vector<int>> layout_first_ranks(const Layout& l) {
  std::vector<std::vector<int>> out(static_cast<size_t>(l.num_pipelines()));
  int r = 0;
  for (int s = 0; s < l.max_stages(); ++s)
    for (int p = 0; p < l.num_pipelines(); ++p) {
      if (s >= l.num_stages(p)) continue;
      out[static_cast<size_t>(p)].push_back(r);
      r += l.stage_tp(p, s);
    }
  return out;
}

}  // namespace ckpt::trainer
