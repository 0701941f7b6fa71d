// Resharding benchmark helper (a command, not a timed test). Two subcommands:
//   reshard_bench make-source DST [--layers 8 --hidden 1536 --inter 4096 --heads 12 --kv 4
//                 --vocab 32000 --tp 4 --pp 2 --dp 2 --zero 1 --pp-layers a,b --no-optimizer
//                 --threads 2 --no-fsync]
//       Writes a native-store checkpoint of a synthetic LLaMA model (bf16 weights; with optimizer
//       state: fp32 master weights, Adam exp_avg and exp_avg_sq) in the given layout, values
//       generated on the fly from (tensor, element index) so memory stays bounded. Prints JSON.
//   reshard_bench plan [--layers 80 --hidden 8192 --inter 28672 --heads 64 --kv 8 --vocab 32000
//                 --from-tp 8 --from-pp 8 --to-tp 4 --to-pp 16 --dp 1 --zero 0 --optimizer --repeat 5]
//       Planning time (make_plan from metadata alone) for a 70B-shaped model; prints JSON.
// benchmarks/reshard_bench.py drives the full benchmark (copy, torch baseline, threads, MPI).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "converters/model/llama_sharding.h"
#include "formats/base/int_list.h"
#include "reshard/planner.h"
#include "reshard/store_reshard.h"

using namespace ckpt;
using Clock = std::chrono::steady_clock;

namespace {

double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A TensorSource of whole global tensors whose element i of tensor t is a deterministic small
// float derived from hash(t, i) (about uniform in [-0.05, 0.05)). Nothing is held in memory.
class SyntheticSource final : public TensorSource {
 public:
  SyntheticSource(std::vector<TensorMeta> tensors, nlohmann::json meta) : tensors_(std::move(tensors)), meta_(std::move(meta)) {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      pieces_.push_back({tensors_[i].name, Region{Box::whole(tensors_[i].shape)}, tensors_[i].dtype});
      seeds_.push_back(splitmix(std::hash<std::string>{}(tensors_[i].name)));
    }
  }
  const std::vector<TensorMeta>& tensors() const override { return tensors_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return "synthetic"; }
  Status read(size_t piece, const Box& sub, void* dst) override {
    const TensorMeta& t = tensors_[piece];
    const size_t nd = sub.ndim();
    const int64_t row = nd ? sub.extent[nd - 1] : 1;
    const int64_t rows = row ? sub.numel() / row : 0;
    const bool bf16 = t.dtype == DType::kBF16;
    std::vector<int64_t> idx(nd, 0);  // index of the current row inside `sub` (last dim unused)
    for (int64_t r = 0; r < rows; ++r) {
      int64_t g = 0;  // global flat index of the row's first element
      for (size_t d = 0; d < nd; ++d) g = g * t.shape[d] + sub.offset[d] + (d + 1 < nd ? idx[d] : 0);
      for (int64_t k = 0; k < row; ++k) {
        const uint64_t h = splitmix(seeds_[piece] ^ static_cast<uint64_t>(g + k));
        const float f = (static_cast<float>(h >> 40) * (1.0f / 16777216.0f) - 0.5f) * 0.1f;
        if (bf16) {
          uint32_t bits;
          std::memcpy(&bits, &f, 4);
          const uint16_t b = static_cast<uint16_t>(bits >> 16);
          std::memcpy(static_cast<uint8_t*>(dst) + (r * row + k) * 2, &b, 2);
        } else {
          std::memcpy(static_cast<uint8_t*>(dst) + (r * row + k) * 4, &f, 4);
        }
      }
      for (size_t d = nd - 1; d-- > 0;) {  // next row
        if (++idx[d] < sub.extent[d]) break;
        idx[d] = 0;
      }
    }
    return Status::Ok();
  }

 private:
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
  std::vector<uint64_t> seeds_;
  nlohmann::json meta_;
};

struct Args {
  std::vector<std::string> pos;
  std::vector<std::pair<std::string, std::string>> kv;
  bool flag(const std::string& k) const {
    for (const auto& [a, b] : kv)
      if (a == k) return true;
    return false;
  }
  std::string get(const std::string& k, const std::string& def) const {
    for (const auto& [a, b] : kv)
      if (a == k) return b;
    return def;
  }
  int64_t num(const std::string& k, int64_t def) const { return std::stoll(get(k, std::to_string(def))); }
};

Args parse(int argc, char** argv, const std::vector<std::string>& flags) {
  Args a;
  for (int i = 2; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) == 0) {
      bool is_flag = false;
      for (const auto& f : flags) is_flag |= f == s;
      if (is_flag || i + 1 >= argc) a.kv.push_back({s, ""});
      else a.kv.push_back({s, argv[++i]});
    } else {
      a.pos.push_back(s);
    }
  }
  return a;
}

LlamaConfig config_from(const Args& a, int64_t L, int64_t h, int64_t I, int64_t H, int64_t K, int64_t V) {
  LlamaConfig c;
  c.num_hidden_layers = a.num("--layers", L);
  c.hidden_size = a.num("--hidden", h);
  c.intermediate_size = a.num("--inter", I);
  c.num_attention_heads = a.num("--heads", H);
  c.num_key_value_heads = a.num("--kv", K);
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.vocab_size = a.num("--vocab", V);
  c.tie_word_embeddings = a.flag("--tied");
  c.dtype = DType::kBF16;
  return c;
}

