#include "trainer/plan/calibrate_probe.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "reshard/dist/comm.h"
#include "trainer/model/ops.h"
#include "trainer/optim/adamw.h"
#include "trainer/plan/cost_model.h"
#include "trainer/train_loop.h"

namespace ckpt::trainer {

namespace calibrate_detail {

double clock_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// Runs `rep` (returning the work it did) until `seconds` passed and at least `min_reps` ran;
// the first run is a warm-up. Returns the median work per second.
template <class F>
double median_rate(double seconds, int min_reps, F rep) {
  (void)rep();
  std::vector<double> rates;
  const double end = clock_s() + seconds;
  while (static_cast<int>(rates.size()) < min_reps || (clock_s() < end && rates.size() < 100000)) {
    const double t0 = clock_s();
    const double work = rep();
    const double dt = clock_s() - t0;
    if (dt > 0) rates.push_back(work / dt);
  }
  return median_of(std::move(rates));
}

}  // namespace calibrate_detail

using calibrate_detail::clock_s;
using calibrate_detail::median_rate;

LlamaConfig calibration_model() {
  LlamaConfig c;
  c.vocab_size = 264;
  c.hidden_size = 256;
  c.intermediate_size = 704;
  c.num_hidden_layers = 6;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 32;
  c.rms_norm_eps = 1e-5;
  c.max_position_embeddings = 512;
  c.bos_token_id = 256;
  c.eos_token_id = 257;
  return c;
}

double sgemm_flops(int threads, double seconds) {
  set_blas_threads(threads);
  const LlamaConfig c = calibration_model();
  const int64_t n = kCalibrationMicroBatch * kCalibrationSeq, D = c.hidden_size, F = c.intermediate_size;
  std::vector<float> x(static_cast<size_t>(n * D), 0.5f), w(static_cast<size_t>(F * D), 0.01f);
  std::vector<float> y(static_cast<size_t>(n * F), 0.f), dy(y.size(), 0.25f), dx(x.size()), dw(w.size());
  std::vector<float> h(y.size(), 0.5f), dh(h.size()), y2(x.size()), dy2(x.size(), 0.25f);
  std::vector<float> w2(w.size(), 0.01f), dw2(w.size());
  const double flops = 12.0 * static_cast<double>(n * D * F);  // two projections, forward + backward
  return median_rate(seconds, 5, [&]() {
    linear_forward(x.data(), w.data(), y.data(), n, D, F);           // up: [n,D] -> [n,F]
    linear_forward(h.data(), w2.data(), y2.data(), n, F, D);         // down: [n,F] -> [n,D]
    linear_backward(h.data(), w2.data(), dy2.data(), dh.data(), false, dw2.data(), n, F, D);
    linear_backward(x.data(), w.data(), dy.data(), dx.data(), false, dw.data(), n, D, F);
    return flops;
  });
}

Result<double> trainer_flops(int threads, double seconds) {
  TrainOptions o;
  o.config = calibration_model();
  o.steps = 1 << 20;
  o.micro_batch = kCalibrationMicroBatch;
  o.seq_len = kCalibrationSeq;
  o.threads = threads;
  o.print = false;
  CKPT_ASSIGN_OR_RETURN(auto t, Trainer::create(o));
  // The cost model's FLOPs (trainer/plan/cost_model.h), so that efficiency x peak predicts the trainer.
  const double step_flops = ModelSpec::from_config(o.config).step_flops(o.micro_batch, o.seq_len);
  Status failed;
  const double rate = median_rate(seconds, 3, [&]() {
    auto st = t->train_step();
    if (!st.ok() && failed.ok()) failed = st.status();
    return step_flops;
  });
  CKPT_RETURN_IF_ERROR(failed);
  return rate;
}

double update_params_rate(double seconds) {
  const int64_t n = int64_t{4} << 20;  // 4M parameters: 64 MiB of weights, gradients and moments
  std::vector<float> w(static_cast<size_t>(n), 0.5f), g(static_cast<size_t>(n), 0.01f);
  AdamW opt;
  opt.add("w", Shape{n}, Region{Box::whole(Shape{n})}, w.data(), g.data(), n, true);
  int64_t step = 0;
  return median_rate(seconds, 3, [&]() {
    const double norm = std::sqrt(opt.grad_sq_sum());  // as optimizer_step: the norm, clipping, AdamW
    opt.scale_grads(AdamW::clip_coef(norm, 1.0));
    opt.step(1e-4, ++step);
    return static_cast<double>(n);
  });
}

double memcpy_bandwidth(double seconds) {
  const size_t bytes = size_t{64} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  return median_rate(seconds, 5, [&]() {
    std::memcpy(b.data(), a.data(), bytes);
    a[0] = b[bytes / 2];  // keep the copy observable
    return static_cast<double>(bytes);
  });
}

namespace {

// Seconds of one round trip (rank 0 sends, rank 1 echoes) of n floats: the median of `reps`, each
// timed alone after a barrier (on a shared machine a descheduled peer makes a few round trips
// hundreds of times slower; a mean over them measured the scheduler, not the link).
Result<double> calib_round_trip(Comm& w, std::vector<float>& buf, int64_t n, int reps) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CKPT_RETURN_IF_ERROR(w.barrier());
    const double t0 = clock_s();
    if (w.rank() == 0) {
      CKPT_RETURN_IF_ERROR(w.send(buf.data(), n, 1, 7));
      CKPT_RETURN_IF_ERROR(w.recv(buf.data(), n, 1, 7));
    } else {
      CKPT_RETURN_IF_ERROR(w.recv(buf.data(), n, 0, 7));
      CKPT_RETURN_IF_ERROR(w.send(buf.data(), n, 0, 7));
    }
    t.push_back(clock_s() - t0);
  }
  return calibrate_detail::median_of(std::move(t));
}

}  // namespace

