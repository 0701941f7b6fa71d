// parallel_check: `--steps` optimizer steps of parallel_step on a layout under mpirun, against the
// one-process trainer (optimizer_step's computation on Model::create(cfg), the independent oracle)
// that every rank also runs (the config is tiny): the global batch as one micro-batch, or for an
// MoE model (one load-balancing loss per micro-batch) the parallel step's micro-batches in turn. Every rank also checks that its held regions
// (ParallelOptimizer::held_regions) are exactly the planner's rank_view() of its rank under the
// stage view of its (pipeline, stage) (the layout itself when symmetric).
// Prints on rank 0 one JSON line:
//   {"ok": true, "losses": [...], "ref_losses": [...], "ranks": [{"rank", "loss_rel" (worst over
//    steps), "grad_rel" (step-0 gradients: worst |g - g_ref| / max|g_ref| of the tensor over the
//    rank's dumped regions), "grad_tensor", "grad_numel", "weights_rel" (after the last step),
//    "held_ok", "norm_rel"}, ...]}
//   mpirun -np T*P*D parallel_check CONFIG --tp T --pp P [--pp-layers a,b,..] --dp D
//       [--micro-batches a,b,..] [--zero Z] [--grad-accum A] [--seq S] [--steps K] [--f64 1]
//   mpirun -np N parallel_check CONFIG --layout LAYOUT.json [--micro-batches a,b,..] ...
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_sharding.h"
#include "reshard/planner.h"
#include "trainer/parallel_step.h"

using namespace ckpt;
using namespace ckpt::trainer;

namespace {

struct Options {
  std::string config, layout_file;
  int tp = 1, pp = 1, dp = 1, zero = 0;
  std::vector<int> pp_layers, micro_batches;
  int64_t grad_accum = 2, seq = 8, steps = 10;
  bool f64 = false;
};

std::vector<int> int_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::atoi(item.c_str()));
  return out;
}

TrainerState make_state(const Options& o, int64_t global_batch) {
  TrainerState s;
  s.schedule = LrSchedule{1e-2, 2, o.steps, 0.1};
  s.seed = 42;
  s.seq_len = o.seq;
  s.grad_accum = o.grad_accum;
  s.global_batch = global_batch;
  s.micro_batch = global_batch / o.grad_accum;
  s.max_grad_norm = 0.5;  // below the tiny model's norms: clipping is exercised
  return s;
}

// Worst |a - ref| over `region` of the full tensor `full` (dense, shape), relative to max|full|.
template <class T>
double region_error(const GradRegion<T>& r, const std::vector<T>& data, const Param<T>& full) {
  double mx = 0;
  for (T v : full.g) mx = std::max(mx, std::abs(static_cast<double>(v)));
  const Box whole = Box::whole(full.shape);
  std::vector<T> want(static_cast<size_t>(r.region.numel()));
  size_t at = 0;
  for (const Box& b : r.region.boxes()) {
    copy_box(full.g.data(), whole, want.data() + at, b, b, sizeof(T));
    at += static_cast<size_t>(b.numel());
  }
  double err = 0;
  for (size_t i = 0; i < want.size(); ++i)
    err = std::max(err, std::abs(static_cast<double>(data[i]) - static_cast<double>(want[i])));
  return mx > 0 ? err / mx : err;
}

// Worst |w - w_ref| over the rank's Param boxes, relative to max|w_ref| of the tensor.
template <class T>
double weights_error(Model<T>& m, Model<T>& ref) {
  double worst = 0;
  for (Param<T>* p : m.params()) {
    Param<T>* f = ref.find(p->name);
    if (!f || p->numel() == 0) continue;
    double mx = 0, err = 0;
    for (T v : f->w) mx = std::max(mx, std::abs(static_cast<double>(v)));
    std::vector<T> want(p->w.size());
    copy_box(f->w.data(), Box::whole(f->shape), want.data(), p->box, p->box, sizeof(T));
    for (size_t i = 0; i < want.size(); ++i)
      err = std::max(err, std::abs(static_cast<double>(p->w[i]) - static_cast<double>(want[i])));
    worst = std::max(worst, mx > 0 ? err / mx : err);
  }
  return worst;
}

// The oracle's micro-batches (first sample, size): a dense model's step is one micro-batch of the
// whole global batch; an MoE model's load-balancing loss is one per micro-batch, so the oracle
// runs the parallel step's micro-batches, pipeline after pipeline (trainer/parallel_step.h).
struct OracleMicro {
  int64_t start = 0, size = 0;
};

std::vector<OracleMicro> oracle_micros(const Layout& l, int64_t grad_accum, bool moe) {
  std::vector<OracleMicro> out;
  int64_t at = 0;
  for (int p = 0; p < l.num_pipelines(); ++p)
    for (int64_t j = 0; j < grad_accum; ++j, at += l.pipeline_micro_batch(p))
      out.push_back({at, l.pipeline_micro_batch(p)});
  if (!moe) out = {{0, at}};
  return out;
}