std::vector<TensorMeta> tensors_of(const LlamaConfig& c, bool optimizer) {
  std::vector<TensorMeta> ts = llama_model_tensors(c, DType::kBF16);
  if (optimizer) {
    const size_t n = ts.size();
    for (const char* kind : {"optimizer.fp32_param.", "optimizer.exp_avg.", "optimizer.exp_avg_sq."})
      for (size_t i = 0; i < n; ++i) ts.push_back({kind + ts[i].name, DType::kF32, ts[i].shape});
  }
  return ts;
}

int fail(const Status& st) {
  std::fprintf(stderr, "reshard_bench: %s\n", st.to_string().c_str());
  return 1;
}

int make_source(const Args& a) {
  if (a.pos.size() != 1) {
    std::fprintf(stderr, "usage: reshard_bench make-source DST [options]\n");
    return 2;
  }
  const LlamaConfig c = config_from(a, 8, 1536, 4096, 12, 4, 32000);
  std::vector<int> per;
  if (!a.get("--pp-layers", "").empty()) {
    auto p = parse_int_list(a.get("--pp-layers", ""), "--pp-layers");
    if (!p.ok()) return fail(p.status());
    per = *p;
  }
  auto layout = Layout::make(static_cast<int>(a.num("--tp", 4)), static_cast<int>(a.num("--pp", 2)),
                             static_cast<int>(a.num("--dp", 2)), static_cast<int>(a.num("--zero", 1)),
                             static_cast<int>(c.num_hidden_layers), per);
  if (!layout.ok()) return fail(layout.status());
  SyntheticSource src(tensors_of(c, !a.flag("--no-optimizer")), {{"model_config", c.to_json()}});
  LlamaShardingRules rules(c);
  StoreExecOptions o;
  o.exec.threads = static_cast<int>(a.num("--threads", 2));
  o.exec.max_chunk_bytes = 16u << 20;
  o.store.fsync = !a.flag("--no-fsync");
  const auto t0 = Clock::now();
  auto plan = make_plan(src.tensors(), src.pieces(), src.metadata(), *layout, rules, o.exec);
  if (!plan.ok()) return fail(plan.status());
  Status st = execute_plan_to_store(src, *plan, a.pos[0], o);
  if (!st.ok()) return fail(st);
  nlohmann::json j = {{"dst", a.pos[0]},           {"layout", layout->to_string()}, {"bytes", plan->bytes_written},
                      {"files", plan->files.size()}, {"pieces", plan->pieces.size()}, {"tensors", plan->tensors.size()},
                      {"seconds", secs_since(t0)}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

int plan_time(const Args& a) {
  const LlamaConfig c = config_from(a, 80, 8192, 28672, 64, 8, 32000);
  const bool opt = a.flag("--optimizer");
  const std::vector<TensorMeta> ts = tensors_of(c, opt);
  LlamaShardingRules rules(c);
  const int dp = static_cast<int>(a.num("--dp", 1)), zero = static_cast<int>(a.num("--zero", 0));
  auto from = Layout::make(static_cast<int>(a.num("--from-tp", 8)), static_cast<int>(a.num("--from-pp", 8)), dp, zero,
                           static_cast<int>(c.num_hidden_layers));
  auto to = Layout::make(static_cast<int>(a.num("--to-tp", 4)), static_cast<int>(a.num("--to-pp", 16)), dp, zero,
                         static_cast<int>(c.num_hidden_layers));
  if (!from.ok()) return fail(from.status());
  if (!to.ok()) return fail(to.status());
  // Source pieces: what the source layout stores (metadata only).
  auto placed = place_tensors(ts, *from, rules);
  if (!placed.ok()) return fail(placed.status());
  std::vector<Piece> src_pieces;
  for (size_t i = 0; i < ts.size(); ++i)
    for (const auto& rr : (*placed)[i]) src_pieces.push_back({ts[i].name, rr.region, ts[i].dtype});
  const int repeat = static_cast<int>(a.num("--repeat", 5));
  std::vector<double> times;
  size_t pieces = 0, files = 0;
  uint64_t bytes = 0;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = Clock::now();
    auto plan = make_plan(ts, src_pieces, nlohmann::json::object(), *to, rules);
    times.push_back(secs_since(t0));
    if (!plan.ok()) return fail(plan.status());
    pieces = plan->pieces.size();
    files = plan->files.size();
    bytes = plan->bytes_written;
  }
  std::sort(times.begin(), times.end());
  nlohmann::json j = {{"model", "L=" + std::to_string(c.num_hidden_layers) + " h=" + std::to_string(c.hidden_size) +
                                    " I=" + std::to_string(c.intermediate_size) + " H=" + std::to_string(c.num_attention_heads) +
                                    " K=" + std::to_string(c.num_key_value_heads) + " V=" + std::to_string(c.vocab_size)},
                      {"optimizer", opt},
                      {"from", from->to_string()},
                      {"to", to->to_string()},
                      {"tensors", ts.size()},
                      {"source_pieces", src_pieces.size()},
                      {"target_pieces", pieces},
                      {"target_files", files},
                      {"target_bytes", bytes},
                      {"plan_seconds_min", times.front()},
                      {"plan_seconds_median", times[times.size() / 2]},
                      {"plan_seconds_max", times.back()}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "make-source") return make_source(parse(argc, argv, {"--no-optimizer", "--no-fsync", "--tied"}));
  if (cmd == "plan") return plan_time(parse(argc, argv, {"--optimizer", "--tied"}));
  std::fprintf(stderr, "usage: reshard_bench make-source DST [...] | plan [...]\n");
  return 2;
}
