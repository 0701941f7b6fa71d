// The cost terms measured inside the MPI probe (trainer/plan/calibrate_probe.h "probe_cost_terms";
// docs/PLAN.md "Calibrated terms"). Every loop that communicates runs a fixed number of repetitions
// on both ranks (collectives must match); time-budgeted loops run only local work.
#include <algorithm>
#include <chrono>
#include <vector>

#include "reshard/dist/comm.h"
#include "trainer/model/ops.h"
#include "trainer/plan/calibrate_probe.h"
#include "trainer/train_loop.h"

namespace ckpt::trainer {

namespace calibrate_terms_detail {

double terms_clock_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double terms_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

enum class TermsComm { kNone, kAllReduce, kAllToAll };

// The expert all-to-all of 2 ranks as the EP dispatch runs it: the row counts, then the rows (each
// rank sends its [rows, D] to the peer and receives the peer's), one Comm::exchange each.
Status terms_all_to_all(Comm& w, const std::vector<float>& y, std::vector<float>& in, int64_t rows, int64_t D) {
  const int peer = 1 - w.rank();
  int64_t count = rows, got = 0;
  CKPT_RETURN_IF_ERROR(w.exchange<int64_t>({{&count, 1, peer}}, {{&got, 1, peer}}, 41));
  return w.exchange<float>({{y.data(), rows * D, peer}}, {{in.data(), std::min(got, rows) * D, peer}}, 42);
}

// Seconds per repetition of {a GEMM [rows, D] x [D, D] on every rank; then `comm` of the [rows, D]
// result}, the median of `rounds` rounds of `reps`.
Result<double> terms_gemm_loop(Comm& w, int64_t rows, int64_t D, TermsComm comm, int reps, int rounds) {
  std::vector<float> x(static_cast<size_t>(rows * D), 0.5f), wt(static_cast<size_t>(D * D), 0.01f), y(x.size()), in(x.size());
  std::vector<double> per;
  for (int k = 0; k < rounds; ++k) {
    CKPT_RETURN_IF_ERROR(w.barrier());
    const double t0 = terms_clock_s();
    for (int i = 0; i < reps; ++i) {
      linear_forward(x.data(), wt.data(), y.data(), rows, D, D);
      if (comm == TermsComm::kAllReduce) CKPT_RETURN_IF_ERROR(w.all_reduce_sum(y.data(), rows * D));
      if (comm == TermsComm::kAllToAll) CKPT_RETURN_IF_ERROR(terms_all_to_all(w, y, in, rows, D));
    }
    per.push_back((terms_clock_s() - t0) / reps);
  }
  double v = terms_median(per);
  CKPT_RETURN_IF_ERROR(w.all_reduce_max(&v, 1));
  return v;
}

// The smallest model the trainer runs: 2 layers, hidden 32; its compute per micro-batch is a few
// microseconds, so a step's time is its fixed costs.
LlamaConfig terms_tiny_model() {
  LlamaConfig c = calibration_model();
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 16;
  return c;
}

// Median step seconds of the tiny model under `lv` with grad_accum micro-batches of 1 sequence.
Result<double> terms_tiny_step(const LayoutValues& lv, int64_t grad_accum, int threads) {
  TrainOptions o;
  o.config = terms_tiny_model();
  o.steps = 1 << 20;
  o.micro_batch = 1;
  o.seq_len = 16;
  o.grad_accum = grad_accum;
  o.threads = threads;
  o.print = false;
  o.layout_values = lv;
  CKPT_ASSIGN_OR_RETURN(auto t, Trainer::create(o));
  std::vector<double> secs;
  for (int i = 0; i < 14; ++i) {
    CKPT_ASSIGN_OR_RETURN(StepStats s, t->train_step());
    if (i >= 3) secs.push_back(s.seconds);
  }
  double v = terms_median(std::move(secs));
  CKPT_RETURN_IF_ERROR(Comm::world().all_reduce_max(&v, 1));
  return v;
}

// Bytes per second of the gradient sync's all-reduce at 16 MiB: bytes / the median of 5 calls.
Result<double> terms_sync_rate(Comm& w) {
  std::vector<float> g(size_t{4} << 20, 0.001f);
  std::vector<double> t;
  for (int i = 0; i < 6; ++i) {
    CKPT_RETURN_IF_ERROR(w.barrier());
    const double t0 = terms_clock_s();
    CKPT_RETURN_IF_ERROR(w.all_reduce_sum(g.data(), static_cast<int64_t>(g.size())));
    if (i > 0) t.push_back(terms_clock_s() - t0);
  }
  double v = terms_median(std::move(t));
  CKPT_RETURN_IF_ERROR(w.all_reduce_max(&v, 1));
  return v > 0 ? static_cast<double>(g.size() * sizeof(float)) / v : 0.0;
}

}  // namespace calibrate_terms_detail

Result<ProbeCostTerms> probe_cost_terms(int threads, double seconds) {
  Comm& w = Comm::world();
  ProbeCostTerms r;
  set_blas_threads(threads);
  // Concurrency: rank 0's sgemm alone (rank 1 waits in a barrier, which sleeps), then both at once.
  double alone = 0;
  if (w.rank() == 0) alone = sgemm_flops(threads, seconds);
  CKPT_RETURN_IF_ERROR(w.barrier());
  double both[2] = {0, 0};
  both[w.rank()] = sgemm_flops(threads, seconds);
  CKPT_RETURN_IF_ERROR(w.all_reduce_sum(both, 2));
  CKPT_RETURN_IF_ERROR(w.all_reduce_sum(&alone, 1));
  r.sgemm_alone = alone;
  r.sgemm_concurrent = 0.5 * (both[0] + both[1]);
  // The TP all-reduce between GEMMs at the trainer's message sizes (rows = micro-batch x seq of the
  // calibration model at micro-batch 1 and 4, hidden 256): per call = with - without reduce.
  const LlamaConfig cm = calibration_model();
  const int64_t D = cm.hidden_size;
  const int64_t rows[2] = {kCalibrationSeq, kCalibrationMicroBatch * kCalibrationSeq};
  using calibrate_terms_detail::TermsComm;
  for (TermsComm comm : {TermsComm::kAllReduce, TermsComm::kAllToAll}) {
    const bool ar = comm == TermsComm::kAllReduce;
    std::vector<double>& sizes = ar ? r.allreduce_sizes_bytes : r.a2a_sizes_bytes;
    std::vector<double>& calls = ar ? r.allreduce_call_s : r.a2a_call_s;
    for (int i = 0; i < 2; ++i) {
      const int reps = i == 0 ? 40 : 20;
      CKPT_ASSIGN_OR_RETURN(double with, calibrate_terms_detail::terms_gemm_loop(w, rows[i], D, comm, reps, 5));
      CKPT_ASSIGN_OR_RETURN(double without, calibrate_terms_detail::terms_gemm_loop(w, rows[i], D, TermsComm::kNone, reps, 5));
      sizes.push_back(static_cast<double>(rows[i] * D * 4));
      calls.push_back(std::max(with - without, 1e-9));
    }
    // Fit latency + bytes / bandwidth through the two sizes.
    const double db = sizes[1] - sizes[0], dt = calls[1] - calls[0];
    const double bw = dt > 0 ? db / dt : 1e15;  // no size dependence measured: all latency
    const double lat = dt > 0 ? std::max(0.0, calls[0] - sizes[0] / bw) : calls[1];
    (ar ? r.allreduce_bytes_per_s : r.a2a_bytes_per_s) = bw;
    (ar ? r.allreduce_latency_s : r.a2a_latency_s) = lat;
  }
  // Fixed costs per micro-batch: the tiny model's step time slope in the number of micro-batches,
  // as 2 replicas (one stage each) and as a 2-stage pipeline.
  const int64_t m_lo = 2, m_hi = 16;
  LayoutValues dp;
  dp.tp = 1, dp.pp = 1, dp.dp = 2, dp.zero = 0;
  LayoutValues pp;
  pp.tp = 1, pp.pp = 2, pp.dp = 1, pp.zero = 0;
  CKPT_ASSIGN_OR_RETURN(double dp_lo, calibrate_terms_detail::terms_tiny_step(dp, m_lo, threads));
  CKPT_ASSIGN_OR_RETURN(double dp_hi, calibrate_terms_detail::terms_tiny_step(dp, m_hi, threads));
  CKPT_ASSIGN_OR_RETURN(double pp_lo, calibrate_terms_detail::terms_tiny_step(pp, m_lo, threads));
  CKPT_ASSIGN_OR_RETURN(double pp_hi, calibrate_terms_detail::terms_tiny_step(pp, m_hi, threads));
  r.dp_micro_batch_s = std::max(0.0, (dp_hi - dp_lo) / static_cast<double>(m_hi - m_lo));
  r.pp_micro_batch_s = std::max(0.0, (pp_hi - pp_lo) / static_cast<double>(m_hi - m_lo));
  CKPT_ASSIGN_OR_RETURN(r.sync_bytes_per_s, calibrate_terms_detail::terms_sync_rate(w));
  return r;
}

}  // namespace ckpt::trainer
