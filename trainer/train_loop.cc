#include "trainer/train_loop.h"

#include <chrono>
#include <cmath>
#include <sys/stat.h>

#include "formats/base/checked.h"
#include "formats/base/fs_util.h"
#include "formats/store/run_dir.h"
#include "reshard/dist/comm.h"
#include "trainer/emulate.h"
#include "trainer/memory_report.h"
#include "trainer/model/ops.h"
#include "trainer/optim/zero_optimizer.h"
#include "trainer/parallel_step.h"
#include "trainer/state/dist_checkpoint.h"
#include "trainer/state/grad_dump.h"
#include "trainer/train_layout.h"
#include "trainer/train_profile.h"

namespace ckpt::trainer {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Status check_options(const TrainOptions& o) {
  if (o.steps < 0) return Status::InvalidArgument("--steps must be >= 0");
  if (o.micro_batch < 1 || o.seq_len < 1 || o.grad_accum < 1)
    return Status::InvalidArgument("--micro-batch, --seq-len and --grad-accum must be >= 1");
  if (o.micro_batch > (1 << 20) || o.grad_accum > (1 << 20))
    return Status::InvalidArgument("--micro-batch / --grad-accum too large");
  if (o.seq_len > o.config.max_position_embeddings)
    return Status::InvalidArgument("--seq-len " + std::to_string(o.seq_len) + " exceeds the config's max_position_embeddings " +
                                   std::to_string(o.config.max_position_embeddings));
  if (o.save_every < 0) return Status::InvalidArgument("--save-every must be >= 0");
  if (!(o.lr >= 0 && o.lr <= kMaxLr))
    return Status::InvalidArgument("--lr " + std::to_string(o.lr) + ": expected a finite value in [0, " + std::to_string(kMaxLr) + "]");
  if (std::string e = adamw_out_of_range(o.adam, "AdamW "); !e.empty())
    return Status::InvalidArgument(e + (e.find("weight_decay") != std::string::npos ? " (--weight-decay)" : ""));
  if (!(o.max_grad_norm >= 0 && std::isfinite(o.max_grad_norm))) return Status::InvalidArgument("--clip must be a finite value >= 0");
  if (o.steps > kMaxSteps || o.total_steps > kMaxSteps || o.warmup > kMaxSteps)
    return Status::InvalidArgument("--steps, --total-steps and --warmup must be at most " + std::to_string(kMaxSteps));
  if (o.warmup < 0) return Status::InvalidArgument("--warmup must be >= 0");
  if (o.threads < 1 || o.threads > 1024) return Status::InvalidArgument("--threads must be in [1, 1024]");
  if (o.config.vocab_size < kMinVocab)
    return Status::InvalidArgument("vocab_size " + std::to_string(o.config.vocab_size) +
                                   " is smaller than the byte tokenizer's " + std::to_string(kMinVocab));
  if (o.resume == "latest" && o.out_dir.empty()) return Status::InvalidArgument("--resume latest needs --out RUN_DIR");
  if (!o.resume.empty() && !o.init.empty())
    return Status::InvalidArgument("--init starts a new run from a checkpoint's weights, --resume continues one: give one");
  return Status::Ok();
}

// Tokens per step within the limits of one process's buffers.
Status check_batch(const Layout& layout, const TrainOptions& o) {
  const int64_t g = global_batch(layout, o.grad_accum);
  auto all = checked_mul(g, o.seq_len);
  if (!all || *all > (int64_t{1} << 31))
    return Status::InvalidArgument("--grad-accum x sum(micro-batches) x --seq-len is too many tokens per step");
  return Status::Ok();
}

// Checkpoints in the cluster's profile (trainer/train_profile.h): its JSON beside the checkpoints
// (RUN_DIR/save_profile.json, rank 0), each save converted into it.
Status use_save_profile(Comm& world, DistSaver& saver, const TrainProfile& tp, const TrainOptions& o) {
  const std::string file = o.out_dir + "/save_profile.json";
  Status st;
  if (world.rank() == 0) st = write_file_atomic(file, tp.profile.to_json().dump(2) + "\n");
  CKPT_RETURN_IF_ERROR(world.agree(st));
  saver.set_convert([&world, file, layout = tp.stored_layout, threads = o.threads, digest = o.digest](
                        const std::string& staged, const std::string& dst, uint64_t budget) {
    return convert_saved_checkpoint(world, staged, dst, file, layout, threads, digest, budget);
  });
  return Status::Ok();
}

}  // namespace

