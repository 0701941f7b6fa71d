#include "trainer/parallel_step.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "trainer/emulate.h"
#include "trainer/pipeline_schedule.h"

namespace ckpt::trainer {

namespace {

double step_clock_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct StepClock {
  double compute = 0, comm = 0, idle = 0;
  double stretch = 1;  // --emulate: compute sections are followed by a sleep of t x (stretch - 1)
};

// Adds the seconds since `t0` to `acc` and returns now.
double clock_lap(double t0, double* acc) {
  const double t = step_clock_s();
  *acc += t - t0;
  return t;
}

// This pipeline's share of the step: micro-batch size and first sample.
struct DpShare {
  int64_t mb = 1, start = 0;
};

Result<DpShare> dp_share(const Layout& layout, const TrainerState& st, int pipeline) {
  int64_t sum = 0, before = 0;
  for (int q = 0; q < layout.num_pipelines(); ++q) {
    if (q == pipeline) before = sum;
    sum += layout.pipeline_micro_batch(q);
  }
  if (st.grad_accum * sum != st.global_batch)
    return Status::InvalidArgument("grad-accum " + std::to_string(st.grad_accum) + " x micro-batches " +
                                   std::to_string(sum) + " (summed over the pipelines) = " +
                                   std::to_string(st.grad_accum * sum) + " sequences, but the global batch is " +
                                   std::to_string(st.global_batch));
  DpShare s;
  s.mb = layout.pipeline_micro_batch(pipeline);
  s.start = st.grad_accum * before;
  return s;
}

// The sends and the receive of one pipeline exchange of rank (p, s, t): forward messages of nf
// elements, backward ones of nb (the activations or their gradient, then the MoE tail, Model::forward_tail).
template <class T>
void exchange_lists(const Layout& l, const LayoutGroups& g, const PipeExchange& e, int64_t nf, int64_t nb,
                    const T* x_out, const T* dx_in, T* x_in, T* dx_out, std::vector<Comm::Send<T>>* sends,
                    std::vector<Comm::Recv<T>>* recvs) {
  const int p = g.dp_rank, s = g.pp_rank, t = g.tp_rank;
  sends->clear();
  recvs->clear();
  if (!e.send.none()) {
    const bool fwd = e.send.kind == PipeKind::kForward;
    const int q = e.send.peer;
    for (int j : pipe_receivers(t, l.stage_tp(p, s), l.stage_tp(p, q)))
      sends->push_back({fwd ? x_out : dx_in, fwd ? nf : nb, l.rank_of(q, p, j)});
  }
  if (!e.recv.none()) {
    const int q = e.recv.peer;
    const int from = l.rank_of(q, p, pipe_sender(t, l.stage_tp(p, q)));
    const bool fwd = e.recv.kind == PipeKind::kForward;
    recvs->push_back({fwd ? x_in : dx_out, fwd ? nf : nb, from});
  }
}

// Runs this stage's 1F1B actions over the pipeline's micro-batches; gradients accumulate in the
// model. Returns the sum of the token losses (last stage; 0 elsewhere).
template <class T>
Result<double> run_pipeline(Model<T>& model, const TokenStream& data, const TrainerState& st, const DpShare& sh,
                            const Layout& layout, LayoutGroups& g, StepClock* clock) {
  const int s = g.pp_rank, m = static_cast<int>(st.grad_accum), stages = layout.num_stages(g.dp_rank);
  const int64_t S = st.seq_len, n = sh.mb * S, D = model.config().hidden_size;
  const T scale = static_cast<T>(1.0 / static_cast<double>(st.global_batch * S));
  const std::vector<PipeAction> acts = one_f_one_b(s, stages, m);
  const std::vector<PipeExchange> ex = pipe_exchanges(acts, s, stages);
  const int slots = pipe_slots(s, stages, m);
  model.set_slots(slots);
  // x_in / dx_out are received, x_out / dx_in sent (never the same buffer in one exchange); with an
  // MoE model the router totals travel after the activations and aux_dp after their gradient.
  const int64_t nf = n * D + model.forward_tail(), nb = n * D + model.backward_tail();
  std::vector<T> x_in(static_cast<size_t>(nf)), x_out(x_in.size()), dx_out(static_cast<size_t>(nb)), dx_in(dx_out.size());
  std::vector<int32_t> tok(static_cast<size_t>(n)), tgt(tok.size());
  std::vector<Comm::Send<T>> sends;
  std::vector<Comm::Recv<T>> recvs;
  double loss = 0, t = step_clock_s();
  for (size_t k = 0; k <= acts.size(); ++k) {
    exchange_lists<T>(layout, g, ex[k], nf, nb, x_out.data(), dx_in.data(), x_in.data(), dx_out.data(), &sends, &recvs);
    if (!sends.empty() || !recvs.empty()) {
      CKPT_RETURN_IF_ERROR(g.world.exchange<T>(sends, recvs, 0));
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
    const double t_end = step_clock_s();
    const double tp_comm = Comm::seconds_waiting() - waited0;
    const double own = t_end - t - tp_comm;
    clock->compute += own + emulate_sleep(own, clock->stretch);
    clock->comm += tp_comm;
    t = step_clock_s();
  }
  return loss;
}

// Expert parallel: every rank routed its own tokens; the load of the step's tokens is the sum
// over the world: max / mean tokens per expert of the most unbalanced MoE layer.
template <class T>
Result<double> expert_router_load(Model<T>& model, Comm& world) {
  std::vector<double> c = model.take_router_counts();
  CKPT_RETURN_IF_ERROR(world.all_reduce_sum(c.data(), static_cast<int64_t>(c.size())));
  const size_t E = static_cast<size_t>(model.config().moe->num_experts);
  double worst = 0;
  for (size_t l = 0; l + E <= c.size(); l += E) {
    double mx = 0, sum = 0;
    for (size_t e = 0; e < E; ++e) {
      mx = std::max(mx, c[l + e]);
      sum += c[l + e];
    }
    if (sum > 0) worst = std::max(worst, mx * static_cast<double>(E) / sum);
  }
  return worst;
}

template <class T>
Result<StepStats> step_body(Model<T>& model, ParallelOptimizer<T>& opt, const TokenStream& data, TrainerState* state,
                            const Layout& layout, LayoutGroups& g, const GradDump<T>& dump, double stretch) {
  const double t0 = step_clock_s();
  CKPT_ASSIGN_OR_RETURN(DpShare sh, dp_share(layout, *state, g.dp_rank));
  StepClock clock;
  clock.stretch = stretch;
  model.zero_grad();
  CKPT_ASSIGN_OR_RETURN(double loss_sum, run_pipeline(model, data, *state, sh, layout, g, &clock));
  double t = step_clock_s();
  CKPT_RETURN_IF_ERROR(opt.reduce_gradients(g.dp));  // replica sums (tied embedding included)
  t = clock_lap(t, &clock.comm);
  if (dump) CKPT_RETURN_IF_ERROR(dump(opt.grad_regions()));
  t = step_clock_s();
  const bool head0 = model.has_head() && g.tp_rank == 0;
  const bool count_flops = g.tp_rank == 0 && g.dp_rank == 0;
  CKPT_ASSIGN_OR_RETURN(double sq, opt.grad_sq_share());
  double sums[3] = {sq, head0 ? loss_sum : 0.0, count_flops ? model.train_flops_per_token(state->seq_len) : 0.0};
  CKPT_RETURN_IF_ERROR(g.world.all_reduce_sum(sums, 3));
  t = clock_lap(t, &clock.comm);
  StepStats st;
  const int64_t ntok = state->global_batch * state->seq_len;
  st.loss = sums[1] / static_cast<double>(ntok);
  st.grad_norm = std::sqrt(sums[0]);
  if (state->max_grad_norm > 0) opt.scale_grads(BasicAdamW<T>::clip_coef(st.grad_norm, state->max_grad_norm));
  st.lr = state->schedule.at(state->step);
  opt.update(st.lr, state->step + 1);
  const double update_s = step_clock_s() - t;
  clock.compute += update_s + emulate_sleep(update_s, clock.stretch);
  t = step_clock_s();
  CKPT_RETURN_IF_ERROR(opt.gather_params(g.dp));
  clock_lap(t, &clock.comm);
  // The router load (the most unbalanced MoE layer of any stage; expert parallel: of the step's
  // tokens on all ranks), the maxima over ranks, then every rank's compute seconds (its own slot,
  // zero elsewhere).
  double load = 0;
  if (model.config().moe && layout_uses_expert_groups(layout)) {  // every rank: the stages without groups too
    CKPT_ASSIGN_OR_RETURN(load, expert_router_load(model, g.world));
  } else {
    load = model.take_router_load();
  }
  // Slot 5: the step's seconds so far, so that the step's seconds are the slowest rank's (a rank's
  // all-to-all share, a maximum over ranks, then stays within them).
  std::vector<double> times(static_cast<size_t>(6 + g.world.size()), 0.0);
  times[0] = clock.compute;
  times[1] = clock.comm;
  times[2] = clock.idle;
  times[3] = load;
  times[4] = model.take_a2a_s();
  times[5] = step_clock_s() - t0;
  times[static_cast<size_t>(6 + g.world.rank())] = clock.compute;
  CKPT_RETURN_IF_ERROR(g.world.all_reduce_max(times.data(), static_cast<int64_t>(times.size())));
  state->step += 1;
  st.step = state->step;
  st.compute_s = times[0];
  st.comm_s = times[1];
  st.idle_s = times[2];
  st.router_load = times[3];
  st.a2a_s = times[4];
  st.rank_compute_s.assign(times.begin() + 6, times.end());
  st.seconds = std::max(step_clock_s() - t0, times[5]);
  st.tokens_per_s = static_cast<double>(ntok) / st.seconds;
  st.flops_per_s = st.tokens_per_s * sums[2];
  return st;
}

}  // namespace

template <class T>
Result<StepStats> parallel_step(Model<T>& model, ParallelOptimizer<T>& opt, const TokenStream& data,
                                TrainerState* state, const Layout& layout, LayoutGroups& groups,
                                const GradDump<T>& dump, double stretch) {
  auto r = step_body(model, opt, data, state, layout, groups, dump, stretch);
  if (!r.ok() && Comm::launched_under_mpi()) Comm::world().fail_all(r.status());
  return r;
}

template Result<StepStats> parallel_step<float>(Model<float>&, ParallelOptimizer<float>&, const TokenStream&,
                                                TrainerState*, const Layout&, LayoutGroups&, const GradDump<float>&, double);
template Result<StepStats> parallel_step<double>(Model<double>&, ParallelOptimizer<double>&, const TokenStream&,
                                                 TrainerState*, const Layout&, LayoutGroups&,
                                                 const GradDump<double>&, double);

}  // namespace ckpt::trainer
