// The commands as functions of ckpt._ckpt, each taking its request as a dict of every option (the
// keyword arguments of the public wrappers in python/ckpt/commands.py, which give the signatures,
// defaults and docs) and returning the result as a dict with the fields of the CLI's --json.
// Each calls the library function its cli/cmd_*.cc calls, with the GIL released; errors raise the
// ckpt exceptions (py_errors.h); progress callbacks go through PyProgress (py_progress.h).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>

#include "converters/jobs/diff_job.h"
#include "converters/jobs/export_deepspeed_job.h"
#include "converters/jobs/export_jobs.h"
#include "converters/jobs/hf_jobs.h"
#include "converters/jobs/inspect_job.h"
#include "converters/jobs/job_flags.h"
#include "converters/jobs/reshard_job.h"
#include "converters/jobs/verify_job.h"
#include "converters/source/open_checkpoint.h"
#include "formats/base/byte_size.h"
#include "python/bindings.h"
#include "python/py_errors.h"
#include "python/py_json.h"
#include "python/py_progress.h"
#include "reshard/diff.h"
#include "trainer/plan/plan_job.h"
#include "trainer/plan/replan.h"

namespace ckpt::py {
// A named namespace (not an anonymous one): unity builds put this file beside checkpoint_bind.cc.
namespace commands_bind_detail {

// The options dict of one command: every key is read once; a missing key or one left unread is
// an error (the wrappers always pass all of them).
class CommandOptions {
 public:
  CommandOptions(const char* command, nb::dict d) : command_(command), d_(std::move(d)) {}
  template <class T>
  T get(const char* key) {
    nb::str k(key);
    if (!d_.contains(k)) throw nb::key_error((std::string(command_) + ": option '" + key + "' missing").c_str());
    nb::object v = d_[k];
    PyDict_DelItem(d_.ptr(), k.ptr());
    T out;
    if (!nb::try_cast(v, out))
      throw nb::type_error((std::string(command_) + ": option '" + key + "' has the wrong type").c_str());
    return out;
  }
  std::string str(const char* key) { return get<std::string>(key); }
  // The text of the options is parsed as the CLI parses its flags (converters/jobs/job_flags.h:
  // errors name the flag); parse() raises the first error after done().
  // tp, pp, dp, zero, pp_layers, ep, etp (--tp --pp --dp --zero --pp-layers --ep --etp; ep/etp 0: not given).
  Result<LayoutValues> layout() {
    const int tp = get<int>("tp"), pp = get<int>("pp"), dp = get<int>("dp"), zero = get<int>("zero");
    const int ep = get<int>("ep"), etp = get<int>("etp");
    CKPT_ASSIGN_OR_RETURN(LayoutValues v, LayoutValues::parse(tp, pp, dp, zero, str("pp_layers")));
    if (ep < 0 || ep > (1 << 16) || etp < 0 || etp > (1 << 16))
      return Status::InvalidArgument(std::string(command_) + ": ep and etp must be in 1..65536 (0: not given), got ep=" +
                                     std::to_string(ep) + " etp=" + std::to_string(etp));
    v.ep = ep;
    v.etp = etp;
    return v;
  }
  ProfileRequest profile() { return {str("profile"), str("profile_file"), get<bool>("saturate"), std::nullopt}; }
  // max_memory (--max-memory).
  Result<uint64_t> max_memory() { return parse_max_memory(str("max_memory")); }
  // compress, digest and io of an output store (--compress --digest --io).
  Result<store::StoreOptions> store() {
    const std::string compress = str("compress"), digest = str("digest");
    return parse_store_flags(compress, digest, str("io"));
  }
  template <class T>
  static T parse(Result<T> r) {
    if (!r.ok()) raise_status(r.status());
    return std::move(r).value();
  }
  void done() {
    if (nb::len(d_) != 0)
      throw nb::type_error((std::string(command_) + ": unknown option(s) " + nb::repr(d_.attr("keys")()).c_str()).c_str());
  }