struct Trainer::Parts {
  LayoutGroups groups;
  std::unique_ptr<ParallelOptimizer<float>> opt;
  std::unique_ptr<DistSaver> saver;
  std::unique_ptr<ExpertGroups> experts;  // expert parallel MoE layouts
  Emulation emu;  // --emulate
  DirLock run_lock;  // rank 0: the run dir, for the whole run (a second trainer on it is refused)
};

Trainer::Trainer() = default;

Trainer::~Trainer() {
  if (parts_ && parts_->saver) (void)parts_->saver->wait();
  if (log_) std::fclose(log_);
}

int Trainer::rank() const { return Comm::world().rank(); }

Result<std::unique_ptr<Trainer>> Trainer::create(const TrainOptions& o) {
  Comm& world = Comm::world();
  CKPT_RETURN_IF_ERROR(check_options(o));
  TrainLayoutFlags lf{o.layout_values, o.layout_file, o.micro_batches, o.micro_batch};
  CKPT_ASSIGN_OR_RETURN(Layout layout, train_layout(lf, o.config, world.size()));
  CKPT_RETURN_IF_ERROR(check_batch(layout, o));
  std::string mem_check;  // before any allocation: the cluster file and every rank's memory estimate
  CKPT_RETURN_IF_ERROR(check_cluster_memory(
      o.cluster_file, memory_inputs(o.config, layout, o.seq_len, o.grad_accum, !o.out_dir.empty(), o.data_path),
      &mem_check));
  if (!mem_check.empty() && o.print && world.rank() == 0) std::printf("%s\n", mem_check.c_str());
  // The cluster's profile (checked before any allocation): what the checkpoints are stored in.
  CKPT_ASSIGN_OR_RETURN(TrainProfile tp, train_profile(o.cluster_file, o.config, layout));
  if (!tp.note.empty() && o.print && world.rank() == 0 && !o.out_dir.empty()) std::printf("%s\n", tp.note.c_str());
  Emulation emu;
  if (o.emulate) {
    CKPT_ASSIGN_OR_RETURN(emu, make_emulation(o.cluster_file, world.size()));
  }
  if (emu.on && o.print && world.rank() == 0) std::printf("%s\n", emu.label().c_str());
  std::unique_ptr<Trainer> t(new Trainer());
  t->opt_s_ = o;
  t->layout_ = layout;
  set_blas_threads(o.threads);
  t->parts_ = std::make_unique<Parts>();
  Parts& p = *t->parts_;
  p.emu = std::move(emu);
  // An existing run dir is locked before any work: a second trainer on it is refused at once.
  if (!o.out_dir.empty()) {
    Status st;
    if (world.rank() == 0 && is_directory(o.out_dir)) {
      auto l = DirLock::try_lock(o.out_dir, "run directory '" + o.out_dir + "' is used by another `ckpt train`");
      if (l.ok()) p.run_lock = std::move(l).value();
      else st = l.take_status();
    }
    CKPT_RETURN_IF_ERROR(world.agree(st));
  }
  CKPT_ASSIGN_OR_RETURN(p.groups, LayoutGroups::make(world, layout));
  const LayoutGroups& g = p.groups;
  CKPT_ASSIGN_OR_RETURN(p.experts, ExpertGroups::make_if_expert_parallel(world, layout, o.config.moe.has_value(), p.groups));
  ModelShard shard{layout.stage_view(g.dp_rank, g.pp_rank), g.pp_rank, g.tp_rank, &p.groups.tp, g.dp_rank,
                   p.experts.get()};
  CKPT_ASSIGN_OR_RETURN(auto m, Model<float>::create(o.config, shard));
  t->model_ = std::make_unique<Model<float>>(std::move(m));
  CKPT_RETURN_IF_ERROR(t->model_->init(o.seed));
  CKPT_ASSIGN_OR_RETURN(auto popt, ParallelOptimizer<float>::create(*t->model_, layout, g.pp_rank, g.dp_rank,
                                                                   g.tp_rank, &world, o.adam));
  p.opt = std::make_unique<ParallelOptimizer<float>>(std::move(popt));
  TrainerState& s = t->state_;
  s = initial_state(o);
  s.micro_batch = layout.pipeline_micro_batch(0);
  s.global_batch = global_batch(layout, o.grad_accum);
  if (!o.resume.empty()) CKPT_RETURN_IF_ERROR(t->resume(o.resume == "latest" ? o.out_dir : o.resume));
  if (!o.init.empty()) CKPT_RETURN_IF_ERROR(t->init_weights(o.init));
  if (o.data_path.empty()) {
    t->data_ = TokenStream::procedural(s.seed);
  } else {
    CKPT_ASSIGN_OR_RETURN(t->data_, TokenStream::from_file(s.seed, o.data_path));
  }
  if (!o.out_dir.empty()) {
    Status st;
    if (world.rank() == 0) {
      if (::mkdir(o.out_dir.c_str(), 0755) != 0 && errno != EEXIST)
        st = Status::FromErrno("cannot create run dir", o.out_dir, errno);
      if (st.ok() && !p.run_lock.held()) {
        auto l = DirLock::try_lock(o.out_dir, "run directory '" + o.out_dir + "' is used by another `ckpt train`");
        if (l.ok()) p.run_lock = std::move(l).value();
        else st = l.take_status();
      }
      const std::string lp = o.out_dir + "/train_log.jsonl";
      if (st.ok() && !(t->log_ = std::fopen(lp.c_str(), "a"))) st = Status::FromErrno("cannot open", lp, errno);
    }
    CKPT_RETURN_IF_ERROR(world.agree(st));
    store::StoreOptions so;
    so.digest = o.digest;
    // Saving in a profile: planned under the symmetric form (the same placement as a uniform
    // general layout; a profile store's layout has one tp), so the conversion keeps it.
    p.saver = std::make_unique<DistSaver>(world, o.config, tp.active ? tp.stored_layout : layout, o.out_dir, so);
    CKPT_RETURN_IF_ERROR(world.agree(p.saver->prepare()));
    if (tp.active) CKPT_RETURN_IF_ERROR(use_save_profile(world, *p.saver, tp, o));
  }
  return t;
}