nlohmann::json ProbeCostTerms::to_json() const {
  return {{"sgemm_alone", sgemm_alone},         {"sgemm_concurrent", sgemm_concurrent},
          {"allreduce_sizes_bytes", allreduce_sizes_bytes}, {"allreduce_call_s", allreduce_call_s},
          {"allreduce_latency_s", allreduce_latency_s}, {"allreduce_bytes_per_s", allreduce_bytes_per_s},
          {"a2a_sizes_bytes", a2a_sizes_bytes}, {"a2a_call_s", a2a_call_s},
          {"a2a_latency_s", a2a_latency_s}, {"a2a_bytes_per_s", a2a_bytes_per_s},
          {"dp_micro_batch_s", dp_micro_batch_s}, {"pp_micro_batch_s", pp_micro_batch_s}, {"sync_bytes_per_s", sync_bytes_per_s}};
}

ProbeCostTerms ProbeCostTerms::from_json(const nlohmann::json& j) {
  ProbeCostTerms t;
  auto num = [&](const char* k) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : 0.0; };
  auto vec = [&](const char* k) {
    std::vector<double> v;
    if (j.contains(k) && j[k].is_array())
      for (const auto& x : j[k])
        if (x.is_number() && v.size() < 64) v.push_back(x.get<double>());
    return v;
  };
  t.sgemm_alone = num("sgemm_alone"), t.sgemm_concurrent = num("sgemm_concurrent");
  t.allreduce_sizes_bytes = vec("allreduce_sizes_bytes"), t.allreduce_call_s = vec("allreduce_call_s");
  t.allreduce_latency_s = num("allreduce_latency_s"), t.allreduce_bytes_per_s = num("allreduce_bytes_per_s");
  t.a2a_sizes_bytes = vec("a2a_sizes_bytes"), t.a2a_call_s = vec("a2a_call_s");
  t.a2a_latency_s = num("a2a_latency_s"), t.a2a_bytes_per_s = num("a2a_bytes_per_s");
  t.dp_micro_batch_s = num("dp_micro_batch_s"), t.pp_micro_batch_s = num("pp_micro_batch_s");
  t.sync_bytes_per_s = num("sync_bytes_per_s");
  return t;
}

