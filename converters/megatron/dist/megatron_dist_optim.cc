#include "converters/megatron/dist/megatron_dist_optim.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>

#include "converters/megatron/dist_optim_layout.h"
#include "converters/megatron/megatron_segments.h"
#include "converters/megatron/megatron_vpp.h"
#include "formats/dtype/dtype.h"

namespace ckpt {

namespace dist_optim_detail {

// key -> (g, gbuf, dtype, bucket, state); nullopt when `name` is not a bucket tensor.
struct BucketKey {
  int64_t group = 0, gbuf = 0, bucket = 0;
  std::string dtype, state;
};

std::optional<int64_t> digits(const std::string& s) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(s);
}

std::optional<BucketKey> parse_bucket_key(const std::string& name) {
  const std::string pre = kDistOptimBucketPrefix;
  if (name.rfind(pre, 0) != 0) return std::nullopt;
  const size_t gb = name.find(".gbuf_idx_", pre.size()), dt = name.find(".dtype_", pre.size()),
               bk = name.rfind(".bucket_idx_");
  if (gb == std::string::npos || dt == std::string::npos || bk == std::string::npos || !(gb < dt && dt < bk))
    return std::nullopt;
  const size_t st = name.find('.', bk + 12);
  if (st == std::string::npos) return std::nullopt;
  BucketKey k;
  auto g = digits(name.substr(pre.size(), gb - pre.size()));
  auto i = digits(name.substr(gb + 10, dt - gb - 10));
  auto b = digits(name.substr(bk + 12, st - bk - 12));
  if (!g || !i || !b) return std::nullopt;
  k.group = *g, k.gbuf = *i, k.bucket = *b;
  k.dtype = name.substr(dt + 7, bk - dt - 7);
  k.state = name.substr(st + 1);
  if (k.state.empty() || k.state.find('.') != std::string::npos) return std::nullopt;
  return k;
}

struct Buckets {  // one grad buffer's bucket tensors (of a model-parallel group): bucket -> state -> DCP index
  std::map<int64_t, std::map<std::string, size_t>> by_bucket;
  std::set<std::string> dtypes;
};

Status missing_state(const std::string& dir, int64_t g, int64_t b, const std::string& state) {
  return Status::Error("MissingDistOptimState", "'" + dir + "': dp_group_idx_" + std::to_string(g) + " bucket " +
                                                    std::to_string(b) + " has no '" + state +
                                                    "' tensor while other buckets do (or no masters 'param' at all)")
      .with_file(dir);
}

// Covered: the DCP chunks of `t` hold every element of [begin, begin + n).
bool covered(const TensorSource& dcp, const std::vector<size_t>& chunks, int64_t begin, int64_t n) {
  int64_t got = 0;
  for (size_t ip : chunks) {
    const Box& b = dcp.pieces()[ip].region.box;
    const int64_t lo = std::max(begin, b.offset[0]), hi = std::min(begin + n, b.offset[0] + b.extent[0]);
    if (hi > lo) got += hi - lo;
  }
  return got == n;
}

}  // namespace dist_optim_detail

void add_group_pieces(const DistOptimGroup& grp, const std::vector<std::string>& states,
                      const std::function<std::optional<DistOptimPiece>(size_t, const std::string&, int64_t, int64_t)>& at,
                      std::set<std::pair<std::string, Shape>>& seen, DistOptimPlan& plan) {
  for (size_t k = 0; k < grp.layout.params.size(); ++k) {
    const MegatronTensor& t = *grp.slot_tensor[k];
    int64_t row_elems = 1;
    for (size_t d = 1; d < t.shape.size(); ++d) row_elems *= t.shape[d];
    int64_t flat = grp.layout.params[k].start - grp.layout.buckets[grp.layout.params[k].bucket].start;
    for (const MegatronSegment& sg : t.segments) {
      const int64_t n = sg.rows() * row_elems;
      if (!sg.tensor.empty() && seen.insert({sg.tensor, sg.box.offset}).second)
        for (const auto& state : states)
          if (auto p = at(k, state, flat, n)) {
            p->tensor = state == "param" ? sg.tensor : "optimizer." + state + "." + sg.tensor;
            p->box = sg.box;
            plan.pieces.push_back(std::move(*p));
          }
      flat += n;
    }
  }
}