 private:
  const char* command_;
  nb::dict d_;
};

// Runs `work` with the GIL released, then re-raises the progress callback's exception (after an
// error of the command itself, which wins) and returns the unwrapped value.
template <class Work>
auto run_released(PyProgress& progress, Work&& work) {
  auto r = [&] {
    nb::gil_scoped_release release;
    return work();
  }();
  if (!r.ok()) raise_status(r.status());
  progress.rethrow_if_failed();
  return std::move(r).value();
}

// A job of converters/jobs with the progress callback `cb` as its request's progress: runs it with
// the GIL released (run_released) and returns its outcome.
template <class Request, class Job>
auto run_job(nb::object cb, Request& req, Job&& job) {
  PyProgress progress(std::move(cb));
  req.progress = progress.fn();
  return run_released(progress, [&] { return job(req); });
}

nb::object py_verify(const std::string& path, nb::dict opts, nb::object progress_cb) {
  CommandOptions o("verify", std::move(opts));
  const int threads = o.get<int>("threads");
  const bool strict = o.get<bool>("strict");
  const std::string source_profile = o.str("source_profile");
  o.done();
  PyProgress progress(std::move(progress_cb));
  auto fn = progress.fn();
  VerifyOutcome r = run_released(progress, [&] { return verify_checkpoint(path, threads, fn, source_profile); });
  if (strict && !r.ok()) raise_status(r.failures.front().status);
  return json_to_py(r.to_json());
}

nb::object py_diff(const std::string& a, const std::string& b, nb::dict opts) {
  CommandOptions o("diff", std::move(opts));
  DiffOptions d;
  d.atol = o.get<double>("atol");
  d.rtol = o.get<double>("rtol");
  d.ignore_dtype = o.get<bool>("ignore_dtype");
  const bool no_verify = !o.get<bool>("verify_source");
  const std::string max_memory = o.str("max_memory");
  const std::string profile_a = o.str("source_profile_a"), profile_b = o.str("source_profile_b");
  o.done();
  PyProgress none{nb::none()};
  DiffOutcome rep = run_released(none, [&]() -> Result<DiffOutcome> {
    DiffRequest req{a, b, d, no_verify, profile_a, profile_b};
    CKPT_ASSIGN_OR_RETURN(req.options.max_memory, parse_byte_size(max_memory, "--max-memory"));
    return run_diff_job(req);
  });
  return json_to_py(rep.to_json());
}

// reshard and convert: one ReshardRequest (converters/jobs/reshard_job.h), as cli/cmd_reshard.cc.
nb::object py_reshard(const std::string& src, const std::string& dst, nb::dict opts, nb::object progress_cb) {
  CommandOptions o("reshard", std::move(opts));
  ReshardRequest req;
  req.src = src;
  req.source_profile = o.str("source_profile");
  req.dst = dst;
  const std::string layout_file = o.str("layout");
  auto layout = o.layout();
  req.profile = o.profile();
  auto store = o.store();
  req.threads = o.get<int>("threads");
  auto max_memory = o.max_memory();
  req.dry_run = o.get<bool>("dry_run");
  req.no_verify = !o.get<bool>("verify_source");
  const bool convert = o.get<bool>("convert");
  o.done();
  if (convert && !req.profile.given())
    raise_status(Status::InvalidArgument("convert: give profile=NAME or profile_file=FILE"));
  req.store = o.parse(std::move(store));
  req.max_memory = o.parse(std::move(max_memory));
  req.layout = o.parse(std::move(layout));
  req.layout_file = o.parse(parse_layout_file(layout_file));
  ReshardOutcome r = run_job(std::move(progress_cb), req, run_reshard_job);
  return json_to_py(r.to_json(dst, req.dry_run));
}

nb::object py_to_hf(const std::string& src, const std::string& out, nb::dict opts, nb::object progress_cb) {
  CommandOptions o("to_hf", std::move(opts));
  ToHfRequest req;
  req.src = src;
  req.source_profile = o.str("source_profile");
  req.out = out;
  const std::string dtype = o.str("dtype"), max_shard_size = o.str("max_shard_size");
  req.threads = o.get<int>("threads");
  auto max_memory = o.max_memory();
  const std::string io = o.str("io");
  req.fsync = o.get<bool>("fsync");
  req.no_verify = !o.get<bool>("verify_source");
  req.keep_quantized = o.get<bool>("keep_quantized");
  req.quantize = o.str("quantize");
  o.done();
  req.io = o.parse(parse_io_flag(io));
  req.dtype = o.parse(float_dtype_flag(dtype));
  req.max_shard_size = o.parse(parse_max_shard_size(max_shard_size));
  req.max_memory = o.parse(std::move(max_memory));
  ToHfOutcome r = run_job(std::move(progress_cb), req, run_to_hf_job);
  return json_to_py(r.to_json());
}

nb::object py_from_hf(const std::string& src, const std::string& dst, nb::dict opts, nb::object progress_cb) {
  CommandOptions o("from_hf", std::move(opts));
  FromHfRequest req;
  req.src = src;
  req.source_profile = o.str("source_profile");
  req.out = dst;
  const std::string dtype = o.str("dtype");
  auto layout = o.layout();
  req.profile = o.profile();
  auto store = o.store();
  req.threads = o.get<int>("threads");
  auto max_memory = o.max_memory();
  const bool fsync = o.get<bool>("fsync");
  o.done();
  req.dtype = o.parse(float_dtype_flag(dtype));
  req.store = o.parse(std::move(store));
  req.store.fsync = fsync;
  req.max_memory = o.parse(std::move(max_memory));
  req.layout = o.parse(std::move(layout));
  FromHfOutcome r = run_job(std::move(progress_cb), req, run_from_hf_job);
  return json_to_py(r.to_json());
}

nb::object py_inspect(const std::string& path, nb::dict opts) {
  CommandOptions o("inspect", std::move(opts));
  const std::string source_profile = o.str("source_profile");
  o.done();
  PyProgress none{nb::none()};
  InspectOutcome r = run_released(none, [&] { return run_inspect_job(InspectRequest{path, source_profile}); });
  return json_to_py(r.to_json());
}

nb::object py_export_dcp(const std::string& src, const std::string& out, nb::dict opts, nb::object progress_cb) {
  CommandOptions o("export_dcp", std::move(opts));
  ExportDcpRequest req;
  req.src = src;
  req.source_profile = o.str("source_profile");
  req.out = out;
  const std::string dtype = o.str("dtype");
  req.files = o.get<int>("files");
  req.source_chunks = o.get<bool>("source_chunks");
  req.threads = o.get<int>("threads");
  auto max_memory = o.max_memory();
  req.fsync = o.get<bool>("fsync");
  req.no_verify = !o.get<bool>("verify_source");
  o.done();
  req.dtype = o.parse(float_dtype_flag(dtype));
  req.max_memory = o.parse(std::move(max_memory));
  ExportDcpOutcome r = run_job(std::move(progress_cb), req, run_export_dcp_job);
  return json_to_py(r.to_json());
}

nb::object py_export_deepspeed(const std::string& src, const std::string& out, nb::dict opts, nb::object progress_cb) {
  CommandOptions o("export_deepspeed", std::move(opts));
  ExportDeepSpeedRequest req;
  req.src = src;
  req.out = out;
  req.weights_only = o.get<bool>("weights_only");
  req.int_step = o.get<bool>("int_step");
  if (const int64_t step = o.get<int64_t>("step"); step >= 0) req.step = step;  // -1: the source's
  req.threads = o.get<int>("threads");
  auto max_memory = o.max_memory();
  req.fsync = o.get<bool>("fsync");
  req.no_verify = !o.get<bool>("verify_source");
  o.done();
  req.max_memory = o.parse(std::move(max_memory));
  ExportDeepSpeedOutcome r = run_job(std::move(progress_cb), req, run_export_deepspeed_job);
  return json_to_py(r.to_json());
}

nb::object py_export_megatron(const std::string& src, const std::string& dst, nb::dict opts, nb::object progress_cb) {
  CommandOptions o("export_megatron", std::move(opts));
  ExportMegatronRequest req;
  req.src = src;
  req.source_profile = o.str("source_profile");
  req.dst = dst;
  const std::string format = o.str("format");
  req.tp = o.get<int>("tp");
  req.pp = o.get<int>("pp");
  req.pp_layers = o.get<std::vector<int>>("pp_layers");
  req.vpp = o.get<int>("vpp");
  req.vocab_divisor = o.get<int64_t>("vocab_divisor");
  const std::string dtype = o.str("dtype");
  req.local_norms = o.get<bool>("local_norms");
  req.iteration = o.get<int64_t>("iteration");
  req.dist_opt = o.get<bool>("dist_opt");
  req.dp = o.get<int64_t>("dp");
  if (const int64_t b = o.get<int64_t>("ddp_bucket_size"); b != 0) req.ddp_bucket_size = b;  // 0: one bucket
  req.dist_opt_sharding = o.str("dist_opt_sharding");
  req.megatron_version = o.str("megatron_version");
  req.no_verify = !o.get<bool>("verify_source");
  o.done();
  req.dtype = o.parse(float_dtype_flag(dtype));
  req.format = o.parse(megatron_format_flag(format));
  ExportMegatronOutcome r = run_job(std::move(progress_cb), req, run_export_megatron_job);
  return json_to_py(r.to_json());
}

// plan: the search (or one layout's evaluation) of trainer/plan/plan_job.h, as cli/cmd_plan.cc;
// `from_checkpoint`: the model, batch and sequence length of a trainer checkpoint (ckpt plan --from).
nb::object py_plan(const std::string& cluster, nb::dict opts) {
  CommandOptions o("plan", std::move(opts));
  trainer::PlanRequest req;
  req.cluster = cluster;
  req.model = o.str("model");
  req.evaluate = o.str("evaluate");
  req.calibration = o.str("calibration");
  req.global_batch = o.get<int64_t>("global_batch");
  req.seq_len = o.get<int64_t>("seq_len");
  req.top = o.get<int>("top");
  req.trainer_memory = o.get<bool>("trainer_memory");
  req.memory_model = o.str("memory_model");
  const std::string from = o.str("from_checkpoint");
  o.done();
  PyProgress none{nb::none()};
  nlohmann::json j = run_released(none, [&]() -> Result<nlohmann::json> {
    if (!req.evaluate.empty()) {
      CKPT_ASSIGN_OR_RETURN(auto ev, trainer::evaluate_plan(req));
      return ev.to_json();
    }
    if (from.empty()) {
      if (req.model.empty()) return Status::InvalidArgument("plan: give model=CONFIG (or from_checkpoint=PATH)");
      CKPT_ASSIGN_OR_RETURN(auto out, trainer::search_plan(req));
      return out.to_json();
    }
    CKPT_ASSIGN_OR_RETURN(auto src, trainer::replan_source(from));
    if (req.global_batch < 1) req.global_batch = src.global_batch;
    if (req.seq_len < 1) req.seq_len = src.seq_len;
    CKPT_ASSIGN_OR_RETURN(auto out, trainer::search_plan(req, &src.config));
    nlohmann::json r = out.to_json();
    r["from"] = {{"checkpoint", src.checkpoint}, {"step", src.step}, {"layout", src.layout.to_json()},
                 {"global_batch", req.global_batch}, {"seq_len", req.seq_len}};
    return r;
  });
  return json_to_py(j);
}

}  // namespace commands_bind_detail

void bind_commands(nb::module_& m) {
  using namespace commands_bind_detail;
  m.def("_verify", &py_verify, nb::arg("path"), nb::arg("opts"), nb::arg("progress").none());
  m.def("_diff", &py_diff, nb::arg("a"), nb::arg("b"), nb::arg("opts"));
  m.def("_reshard", &py_reshard, nb::arg("src"), nb::arg("dst"), nb::arg("opts"), nb::arg("progress").none());
  m.def("_to_hf", &py_to_hf, nb::arg("src"), nb::arg("out"), nb::arg("opts"), nb::arg("progress").none());
  m.def("_from_hf", &py_from_hf, nb::arg("src"), nb::arg("dst"), nb::arg("opts"), nb::arg("progress").none());
  m.def("_plan", &py_plan, nb::arg("cluster"), nb::arg("opts"));
  m.def("_inspect", &py_inspect, nb::arg("path"), nb::arg("opts"));
  m.def("_export_dcp", &py_export_dcp, nb::arg("src"), nb::arg("out"), nb::arg("opts"), nb::arg("progress").none());
  m.def("_export_deepspeed", &py_export_deepspeed, nb::arg("src"), nb::arg("out"), nb::arg("opts"), nb::arg("progress").none());
  m.def("_export_megatron", &py_export_megatron, nb::arg("src"), nb::arg("dst"), nb::arg("opts"),
        nb::arg("progress").none());
}

}  // namespace ckpt::py
