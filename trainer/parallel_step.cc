#include "trainer/parallel_step.h"

#include <chrono>
#include <cmath>
#include <numeric>

#include "trainer/pipeline_schedule.h"

namespace ckpt::trainer {

namespace {

double step_clock_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct StepClock {
  double compute = 0, comm = 0, idle = 0;
};

// Adds the seconds since `t0` to `acc` and returns now.
double clock_lap(double t0, double* acc) {
  const double t = step_clock_s();
  *acc += t - t0;
  return t;
}

// This DP rank's share of the step: micro-batch size and first sample.
struct DpShare {
  int64_t mb = 1, start = 0;
};

Result<DpShare> dp_share(const Layout& layout, const TrainerState& st, int dp_rank) {
  std::vector<int64_t> mbs(static_cast<size_t>(layout.dp), 1);
  if (!layout.micro_batch.empty()) {
    if (layout.micro_batch.size() != mbs.size())
      return Status::InvalidArgument("layout has " + std::to_string(layout.micro_batch.size()) +
                                     " micro-batch sizes for dp=" + std::to_string(layout.dp));
    for (size_t d = 0; d < mbs.size(); ++d) mbs[d] = layout.micro_batch[d];
  }
  const int64_t sum = std::accumulate(mbs.begin(), mbs.end(), int64_t{0});
  if (st.grad_accum * sum != st.global_batch)
    return Status::InvalidArgument("grad-accum " + std::to_string(st.grad_accum) + " x micro-batches " +
                                   std::to_string(sum) + " (summed over DP) = " + std::to_string(st.grad_accum * sum) +
                                   " sequences, but the global batch is " + std::to_string(st.global_batch));
  DpShare s;
  s.mb = mbs[static_cast<size_t>(dp_rank)];
  s.start = st.grad_accum * std::accumulate(mbs.begin(), mbs.begin() + dp_rank, int64_t{0});
  return s;
}

// Runs this stage's 1F1B actions over the DP rank's micro-batches; gradients accumulate in the
// model. Returns the sum of the token losses (last stage; 0 elsewhere).
template <class T>
Result<double> run_pipeline(Model<T>& model, const TokenStream& data, const TrainerState& st, const DpShare& sh,
                            LayoutGroups& g, int stages, StepClock* clock) {
  const int s = g.pp_rank, m = static_cast<int>(st.grad_accum);
  const int64_t S = st.seq_len, n = sh.mb * S, D = model.config().hidden_size;
  const T scale = static_cast<T>(1.0 / static_cast<double>(st.global_batch * S));
  const std::vector<PipeAction> acts = one_f_one_b(s, stages, m);
  const std::vector<PipeExchange> ex = pipe_exchanges(acts, s, stages);
  const int slots = pipe_slots(s, stages, m);
  model.set_slots(slots);
  // x_in / dx_out are received, x_out / dx_in sent (never the same buffer in one exchange).
  std::vector<T> x_in(static_cast<size_t>(n * D)), x_out(x_in.size()), dx_out(x_in.size()), dx_in(x_in.size());
  std::vector<int32_t> tok(static_cast<size_t>(n)), tgt(tok.size());
  double loss = 0, t = step_clock_s();
  for (size_t k = 0; k <= acts.size(); ++k) {
    const PipeExchange& e = ex[k];
    if (!e.send.none() || !e.recv.none()) {
      const bool sf = e.send.kind == PipeKind::kForward, rf = e.recv.kind == PipeKind::kForward;
      const T* sb = e.send.none() ? nullptr : sf ? x_out.data() : dx_in.data();
      T* rb = e.recv.none() ? nullptr : rf ? x_in.data() : dx_out.data();
      CKPT_RETURN_IF_ERROR(g.pp.sendrecv<T>(sb, e.send.none() ? 0 : n * D, e.send.none() ? -1 : e.send.peer, rb,
                                            e.recv.none() ? 0 : n * D, e.recv.none() ? -1 : e.recv.peer, 0));
      t = clock_lap(t, &clock->idle);
    }
    if (k == acts.size()) break;
    const PipeAction& a = acts[k];
    const int slot = a.micro % slots;
    const double waited0 = Comm::seconds_waiting();  // TP all-reduces inside the stage count as comm
    if (a.kind == PipeKind::kForward) {
      CKPT_RETURN_IF_ERROR(data.batch(st.step, sh.start + a.micro * sh.mb, sh.mb, S, tok.data(), tgt.data()));
      CKPT_ASSIGN_OR_RETURN(double l, model.stage_forward(slot, tok.data(), x_in.data(), tgt.data(), sh.mb, S, scale,
                                                          x_out.data()));
      loss += l;
    } else {
      CKPT_RETURN_IF_ERROR(model.stage_backward(slot, dx_out.data(), dx_in.data()));
    }
    t = clock_lap(t, &clock->compute);
    const double tp_comm = Comm::seconds_waiting() - waited0;
    clock->compute -= tp_comm;
    clock->comm += tp_comm;
  }
  return loss;
}

// Sum over the whole world: the model group (one replica) then the DP group.
template <class V>
Status world_sum(LayoutGroups& g, V* v, int64_t n) {
  CKPT_RETURN_IF_ERROR(g.model.all_reduce_sum(v, n));
  return g.dp.all_reduce_sum(v, n);
}

template <class T>
Result<StepStats> step_body(Model<T>& model, ParallelOptimizer<T>& opt, const TokenStream& data, TrainerState* state,
                            const Layout& layout, LayoutGroups& g, const GradDump<T>& dump) {
  const double t0 = step_clock_s();
  CKPT_ASSIGN_OR_RETURN(DpShare sh, dp_share(layout, *state, g.dp_rank));
  StepClock clock;
  model.zero_grad();
  CKPT_ASSIGN_OR_RETURN(double loss_sum, run_pipeline(model, data, *state, sh, g, layout.pp, &clock));
  double t = step_clock_s();
  // Tied embeddings: the first and the last stage each hold the tensor; its gradient is the sum.
  Param<T>* emb = model.config().tie_word_embeddings && layout.pp > 1 ? model.find("model.embed_tokens.weight") : nullptr;
  if (emb && emb->numel() > 0) CKPT_RETURN_IF_ERROR(g.embedding.all_reduce_sum<T>(emb->g.data(), emb->numel()));
  CKPT_RETURN_IF_ERROR(opt.reduce_gradients(g.dp));
  t = clock_lap(t, &clock.comm);
  if (dump) CKPT_RETURN_IF_ERROR(dump(opt.grad_regions()));
  t = step_clock_s();
  const bool head0 = model.has_head() && g.tp_rank == 0;
  const bool count_flops = g.tp_rank == 0 && g.dp_rank == 0;
  double sums[3] = {opt.grad_sq_share(), head0 ? loss_sum : 0.0,
                    count_flops ? model.train_flops_per_token(state->seq_len) : 0.0};
  CKPT_RETURN_IF_ERROR(world_sum(g, sums, 3));
  t = clock_lap(t, &clock.comm);
  StepStats st;
  const int64_t ntok = state->global_batch * state->seq_len;
  st.loss = sums[1] / static_cast<double>(ntok);
  st.grad_norm = std::sqrt(sums[0]);
  if (state->max_grad_norm > 0) opt.scale_grads(BasicAdamW<T>::clip_coef(st.grad_norm, state->max_grad_norm));
  st.lr = state->schedule.at(state->step);
  opt.update(st.lr, state->step + 1);
  t = clock_lap(t, &clock.compute);
  CKPT_RETURN_IF_ERROR(opt.gather_params(g.dp));
  clock_lap(t, &clock.comm);
  double times[3] = {clock.compute, clock.comm, clock.idle};
  CKPT_RETURN_IF_ERROR(g.model.all_reduce_max(times, 3));
  CKPT_RETURN_IF_ERROR(g.dp.all_reduce_max(times, 3));
  state->step += 1;
  st.step = state->step;
  st.compute_s = times[0];
  st.comm_s = times[1];
  st.idle_s = times[2];
  st.seconds = step_clock_s() - t0;
  st.tokens_per_s = static_cast<double>(ntok) / st.seconds;
  st.flops_per_s = st.tokens_per_s * sums[2];
  return st;
}

}  // namespace

template <class T>
Result<StepStats> parallel_step(Model<T>& model, ParallelOptimizer<T>& opt, const TokenStream& data,
                                TrainerState* state, const Layout& layout, LayoutGroups& groups,
                                const GradDump<T>& dump) {
  auto r = step_body(model, opt, data, state, layout, groups, dump);
  if (!r.ok() && Comm::launched_under_mpi()) Comm::world().fail_all(r.status());
  return r;
}

template Result<StepStats> parallel_step<float>(Model<float>&, ParallelOptimizer<float>&, const TokenStream&,
                                                TrainerState*, const Layout&, LayoutGroups&, const GradDump<float>&);
template Result<StepStats> parallel_step<double>(Model<double>&, ParallelOptimizer<double>&, const TokenStream&,
                                                 TrainerState*, const Layout&, LayoutGroups&,
                                                 const GradDump<double>&);

}  // namespace ckpt::trainer