// Zeroed gradients, then those of step `step`'s micro-batches (mean over the global batch's
// tokens, as optimizer_step scales it). Returns the sum of the token losses.
template <class T>
Result<double> oracle_grads(Model<T>& ref, const TokenStream& data, int64_t step, const std::vector<OracleMicro>& micros,
                            int64_t seq) {
  int64_t ntok = 0;
  for (const auto& m : micros) ntok += m.size * seq;
  const T scale = T(1) / static_cast<T>(ntok);
  ref.zero_grad();
  double loss = 0;
  for (const auto& m : micros) {
    std::vector<int32_t> tok(static_cast<size_t>(m.size * seq)), tgt(tok.size());
    CKPT_RETURN_IF_ERROR(data.batch(step, m.start, m.size, seq, tok.data(), tgt.data()));
    CKPT_ASSIGN_OR_RETURN(double l, ref.forward_backward(tok.data(), tgt.data(), m.size, seq, scale));
    loss += l;
  }
  return loss;
}

// optimizer_step of trainer/reference_step.cc over the micro-batches `micros`.
template <class T>
Result<StepStats> oracle_step(Model<T>& ref, BasicAdamW<T>& opt, const TokenStream& data, TrainerState* st,
                              const std::vector<OracleMicro>& micros) {
  CKPT_ASSIGN_OR_RETURN(double loss, oracle_grads(ref, data, st->step, micros, st->seq_len));
  StepStats s;
  s.loss = loss / static_cast<double>(st->global_batch * st->seq_len);
  s.grad_norm = std::sqrt(opt.grad_sq_sum());
  if (st->max_grad_norm > 0) opt.scale_grads(BasicAdamW<T>::clip_coef(s.grad_norm, st->max_grad_norm));
  opt.step(st->schedule.at(st->step), st->step + 1);
  st->step += 1;
  return s;
}

template <class T>
Result<bool> held_equals_rank_view(ParallelOptimizer<T>& opt, const LlamaConfig& c, const Layout& l, int rank) {
  if constexpr (std::is_same_v<T, float>) {
    std::set<std::pair<std::string, std::string>> got, want;
    for (const HeldRegion& h : opt.held_regions()) got.insert({h.tensor, h.region.to_string()});
    CKPT_ASSIGN_OR_RETURN(auto view, rank_view(trainer_tensors(c), l, LlamaShardingRules(c), rank));
    for (const Piece& p : view) want.insert({p.tensor, p.region.to_string()});
    return got == want;
  }
  return true;
}

Result<Layout> make_layout(const Options& o, const LlamaConfig& c) {
  if (!o.layout_file.empty()) {
    CKPT_ASSIGN_OR_RETURN(Layout l, Layout::from_file(o.layout_file));
    if (!o.micro_batches.empty()) l.set_micro_batches(o.micro_batches);
    CKPT_RETURN_IF_ERROR(l.validate());
    return l;
  }
  CKPT_ASSIGN_OR_RETURN(Layout l, Layout::make(o.tp, o.pp, o.dp, o.zero, static_cast<int>(c.num_hidden_layers),
                                               o.pp_layers));
  l.micro_batch = o.micro_batches.empty() ? std::vector<int>(static_cast<size_t>(o.dp), 1) : o.micro_batches;
  return l;
}

