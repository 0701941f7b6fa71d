#include "trainer/train_loop.h"  // initial_state, add_param_slots, optimizer_step

#include <chrono>
#include <cmath>
#include <sys/stat.h>

#include "formats/base/checked.h"
#include "formats/store/run_dir.h"
#include "trainer/model/ops.h"
#include "trainer/state/trainer_state.h"

namespace ckpt::trainer {

namespace {
double ref_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

TrainerState initial_state(const TrainOptions& o) {
  TrainerState s;
  s.step = 0;
  s.schedule = LrSchedule{o.lr, o.warmup, o.total_steps < 0 ? o.steps : o.total_steps, 0.1};
  s.seed = o.seed;
  s.data_source = o.data_path.empty() ? "procedural" : o.data_path;
  s.micro_batch = o.micro_batch;
  s.seq_len = o.seq_len;
  s.grad_accum = o.grad_accum;
  s.global_batch = o.micro_batch * o.grad_accum;
  s.adam = o.adam;
  s.max_grad_norm = o.max_grad_norm;
  return s;
}

template <class T>
void add_param_slots(Model<T>& model, BasicAdamW<T>& opt) {
  for (auto* p : model.params())
    opt.add(p->name, p->shape, Region{p->box}, p->w.data(), p->g.data(), p->numel(), p->decay);
}

template <class T>
Result<StepStats> optimizer_step(Model<T>& model, BasicAdamW<T>& opt, const TokenStream& data,
                                 TrainerState* state, std::vector<int32_t>* tokens,
                                 std::vector<int32_t>* targets) {
  const double t0 = ref_now_s();
  const int64_t B = state->micro_batch, S = state->seq_len, A = state->grad_accum;
  const int64_t ntok = B * S * A;  // bounded by Trainer::create / TrainerState::from_json
  const T scale = T(1) / static_cast<T>(ntok);
  tokens->resize(static_cast<size_t>(B * S));
  targets->resize(static_cast<size_t>(B * S));
  model.zero_grad();
  double loss_sum = 0;
  for (int64_t a = 0; a < A; ++a) {
    CKPT_RETURN_IF_ERROR(data.batch(state->step, a * B, B, S, tokens->data(), targets->data()));
    CKPT_ASSIGN_OR_RETURN(double l, model.forward_backward(tokens->data(), targets->data(), B, S, scale));
    loss_sum += l;
  }
  StepStats st;
  st.loss = loss_sum / static_cast<double>(ntok);
  st.grad_norm = std::sqrt(opt.grad_sq_sum());
  if (state->max_grad_norm > 0)
    opt.scale_grads(BasicAdamW<T>::clip_coef(st.grad_norm, state->max_grad_norm));
  st.lr = state->schedule.at(state->step);
  opt.step(st.lr, state->step + 1);
  state->step += 1;
  st.step = state->step;
  st.seconds = ref_now_s() - t0;
  st.tokens_per_s = static_cast<double>(ntok) / st.seconds;
  st.flops_per_s = st.tokens_per_s * model.train_flops_per_token(S);
  st.router_load = model.take_router_load();
  return st;
}

template void add_param_slots<float>(Model<float>&, BasicAdamW<float>&);
template void add_param_slots<double>(Model<double>&, BasicAdamW<double>&);
template Result<StepStats> optimizer_step<float>(Model<float>&, BasicAdamW<float>&, const TokenStream&,
                                                 TrainerState*, std::vector<int32_t>*, std::vector<int32_t>*);
template Result<StepStats> optimizer_step<double>(Model<double>&, BasicAdamW<double>&, const TokenStream&,
                                                  TrainerState*, std::vector<int32_t>*, std::vector<int32_t>*);

}  // namespace ckpt::trainer