Status Trainer::resume(const std::string& path) {
  Parts& p = *parts_;
  CKPT_ASSIGN_OR_RETURN(nlohmann::json meta,
                        dist_load(Comm::world(), path, opt_s_.config, layout_, p.opt->held_regions()));
  if (!meta.contains("trainer"))
    return Status::Error("NotTrainerCheckpoint", "checkpoint '" + path + "' has no 'trainer' metadata").with_file(path);
  auto parsed = TrainerState::from_json(meta.at("trainer"));
  if (!parsed.ok()) {
    auto dir = store::resolve_checkpoint(path);  // the step dir `latest` names
    const std::string ckpt = dir.ok() ? *dir : path;
    return parsed.take_status().with_context("resume from checkpoint '" + ckpt + "'").with_file(ckpt + "/manifest.json");
  }
  TrainerState rs = std::move(parsed).value();
  TrainerState& s = state_;
  if (rs.seed != s.seed || rs.global_batch != s.global_batch || rs.seq_len != s.seq_len ||
      rs.data_source != s.data_source)
    return Status::InvalidArgument(
        "resume: the checkpoint was trained with seed " + std::to_string(rs.seed) + ", global batch " +
        std::to_string(rs.global_batch) + " samples, seq-len " + std::to_string(rs.seq_len) + ", data '" +
        rs.data_source + "'; this run has seed " + std::to_string(s.seed) + ", global batch " +
        std::to_string(s.global_batch) + " (grad-accum x sum of micro-batches), seq-len " + std::to_string(s.seq_len) +
        ", data '" + s.data_source + "': pass the same values to continue the same run");
  // Step, schedule and optimizer hyper-parameters come from the checkpoint; the batch split is this run's.
  rs.micro_batch = s.micro_batch;
  rs.grad_accum = s.grad_accum;
  s = rs;
  p.opt->adam().set_options(s.adam);  // ZeRO-1 master values are taken from the Params at each step
  return Status::Ok();
}

Status Trainer::init_weights(const std::string& path) {
  std::vector<HeldRegion> held;
  for (HeldRegion& h : parts_->opt->held_regions())
    if (!h.tensor.starts_with("optimizer.")) held.push_back(std::move(h));
  auto meta = dist_load(Comm::world(), path, opt_s_.config, layout_, held, true);
  if (!meta.ok()) return meta.take_status().with_context("--init from '" + path + "'");
  return Status::Ok();
}

Result<StepStats> Trainer::train_step() {
  Parts& p = *parts_;
  GradDump<float> dump;
  if (!opt_s_.dump_grads.empty() && !grads_dumped_) {
    dump = [this](const std::vector<GradRegion<float>>& grads) {
      return dump_gradients(Comm::world(), opt_s_.config, grads, opt_s_.dump_grads);
    };
    grads_dumped_ = true;
  }
  CKPT_ASSIGN_OR_RETURN(StepStats st,
                        parallel_step(*model_, *p.opt, data_, &state_, layout_, p.groups, dump, p.emu.factor(rank())));
  st.emulation = p.emu.label();
  st.emulation_factors = p.emu.factors_json();
  return st;
}

