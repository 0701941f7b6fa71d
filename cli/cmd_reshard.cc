// ckpt reshard SRC DST: re-splits a native-store checkpoint for another TP/PP/DP(ZeRO) layout,
// and with --profile converts it to another profile in the same pass (ckpt convert, cli/
// cmd_convert.cc, is the same command with the profile required and the layout optional).
// The work is converters/jobs/reshard_job.h (run_reshard_job); this file parses the flags, draws the
// progress bar and prints the plan or the result (and the exactness report of a conversion).
// Under mpirun the shard files are divided among the processes and rank 0 prints.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/cmd_reshard.h"
#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/jobs/job_flags.h"
#include "converters/jobs/reshard_job.h"
#include "formats/store/store_options.h"
#include "reshard/dist/comm.h"

namespace ckpt::cli {
namespace {

struct ReshardArgs {
  std::string src, dst, layout_file, compress = "none", digest = "xxh3-128";
  LayoutFlags layout;
  StreamFlags stream;
  IoFlags io;
  bool dry_run = false, json = false, no_verify = false, requantize = false;
  std::string source_profile, dtype;
  ProfileRequest profile;
  bool convert = false;  // ckpt convert: a profile is required, the layout flags optional
};

// The plan of a --dry-run on stdout: JSON (--json) or its text summary.
void print_dry_run(const ReshardArgs& a, const ReshardOutcome& r) {
  if (a.json) {
    std::printf("%s\n", r.to_json(a.dst, true).dump(2).c_str());
  } else {
    std::printf("%s", r.plan.to_string().c_str());
  }
}

// The summary of a finished reshard on stdout: JSON (--json) or one line.
void print_result(const ReshardArgs& a, const ReshardOutcome& r) {
  if (a.json) {
    std::printf("%s\n", r.to_json(a.dst, false).dump(2).c_str());
  } else {
    if (!r.profile.empty())
      std::printf("profile %s -> %s\n%s", r.from_profile.c_str(), r.profile.c_str(), r.exactness.to_string().c_str());
    std::printf("resharded %s -> %s (%s): %zu pieces in %zu files, %.2f GiB written in %.2f s\n",
                r.src_description.c_str(), a.dst.c_str(), r.layout.to_string().c_str(), r.plan.pieces.size(),
                r.plan.files.size(), r.plan.bytes_written / 1073741824.0, r.seconds);
  }
}

// The request of `a`: the flag text parsed once (errors name the flag).
Result<ReshardRequest> reshard_request(const ReshardArgs& a) {
  ReshardRequest req;
  req.src = a.src;
  req.source_profile = a.source_profile;
  req.dst = a.dst;
  CKPT_ASSIGN_OR_RETURN(req.store, parse_store_flags(a.compress, a.digest, a.io.io));
  CKPT_ASSIGN_OR_RETURN(req.max_memory, a.stream.max_memory_bytes());
  CKPT_ASSIGN_OR_RETURN(req.layout, a.layout.values());
  CKPT_ASSIGN_OR_RETURN(req.layout_file, parse_layout_file(a.layout_file));
  req.threads = a.stream.threads;
  req.dry_run = a.dry_run;
  req.no_verify = a.no_verify;
  req.requantize = a.requantize;
  req.profile = a.profile;
  CKPT_ASSIGN_OR_RETURN(req.profile.dtype, float_dtype_flag(a.dtype));
  if (req.profile.dtype && !req.profile.given())
    return Status::InvalidArgument("--dtype needs --profile or --profile-file (it sets that profile's weight dtypes)");
  return req;
}

int run_reshard(const ReshardArgs& a) {
  if (a.convert && !a.profile.given())
    return error_exit(Status::InvalidArgument("convert: give --profile NAME or --profile-file FILE"), true);
  Comm* dist = Comm::launched_under_mpi() ? &Comm::world() : nullptr;
  const bool root = !dist || dist->rank() == 0;
  auto parsed = reshard_request(a);
  if (!parsed.ok()) return error_exit(parsed.status(), root);
  ReshardRequest& req = *parsed;
  req.dist = dist;
  ProgressBar bar("reshard", root && stderr_is_tty() && !a.json && !a.dry_run);
  req.progress = bar.callback();
  auto r = run_reshard_job(req);
  bar.finish();
  if (!r.ok()) return error_exit(r.status(), root);
  if (!root) return 0;
  a.stream.print_memory_note(r->memory);
  if (a.dry_run)
    print_dry_run(a, *r);
  else
    print_result(a, *r);
  return 0;
}

}  // namespace

CommandAction setup_reshard_command(CLI::App& sub, bool convert) {
  auto a = std::make_shared<ReshardArgs>();
  a->convert = convert;
  sub.add_option("SRC", a->src,
                 "Source checkpoint: native store dir, run dir (follows `latest`), Megatron-layout dir (export-megatron), HF dir, DCP dir or "
                 "DeepSpeed ZeRO dir "
                 "with a model config")
      ->required();
  sub.add_option("DST", a->dst, "New checkpoint dir (must not exist)")->required();
  sub.add_option("--layout", a->layout_file,
                 "Target layout JSON file: tp, pp, dp, zero, layers_per_stage, ...; or pipelines of stages with their own tp, "
                 "ep, etp (docs/RESHARD.md, docs/MOE.md)");
  a->layout.add(sub, "ZeRO stage of the optimizer state: 0 (replicated) or 1 (flat shards over DP)");
  a->stream.add(sub);
  a->io.add(sub);
  sub.add_flag("--dry-run", a->dry_run, "Print the plan (pieces, files, bytes) without writing");
  sub.add_option("--compress", a->compress, "Shard compression: none, zstd[:LEVEL], shuffle+zstd[:LEVEL]");
  sub.add_option("--digest", a->digest, store::kDigestFlagHelp);
  sub.add_flag("--json", a->json, "Print the plan / result as JSON");
  add_no_verify_flag(sub, a->no_verify);
  sub.add_flag("--requantize", a->requantize,
               "a block-quantized SRC split inside its blocks by the target layout: re-quantize with the largest block the "
               "splits allow (the exactness report counts the changed elements; default: QuantSplitBlock)");
  add_source_profile_flag(sub, a->source_profile);
  sub.add_option("--dtype", a->dtype, "with --profile: store weights, norms and embeddings as bf16|fp16|fp32 (default: the profile's; "
                                      "paddlenlp and hf keep SRC's)");
  sub.add_option("--profile", a->profile.profile,
                 "Convert to this built-in profile in the same pass (hf, megatron-mcore, megatron-legacy, paddlenlp, "
                 "libai, reference; docs/PROFILES.md)");
  sub.add_option("--profile-file", a->profile.profile_file, "Convert to the profile in this JSON file");
  sub.add_flag("--saturate", a->profile.saturate,
               "Clamp values beyond the target dtype's range to its max finite (reported) instead of failing");
  sub.footer(
      "Output is written to DST.partial and renamed when complete. Under `mpirun -np K` the shard files are\n"
      "divided among the K processes; the result is byte-identical to a single process.");
  return [a] { return run_reshard(*a); };
}

namespace {
CommandAction setup_reshard(CLI::App& sub) { return setup_reshard_command(sub, false); }
}  // namespace

CKPT_REGISTER_COMMAND("reshard", "Re-split a checkpoint for another TP/PP/DP(ZeRO) layout", setup_reshard);

}  // namespace ckpt::cli