template <class T>
Result<nlohmann::json> run(const Options& o, const LlamaConfig& c, Comm& world) {
  CKPT_ASSIGN_OR_RETURN(Layout layout, make_layout(o, c));
  CKPT_ASSIGN_OR_RETURN(LayoutGroups g, LayoutGroups::make(world, layout));
  const Layout view = layout.stage_view(g.dp_rank, g.pp_rank);
  auto made = Model<T>::create(c, ModelShard{view, g.pp_rank, g.tp_rank, &g.tp});
  CKPT_RETURN_IF_ERROR(world.agree(made.status()));
  Model<T> model = std::move(made).value();
  CKPT_RETURN_IF_ERROR(model.init(42));
  CKPT_ASSIGN_OR_RETURN(auto opt, ParallelOptimizer<T>::create(model, layout, g.pp_rank, g.dp_rank, g.tp_rank, &world));
  int64_t gb = 0;
  for (int p = 0; p < layout.num_pipelines(); ++p) gb += layout.pipeline_micro_batch(p) * o.grad_accum;
  TrainerState st = make_state(o, gb);
  const TokenStream data = TokenStream::procedural(st.seed);
  // The oracle: one process, the global batch as one micro-batch (MoE: the parallel step's micro-batches).
  CKPT_ASSIGN_OR_RETURN(Model<T> ref, Model<T>::create(c));
  CKPT_RETURN_IF_ERROR(ref.init(42));
  BasicAdamW<T> ref_opt;
  add_param_slots(ref, ref_opt);
  TrainerState ref_st = make_state(o, gb);
  const std::vector<OracleMicro> micros = oracle_micros(layout, o.grad_accum, c.moe.has_value());
  CKPT_RETURN_IF_ERROR(oracle_grads(ref, data, 0, micros, o.seq).status());  // step-0 gradients before clipping
  std::vector<GradRegion<T>> dumped;
  std::vector<std::vector<T>> dumped_data;
  GradDump<T> dump = [&](const std::vector<GradRegion<T>>& rs) {
    for (const auto& r : rs) {
      dumped.push_back(r);
      dumped_data.emplace_back(r.data, r.data + r.region.numel());
    }
    return Status::Ok();
  };
  nlohmann::json out{{"rank", world.rank()}, {"loss_rel", 0.0}, {"norm_rel", 0.0}, {"grad_rel", 0.0}, {"grad_tensor", ""}};
  int64_t numel = 0;
  // This rank under the stage view: the same (stage, TP rank), pipeline p (the view has every
  // pipeline when they are uniform, else only this one).
  const int view_rank = view.rank_of(g.pp_rank, view.dp == layout.num_pipelines() ? g.dp_rank : 0, g.tp_rank);
  CKPT_ASSIGN_OR_RETURN(bool held_ok, held_equals_rank_view(opt, c, view, view_rank));
  out["held_ok"] = held_ok;
  std::vector<double> losses, ref_losses;
  for (int64_t k = 0; k < o.steps; ++k) {
    CKPT_ASSIGN_OR_RETURN(StepStats s, parallel_step(model, opt, data, &st, layout, g, k == 0 ? dump : nullptr));
    if (k == 0) {
      for (size_t i = 0; i < dumped.size(); ++i) {
        Param<T>* f = ref.find(dumped[i].tensor);
        if (!f) return Status::Internal("the one-process model has no " + dumped[i].tensor);
        const double e = region_error(dumped[i], dumped_data[i], *f);
        numel += dumped[i].region.numel();
        if (e >= out["grad_rel"].get<double>()) out["grad_rel"] = e, out["grad_tensor"] = dumped[i].tensor;
      }
    }
    CKPT_ASSIGN_OR_RETURN(StepStats rs, oracle_step(ref, ref_opt, data, &ref_st, micros));
    losses.push_back(s.loss);
    ref_losses.push_back(rs.loss);
    out["loss_rel"] = std::max(out["loss_rel"].get<double>(), std::abs(s.loss - rs.loss) / std::abs(rs.loss));
    out["norm_rel"] = std::max(out["norm_rel"].get<double>(), std::abs(s.grad_norm - rs.grad_norm) / rs.grad_norm);
  }
  out["grad_numel"] = numel;
  out["weights_rel"] = weights_error(model, ref);
  out["losses"] = losses;
  out["ref_losses"] = ref_losses;
  return out;
}

Result<Options> parse(int argc, char** argv) {
  if (argc < 2) return Status::InvalidArgument("usage: parallel_check CONFIG --tp T --pp P --dp D ...");
  Options o;
  o.config = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    const long long x = std::atoll(v.c_str());
    if (k == "--tp") o.tp = static_cast<int>(x);
    else if (k == "--pp") o.pp = static_cast<int>(x);
    else if (k == "--dp") o.dp = static_cast<int>(x);
    else if (k == "--zero") o.zero = static_cast<int>(x);
    else if (k == "--layout") o.layout_file = v;
    else if (k == "--pp-layers") o.pp_layers = int_list(v);
    else if (k == "--micro-batches") o.micro_batches = int_list(v);
    else if (k == "--grad-accum") o.grad_accum = x;
    else if (k == "--seq") o.seq = x;
    else if (k == "--steps") o.steps = x;
    else if (k == "--f64") o.f64 = x != 0;
    else return Status::InvalidArgument("unknown option " + k);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  auto opts = parse(argc, argv);
  auto cfg = opts.ok() ? LlamaConfig::from_file(opts->config) : Result<LlamaConfig>(opts.status());
  if (!cfg.ok()) {
    std::fprintf(stderr, "parallel_check: %s\n", cfg.status().to_string().c_str());
    return 2;
  }
  Comm& world = Comm::world();
  auto r = opts->f64 ? run<double>(*opts, *cfg, world) : run<float>(*opts, *cfg, world);
  if (!r.ok()) {
    std::fprintf(stderr, "parallel_check rank %d: %s\n", world.rank(), r.status().to_string().c_str());
    world.fail_all(r.status());
    return 3;
  }
  auto all = world.gather(r->dump());
  if (!all.ok()) {
    std::fprintf(stderr, "parallel_check: %s\n", all.status().to_string().c_str());
    return 1;
  }
  if (world.rank() == 0) {
    nlohmann::json out{{"ok", true}, {"ranks", nlohmann::json::array()}};
    for (const auto& s : *all) out["ranks"].push_back(nlohmann::json::parse(s));
    out["losses"] = out["ranks"][0]["losses"];
    out["ref_losses"] = out["ranks"][0]["ref_losses"];
    for (auto& x : out["ranks"]) x.erase("losses"), x.erase("ref_losses");
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}