static nlohmann::json checkpoint_metadata(const LlamaConfig& c, const Layout& layout, const TrainerState& s) {
  return {{"model_config", c.to_json()}, {"layout", layout.to_json()}, {"trainer", s.to_json()}, {"profile", "reference"}};
}

Result<double> Trainer::save(bool async) {
  if (opt_s_.out_dir.empty() || !parts_->saver) return Status::InvalidArgument("saving needs --out RUN_DIR");
  const double t0 = now_s();
  CKPT_RETURN_IF_ERROR(parts_->saver->save(parts_->opt->held_regions(),
                                           checkpoint_metadata(opt_s_.config, layout_, state_), state_.step, async));
  return now_s() - t0;
}

Status Trainer::wait_saves() { return parts_->saver ? parts_->saver->wait() : Status::Ok(); }

std::string Trainer::format_line(const StepStats& s) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %6lld | loss %.6f | lr %.4e | grad_norm %.4f | %.0f tok/s | %.3f GFLOP/s",
                static_cast<long long>(s.step), s.loss, s.lr, s.grad_norm, s.tokens_per_s,
                s.flops_per_s / 1e9);
  std::string line = buf;
  if (Comm::world().size() > 1) {
    std::snprintf(buf, sizeof buf, " | comm %.0f%% idle %.0f%%", 100 * s.comm_s / s.seconds, 100 * s.idle_s / s.seconds);
    line += buf;
  }
  if (s.a2a_s > 0) {
    std::snprintf(buf, sizeof buf, " | a2a %.0f%%", 100 * s.a2a_s / s.seconds);
    line += buf;
  }
  if (s.router_load > 0) {
    std::snprintf(buf, sizeof buf, " | router max/mean %.2f", s.router_load);
    line += buf;
  }
  if (s.save_blocked_s > 0) {
    std::snprintf(buf, sizeof buf, " | save blocked %.1f ms", s.save_blocked_s * 1e3);
    line += buf;
  }
  if (!s.emulation.empty()) line += " | " + s.emulation.substr(0, s.emulation.find(" ("));
  return line;
}

nlohmann::json Trainer::to_json(const StepStats& s) {
  nlohmann::json j = {{"step", s.step}, {"loss", s.loss}, {"lr", s.lr}, {"grad_norm", s.grad_norm},
          {"seconds", s.seconds}, {"tokens_per_s", s.tokens_per_s}, {"flops_per_s", s.flops_per_s},
          {"save_blocked_s", s.save_blocked_s}, {"compute_s", s.compute_s}, {"comm_s", s.comm_s},
          {"idle_s", s.idle_s}};
  if (s.router_load > 0) j["router_load"] = s.router_load;
  if (s.a2a_s > 0) j["a2a_s"] = s.a2a_s;
  if (!s.emulation.empty()) {
    j["emulated"] = s.emulation_factors;
    j["rank_compute_s"] = s.rank_compute_s;
  }
  return j;
}

Status Trainer::run(const std::function<void(const StepStats&)>& on_step) {
  const TrainOptions& o = opt_s_;
  const bool rank0 = rank() == 0;
  while (state_.step < o.steps) {
    CKPT_ASSIGN_OR_RETURN(StepStats st, train_step());
    if (parts_->saver) CKPT_RETURN_IF_ERROR(parts_->saver->poll().status());
    const bool last = state_.step == o.steps;
    if (!o.out_dir.empty() && ((o.save_every > 0 && state_.step % o.save_every == 0) || last)) {
      CKPT_ASSIGN_OR_RETURN(st.save_blocked_s, save(o.async_save && !last));
    }
    if (o.print && rank0) {
      std::printf("%s\n", format_line(st).c_str());
      std::fflush(stdout);
    }
    if (log_) {
      std::fprintf(log_, "%s\n", to_json(st).dump().c_str());
      std::fflush(log_);
    }
    if (on_step) on_step(st);
  }
  CKPT_RETURN_IF_ERROR(wait_saves());
  CKPT_RETURN_IF_ERROR(report_memory(Comm::world(),
                                     memory_inputs(o.config, layout_, o.seq_len, o.grad_accum, !o.out_dir.empty(), o.data_path),
                                     o.out_dir, o.print && !o.cluster_file.empty()));
  if (!parts_->emu.on) return Status::Ok();
  CKPT_ASSIGN_OR_RETURN(nlohmann::json mem, emulation_memory_report(Comm::world(), parts_->emu, o.print));
  if (log_) {
    std::fprintf(log_, "%s\n", nlohmann::json{{"emulation_memory", mem}}.dump().c_str());
    std::fflush(log_);
  }
  return Status::Ok();
}

}  // namespace ckpt::trainer