Status mpi_probe(double seconds, int threads) {
  Comm& w = Comm::world();
  if (w.size() != 2)
    return Status::InvalidArgument("calibrate-mpi-probe runs under mpirun -np 2, got a world of " +
                                   std::to_string(w.size()) + " rank(s)");
  const int64_t big = int64_t{4} << 20;  // 16 MiB of floats
  std::vector<float> buf(static_cast<size_t>(big), 1.f);
  const int small_reps = std::clamp(static_cast<int>(seconds * 500), 50, 2000);
  const int big_reps = std::clamp(static_cast<int>(seconds * 10), 5, 100);
  CKPT_RETURN_IF_ERROR(calib_round_trip(w, buf, 2, 10).status());  // warm-up
  CKPT_ASSIGN_OR_RETURN(double small_rt, calib_round_trip(w, buf, 2, small_reps));
  CKPT_RETURN_IF_ERROR(calib_round_trip(w, buf, big, 8).status());  // warm-up: the first round trips of 16 MiB run at 0.5-0.8x
  CKPT_ASSIGN_OR_RETURN(double big_rt, calib_round_trip(w, buf, big, big_reps));
  CKPT_ASSIGN_OR_RETURN(ProbeCostTerms terms, probe_cost_terms(threads, seconds));
  if (w.rank() == 0) {
    const nlohmann::json j = {{"latency_s", small_rt / 2},
                              {"bytes_per_s", static_cast<double>(big * 4) / std::max(big_rt / 2 - small_rt / 2, 1e-9)},
                              {"terms", terms.to_json()}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return Status::Ok();
}

namespace {

// A directory of its own for the probe job's Open MPI session files, removed with this object.
// Open MPI 4 keeps every job of a user under one directory, /tmp/ompi.<host>.<uid>, that a job
// creates when it starts and removes when it ends: a job starting while another ends may fail
// with "A call to mkdir was unable to create the desired directory ... File exists"
// (open-mpi/ompi#8510). Given to mpirun as orte_tmpdir_base, the probe shares it with no job.
struct SessionDir {
  std::string path;
  SessionDir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/ckpt-ompi-XXXXXX";
    if (::mkdtemp(tmpl.data())) path = tmpl;  // else mpirun's default (the shared directory)
  }
  ~SessionDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  SessionDir(const SessionDir&) = delete;
  SessionDir& operator=(const SessionDir&) = delete;
};

}  // namespace

Result<MpiProbeResult> spawn_mpi_probe(const std::string& exe_in, double seconds, int threads) {
  std::string exe = exe_in;
  if (exe.empty()) {
    char buf[4096];
    const ssize_t k = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (k <= 0) return Status::FromErrno("cannot find this executable", "/proc/self/exe", errno);
    exe.assign(buf, static_cast<size_t>(k));
  }
  const SessionDir session;
  if (exe.find('\'') != std::string::npos || session.path.find('\'') != std::string::npos)
    return Status::InvalidArgument("calibration: a path with a quote: " + exe + ", " + session.path);
  const std::string session_mca = session.path.empty() ? "" : "--mca orte_tmpdir_base '" + session.path + "' ";
  const std::string cmd = std::string("mpirun ") + (::geteuid() == 0 ? "--allow-run-as-root " : "") +
                          "--oversubscribe --mca btl self,vader --mca pml ob1 " + session_mca + "-np 2 '" + exe +
                          "' calibrate-mpi-probe --seconds " + std::to_string(seconds) +
                          " --threads " + std::to_string(threads) + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return Status::FromErrno("cannot start mpirun", cmd, errno);
  std::string out;
  char line[4096];
  while (std::fgets(line, sizeof line, p) && out.size() < (1 << 20)) out += line;
  const int rc = ::pclose(p);
  const size_t at = out.find("{\"");
  if (rc != 0 || at == std::string::npos)
    return Status::Error("CalibrationFailed", "MPI calibration (" + cmd + ") exited with status " +
                                                  std::to_string(rc) + ": " + out.substr(0, 2000));
  const auto j = nlohmann::json::parse(out.substr(at, out.find('\n', at) - at), nullptr, false);
  if (!j.is_object() || !j.contains("latency_s") || !j.contains("bytes_per_s"))
    return Status::Error("CalibrationFailed", "MPI calibration printed no result line: " + out.substr(0, 2000));
  if (!j["latency_s"].is_number() || !j["bytes_per_s"].is_number())
    return Status::Error("CalibrationFailed", "MPI calibration printed a result line without numbers: " + out.substr(0, 2000));
  return MpiProbeResult{j["latency_s"].get<double>(), j["bytes_per_s"].get<double>(),
                        ProbeCostTerms::from_json(j.value("terms", nlohmann::json::object()))};
}

}  // namespace ckpt::trainer