namespace dist_optim_detail {

// The pieces of grad buffer `gbuf` of model-parallel group (tp_r, pp_r): of the model chunk `gbuf`
// (chunk stage gbuf * pp + pp_r of `stages`, the plain pipeline of a virtual one; `stages` is the
// saved layout and gbuf 0 without one).
Status plan_group(const TensorSource& dcp, const LlamaConfig& cfg, const Layout& stages, int vpp, const nlohmann::json& args,
                  const std::string& dir, int tp_r, int pp_r, int gbuf, const Buckets& bk,
                  const std::vector<std::string>& states, const std::map<size_t, std::vector<size_t>>& chunks,
                  std::set<std::pair<std::string, Shape>>& seen, DistOptimPlan& plan) {
  const int pp = stages.pp / vpp;
  const int64_t g = tp_r + int64_t{stages.tp} * pp_r;
  CKPT_ASSIGN_OR_RETURN(DistOptimGroup grp, dist_optim_group(cfg, stages, args, dir, tp_r, gbuf * pp + pp_r, vpp));
  const DistOptimLayout& lay = grp.layout;
  const std::string where = "'" + dir + "' dp_group_idx_" + std::to_string(g) + " gbuf_idx_" + std::to_string(gbuf);
  std::vector<int64_t> recorded;
  for (const auto& [b, st] : bk.by_bucket) {
    if (b != static_cast<int64_t>(recorded.size()))
      return Status::Error("DistOptimBucketCount", where + ": bucket indices are not 0, 1, ...: bucket " +
                                                       std::to_string(recorded.size()) + " is missing")
          .with_file(dir);
    const auto p = st.find("param");
    if (p == st.end()) return missing_state(dir, g, b, "param");
    for (const auto& s2 : states) {
      auto it = st.find(s2);
      if (it == st.end()) return missing_state(dir, g, b, s2);
      const TensorMeta& m = dcp.tensors()[it->second];
      if (m.shape.size() != 1 || m.shape != dcp.tensors()[p->second].shape)
        return Status::Error("DistOptimBucketMismatch", where + ": '" + m.name + "' has shape " + shape_to_string(m.shape) +
                                                            ", its bucket's masters " +
                                                            shape_to_string(dcp.tensors()[p->second].shape))
            .with_file(dir)
            .with_tensor(m.name);
    }
    recorded.push_back(dcp.tensors()[p->second].shape[0]);
  }
  CKPT_RETURN_IF_ERROR(check_dist_optim_buckets(lay, recorded, where).with_file(dir));
  Status st = Status::Ok();
  auto at = [&](size_t k, const std::string& state, int64_t flat, int64_t n) -> std::optional<DistOptimPiece> {
    const size_t di = bk.by_bucket.at(static_cast<int64_t>(lay.params[k].bucket)).at(state);
    if (!covered(dcp, chunks.at(di), flat, n)) {
      if (st.ok())
        st = Status::Error("DistOptimRangeNotCovered", where + ": the elements [" + std::to_string(flat) + ", " +
                                                           std::to_string(flat + n) + ") of '" + dcp.tensors()[di].name +
                                                           "' (" + lay.params[k].name + ") are not all in its chunks")
                 .with_file(dir)
                 .with_tensor(dcp.tensors()[di].name);
      return std::nullopt;
    }
    plan.dcp_read.insert(dcp.tensors()[di].name);
    return DistOptimPiece{"", {}, di, flat};
  };
  add_group_pieces(grp, states, at, seen, plan);
  return st;
}

}  // namespace dist_optim_detail

