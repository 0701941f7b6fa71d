#include "trainer/train_loop.h"

#include <chrono>
#include <cmath>
#include <sys/stat.h>

#include "formats/checked.h"
#include "formats/store/run_dir.h"
#include "trainer/checkpoint_io.h"
#include "trainer/ops.h"

namespace ckpt::trainer {

namespace {
double now_s() {
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
  const double t0 = now_s();
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
  st.seconds = now_s() - t0;
  st.tokens_per_s = static_cast<double>(ntok) / st.seconds;
  st.flops_per_s = st.tokens_per_s * model.train_flops_per_token(S);
  return st;
}

template void add_param_slots<float>(Model<float>&, BasicAdamW<float>&);
template void add_param_slots<double>(Model<double>&, BasicAdamW<double>&);
template Result<StepStats> optimizer_step<float>(Model<float>&, BasicAdamW<float>&, const TokenStream&,
                                                 TrainerState*, std::vector<int32_t>*, std::vector<int32_t>*);
template Result<StepStats> optimizer_step<double>(Model<double>&, BasicAdamW<double>&, const TokenStream&,
                                                  TrainerState*, std::vector<int32_t>*, std::vector<int32_t>*);

Trainer::~Trainer() {
  if (saver_) (void)saver_->wait();
  saver_.reset();
  if (log_) std::fclose(log_);
}

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainOptions& o) {
  if (o.steps < 0) return Status::InvalidArgument("--steps must be >= 0");
  if (o.micro_batch < 1 || o.seq_len < 1 || o.grad_accum < 1)
    return Status::InvalidArgument("--micro-batch, --seq-len and --grad-accum must be >= 1");
  if (o.micro_batch > (1 << 20) || o.grad_accum > (1 << 20))
    return Status::InvalidArgument("--micro-batch / --grad-accum too large");
  if (o.seq_len > o.config.max_position_embeddings)
    return Status::InvalidArgument("--seq-len " + std::to_string(o.seq_len) + " exceeds the config's max_position_embeddings " +
                                   std::to_string(o.config.max_position_embeddings));
  {
    auto bs = checked_mul(o.micro_batch, o.seq_len);
    auto all = bs ? checked_mul(*bs, o.grad_accum) : std::nullopt;
    if (!all || *all > (int64_t{1} << 31))
      return Status::InvalidArgument("--micro-batch x --seq-len x --grad-accum is too many tokens per step");
  }
  if (o.save_every < 0) return Status::InvalidArgument("--save-every must be >= 0");
  if (!(o.lr >= 0) || !std::isfinite(o.lr)) return Status::InvalidArgument("--lr must be a finite value >= 0");
  if (o.warmup < 0) return Status::InvalidArgument("--warmup must be >= 0");
  if (o.threads < 1 || o.threads > 1024) return Status::InvalidArgument("--threads must be in [1, 1024]");
  if (o.config.vocab_size < kMinVocab)
    return Status::InvalidArgument("vocab_size " + std::to_string(o.config.vocab_size) +
                                   " is smaller than the byte tokenizer's " + std::to_string(kMinVocab));
  if ((o.save_every > 0 || !o.resume.empty()) && o.out_dir.empty() && o.resume == "latest")
    return Status::InvalidArgument("--resume latest needs --out RUN_DIR");
  std::unique_ptr<Trainer> t(new Trainer());
  t->opt_s_ = o;
  set_blas_threads(o.threads);
  CKPT_ASSIGN_OR_RETURN(auto m, Model<float>::create(o.config));
  t->model_ = std::make_unique<Model<float>>(std::move(m));
  CKPT_RETURN_IF_ERROR(t->model_->init(o.seed));
  t->opt_ = AdamW(o.adam);
  add_param_slots(*t->model_, t->opt_);
  TrainerState& s = t->state_;
  s = initial_state(o);
  if (!o.resume.empty()) {
    const std::string path = o.resume == "latest" ? o.out_dir : o.resume;
    CKPT_ASSIGN_OR_RETURN(auto rs, load_checkpoint(path, *t->model_, t->opt_, o.resume_progress));
    if (rs.seed != o.seed || rs.micro_batch != o.micro_batch || rs.seq_len != o.seq_len ||
        rs.grad_accum != o.grad_accum || rs.data_source != s.data_source)
      return Status::InvalidArgument(
          "resume: the checkpoint was trained with seed " + std::to_string(rs.seed) + ", micro-batch " +
          std::to_string(rs.micro_batch) + ", seq-len " + std::to_string(rs.seq_len) + ", grad-accum " +
          std::to_string(rs.grad_accum) + ", data '" + rs.data_source +
          "'; pass the same values to continue the same run");
    s = rs;  // step, schedule, optimizer hyper-parameters come from the checkpoint
    t->opt_.set_options(s.adam);
  }
  if (o.data_path.empty()) {
    t->data_ = TokenStream::procedural(s.seed);
  } else {
    CKPT_ASSIGN_OR_RETURN(t->data_, TokenStream::from_file(s.seed, o.data_path));
  }
  if (!o.out_dir.empty()) {
    if (::mkdir(o.out_dir.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::FromErrno("cannot create run dir", o.out_dir, errno);
    const std::string lp = o.out_dir + "/train_log.jsonl";
    t->log_ = std::fopen(lp.c_str(), "a");
    if (!t->log_) return Status::FromErrno("cannot open", lp, errno);
    if (o.async_save) t->saver_ = std::make_unique<AsyncSaver>(o.out_dir);
  }
  t->tokens_.resize(static_cast<size_t>(o.micro_batch * o.seq_len));
  t->targets_.resize(static_cast<size_t>(o.micro_batch * o.seq_len));
  return t;
}

Result<StepStats> Trainer::train_step() {
  return optimizer_step(*model_, opt_, data_, &state_, &tokens_, &targets_);
}

Result<double> Trainer::save(bool async) {
  if (opt_s_.out_dir.empty()) return Status::InvalidArgument("saving needs --out RUN_DIR");
  const double t0 = now_s();
  if (async && saver_) {
    CKPT_RETURN_IF_ERROR(saver_->save(*model_, opt_, state_));
  } else {
    if (saver_) CKPT_RETURN_IF_ERROR(saver_->wait());
    Snapshot snap;
    take_snapshot(*model_, opt_, state_, &snap);
    CKPT_RETURN_IF_ERROR(write_snapshot(snap, opt_s_.out_dir));
  }
  return now_s() - t0;
}

Status Trainer::wait_saves() { return saver_ ? saver_->wait() : Status::Ok(); }

std::string Trainer::format_line(const StepStats& s) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %6lld | loss %.6f | lr %.4e | grad_norm %.4f | %.0f tok/s | %.3f GFLOP/s",
                static_cast<long long>(s.step), s.loss, s.lr, s.grad_norm, s.tokens_per_s,
                s.flops_per_s / 1e9);
  std::string line = buf;
  if (s.save_blocked_s > 0) {
    std::snprintf(buf, sizeof buf, " | save blocked %.1f ms", s.save_blocked_s * 1e3);
    line += buf;
  }
  return line;
}

nlohmann::json Trainer::to_json(const StepStats& s) {
  return {{"step", s.step}, {"loss", s.loss}, {"lr", s.lr}, {"grad_norm", s.grad_norm},
          {"seconds", s.seconds}, {"tokens_per_s", s.tokens_per_s}, {"flops_per_s", s.flops_per_s},
          {"save_blocked_s", s.save_blocked_s}};
}

Status Trainer::run(const std::function<void(const StepStats&)>& on_step) {
  const TrainOptions& o = opt_s_;
  while (state_.step < o.steps) {
    CKPT_ASSIGN_OR_RETURN(StepStats st, train_step());
    const bool last = state_.step == o.steps;
    if (!o.out_dir.empty() && ((o.save_every > 0 && state_.step % o.save_every == 0) || last)) {
      CKPT_ASSIGN_OR_RETURN(st.save_blocked_s, save(o.async_save && !last));
    }
    if (o.print) {
      std::printf("%s\n", format_line(st).c_str());
      std::fflush(stdout);
    }
    if (log_) {
      std::fprintf(log_, "%s\n", to_json(st).dump().c_str());
      std::fflush(log_);
    }
    if (on_step) on_step(st);
  }
  return wait_saves();
}

}  // namespace ckpt::trainer
