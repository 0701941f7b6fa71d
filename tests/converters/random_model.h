// Random small LLaMA models and store helpers shared by the engine's property tests
// (reshard_property_test.cc: symmetric layouts; reshard_hetero_property_test.cc: general ones).
// Header-only test code.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "converters/model/llama_config.h"
#include "converters/model/llama_sharding.h"
#include "reshard/planner.h"
#include "reshard/store_reshard.h"

namespace ckpt::testing_prop {

struct Model {
  LlamaConfig cfg;
  std::vector<TensorMeta> tensors;
  std::vector<std::vector<uint8_t>> global;  // per tensor: dense row-major bytes of the global view
};

// The choices random_model draws from (each index drawn uniformly).
struct ModelRanges {
  std::vector<int64_t> kv_heads, queries_per_group, head_dims, hiddens, intermediates;
  int64_t max_layers = 5, max_extra_vocab = 96;  // layers 1..max_layers; vocab 5..5+max_extra_vocab-1
};

inline ModelRanges symmetric_ranges() { return {{1, 2, 3, 4}, {1, 2, 3, 4}, {2, 4}, {8, 12, 16}, {24, 48}, 5, 96}; }
inline ModelRanges small_ranges() { return {{1, 2, 4}, {1, 2, 3}, {2, 4}, {8, 12}, {12, 24}, 4, 60}; }

// Random finite values (bf16: the top half of a float32), so diff compares numbers.
inline std::vector<uint8_t> random_values(const TensorMeta& t, std::mt19937& rng) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  const size_t es = dtype_size(t.dtype);
  std::vector<uint8_t> out(static_cast<size_t>(n) * es);
  for (int64_t i = 0; i < n; ++i) {
    const float f = u(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (es == 2) bits >>= 16;
    std::memcpy(out.data() + i * static_cast<int64_t>(es), &bits, es);  // little endian: the low bytes
  }
  return out;
}

// A random model with optimizer tensors (exp_avg, exp_avg_sq; fp32_param when weights are bf16).
inline Model random_model(std::mt19937& rng, const ModelRanges& r) {
  auto pick = [&rng](const std::vector<int64_t>& v) { return v[rng() % v.size()]; };
  Model m;
  LlamaConfig& c = m.cfg;
  c.num_key_value_heads = pick(r.kv_heads);
  c.num_attention_heads = c.num_key_value_heads * pick(r.queries_per_group);
  c.head_dim = pick(r.head_dims);
  c.hidden_size = pick(r.hiddens);
  c.intermediate_size = pick(r.intermediates);
  c.num_hidden_layers = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(r.max_layers));
  c.vocab_size = 5 + static_cast<int64_t>(rng() % static_cast<uint64_t>(r.max_extra_vocab));
  c.tie_word_embeddings = rng() % 2;
  c.attention_bias = rng() % 5 == 0;
  c.mlp_bias = rng() % 5 == 0;
  const DType wdt = rng() % 2 ? DType::kBF16 : DType::kF32;
  c.dtype = wdt;
  m.tensors = llama_model_tensors(c, wdt);
  const size_t nparams = m.tensors.size();
  for (std::string kind : {"optimizer.exp_avg.", "optimizer.exp_avg_sq.", "optimizer.fp32_param."}) {
    if (kind == "optimizer.fp32_param." && wdt == DType::kF32) continue;
    for (size_t i = 0; i < nparams; ++i) m.tensors.push_back({kind + m.tensors[i].name, DType::kF32, m.tensors[i].shape});
  }
  for (const auto& t : m.tensors) m.global.push_back(random_values(t, rng));
  return m;
}

// The tensor-parallel sizes among `candidates` that the model takes.
inline std::vector<int> allowed_tps(const LlamaConfig& c, std::initializer_list<int> candidates) {
  std::vector<int> out;
  LlamaShardingRules rules(c);
  for (int tp : candidates) {
    auto l = Layout::make(tp, 1, 1, 0, static_cast<int>(c.num_hidden_layers));
    if (l.ok() && rules.check_layout(*l).ok()) out.push_back(tp);
  }
  return out;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// 1..max_threads executor threads and one of `chunks` (small chunks exercise chunk boundaries).
inline StoreExecOptions random_exec(std::mt19937& rng, int max_threads, const std::vector<uint64_t>& chunks) {
  StoreExecOptions o;
  o.store.fsync = false;
  o.exec.threads = 1 + static_cast<int>(rng() % static_cast<uint64_t>(max_threads));
  o.exec.max_chunk_bytes = chunks[rng() % chunks.size()];
  return o;
}

// Reshards `src` (any TensorSource) into a new store at `dst` under `layout`.
inline Status reshard_to(TensorSource& src, const LlamaConfig& cfg, const Layout& layout, const std::string& dst,
                         const StoreExecOptions& opts) {
  LlamaShardingRules rules(cfg);
  CKPT_ASSIGN_OR_RETURN(Plan plan, make_plan(src.tensors(), src.pieces(), src.metadata(), layout, rules, opts.exec));
  return execute_plan_to_store(src, plan, dst, opts);
}

}  // namespace ckpt::testing_prop