Result<std::optional<DistOptimPlan>> plan_dp_reshardable(const TensorSource& dcp, const LlamaConfig& cfg,
                                                         const Layout& saved, int64_t vpp, const nlohmann::json& args,
                                                         const std::string& dir) {
  using namespace dist_optim_detail;
  std::map<std::pair<int64_t, int64_t>, Buckets> groups;  // (dp_group_idx, gbuf_idx)
  std::map<size_t, std::vector<size_t>> chunks;
  std::set<std::string> states;
  for (size_t i = 0; i < dcp.tensors().size(); ++i)
    if (auto k = parse_bucket_key(dcp.tensors()[i].name)) {
      Buckets& b = groups[{k->group, k->gbuf}];
      b.by_bucket[k->bucket][k->state] = i;
      b.dtypes.insert(k->dtype);
      states.insert(k->state);
      chunks[i];
    }
  if (groups.empty()) return std::optional<DistOptimPlan>();
  std::map<std::string, size_t> index;
  for (const auto& [i, v] : chunks) index[dcp.tensors()[i].name] = i;
  for (size_t ip = 0; ip < dcp.pieces().size(); ++ip)
    if (auto it = index.find(dcp.pieces()[ip].tensor); it != index.end()) chunks[it->second].push_back(ip);
  DistOptimPlan plan;
  plan.states.assign(states.begin(), states.end());
  const std::string impl = args.value("transformer_impl", std::string());
  if (std::any_of(states.begin(), states.end(),
                       [](const std::string& x) { return x != "param" && x != "exp_avg" && x != "exp_avg_sq"; }))
    plan.not_imported_reason = "the buckets hold states other than param, exp_avg, exp_avg_sq";
  else if (impl != "local")
    plan.not_imported_reason = "args.transformer_impl is '" + impl +
                               "': only the local spec's parameter order (transformer_impl 'local') is known";
  if (!plan.not_imported_reason.empty()) return std::optional<DistOptimPlan>(std::move(plan));
  if (!states.count("param")) return missing_state(dir, groups.begin()->first.first, 0, "param");
  // A virtual pipeline: one grad buffer per model chunk (gbuf_idx_c = chunk c of the group's
  // pipeline rank), each laid out over its chunk stage of the plain pipeline (megatron_vpp.h).
  const int v = static_cast<int>(std::max<int64_t>(1, vpp));
  Layout stages = saved;
  if (v > 1) {
    CKPT_ASSIGN_OR_RETURN(stages, megatron_vpp_layout(saved, v, "'" + dir + "'"));
  }
  // M1 (dist_optim_layout.h): a moment args.optimizer keeps in no bucket is named.
  CKPT_RETURN_IF_ERROR(check_dist_optim_moments(args, [&](const std::string& m) { return states.count(m) > 0; },
                                                "'" + dir + "' (every bucket)", dir));
  const int64_t ngroups = int64_t{saved.tp} * saved.pp;
  for (const auto& [key, bk] : groups)
    if (key.first >= ngroups || key.second >= v || bk.dtypes.size() != 1)
      return Status::Error("UnsupportedDistOptim", "'" + dir + "': dp_group_idx_" + std::to_string(key.first) + " gbuf_idx_" +
                                                       std::to_string(key.second) +
                                                       " is not one grad buffer (one per model chunk, one dtype) of a "
                                                       "model-parallel group of tp " + std::to_string(saved.tp) + " x pp " +
                                                       std::to_string(saved.pp) + " with " + std::to_string(v) +
                                                       " model chunk(s)")
          .with_file(dir);
  std::set<std::pair<std::string, Shape>> seen;
  for (int p = 0; p < saved.pp; ++p)
    for (int r = 0; r < saved.tp; ++r)
      for (int c = 0; c < v; ++c) {
        const int64_t g = r + int64_t{saved.tp} * p;
        auto it = groups.find({g, c});
        if (it == groups.end())
          return Status::Error("MissingDistOptimState", "'" + dir + "': no bucket tensors of dp_group_idx_" + std::to_string(g) +
                                                            " gbuf_idx_" + std::to_string(c) + " (tp rank " + std::to_string(r) +
                                                            ", pp rank " + std::to_string(p) + ", model chunk " +
                                                            std::to_string(c) + ")")
              .with_file(dir);
        CKPT_RETURN_IF_ERROR(plan_group(dcp, cfg, stages, v, args, dir, r, p, c, it->second, plan.states, chunks, seen, plan));
      }
  return std::optional<DistOptimPlan>(std::move(plan));
}

Status read_dist_optim(TensorSource& dcp, const std::vector<size_t>& chunks, const std::vector<DistOptimWorld>& worlds,
                       const DistOptimPiece& p, const Box& sub, void* dst) {
  const size_t n = sub.ndim();
  if (n == 0 || n != p.box.ndim() || !p.box.contains(sub)) return Status::Internal("read_dist_optim: sub-box outside the piece");
  if (sub.empty()) return Status::Ok();
  if (p.world >= static_cast<int>(worlds.size())) return Status::Internal("read_dist_optim: bad world buffer");
  const size_t esz = dtype_size(p.world >= 0 ? worlds[p.world].tensor.storage.dtype : dcp.tensors()[p.dcp_tensor].dtype);
  const int64_t run = n ? sub.extent[n - 1] : 1, total = sub.numel();
  auto read_run = [&](int64_t begin, int64_t len, char* out) -> Status {
    if (p.world >= 0) return worlds[p.world].file->read_tensor(worlds[p.world].tensor, Box{{begin}, {len}}, out);
    for (size_t ip : chunks) {
      const Box& b = dcp.pieces()[ip].region.box;
      const int64_t lo = std::max(begin, b.offset[0]), hi = std::min(begin + len, b.offset[0] + b.extent[0]);
      if (hi > lo) CKPT_RETURN_IF_ERROR(dcp.read(ip, Box{{lo}, {hi - lo}}, out + (lo - begin) * esz));
    }
    return Status::Ok();
  };
  std::vector<int64_t> idx(n, 0);
  int64_t run_begin = -1, run_len = 0;
  char* out = static_cast<char*>(dst);
  char* run_out = out;
  for (int64_t done = 0; done < total; done += run) {
    int64_t flat = 0;
    for (size_t d = 0; d < n; ++d) flat = flat * p.box.extent[d] + (sub.offset[d] + idx[d] - p.box.offset[d]);
    flat += p.flat;
    if (run_begin >= 0 && run_begin + run_len == flat) {
      run_len += run;
    } else {
      if (run_begin >= 0) CKPT_RETURN_IF_ERROR(read_run(run_begin, run_len, run_out));
      run_begin = flat, run_len = run, run_out = out + done * esz;
    }
    for (size_t d = n - 1; d-- > 0;)  // next row of `sub` (the last dim is the run)
      if (++idx[d] < sub.extent[d]) break;
      else idx[d] = 0;
  }
  return read_run(run_begin, run_len, run_out);
}

}  // namespace ckpt
