// ckpt from-hf HF_DIR OUT [--tp N --pp N [--pp-layers a,b,..] --dp N [--zero 0|1]]: imports a
// HuggingFace LLaMA directory (single-file or sharded safetensors + config.json, tokenizer files
// carried in the metadata) into a native store checkpoint, optionally laid out for a TP/PP/DP
// layout through the reshard planner (under mpirun the shard files are divided among processes).
// The work is converters/jobs/hf_jobs.h (run_from_hf_job; also python's ckpt.from_hf); this file parses
// the flags, draws the progress bar and prints the summary.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/jobs/hf_jobs.h"
#include "converters/jobs/job_flags.h"
#include "formats/store/store_options.h"
#include "reshard/dist/comm.h"

namespace ckpt::cli {
namespace {

struct FromHfArgs {
  std::string src, out, dtype, compress = "none", digest = "xxh3-128";
  LayoutFlags layout;
  StreamFlags stream;
  IoFlags io;
  bool no_fsync = false, json = false, no_verify = false, keep_quantized = false;
  std::string source_profile;
  ProfileRequest profile;
};

// The request of `a`: the flag text parsed once (errors name the flag).
Result<FromHfRequest> from_hf_request(const FromHfArgs& a) {
  FromHfRequest req;
  req.src = a.src;
  req.source_profile = a.source_profile;
  req.out = a.out;
  CKPT_ASSIGN_OR_RETURN(req.dtype, float_dtype_flag(a.dtype));
  CKPT_ASSIGN_OR_RETURN(req.store, parse_store_flags(a.compress, a.digest, a.io.io));
  req.store.fsync = !a.no_fsync;
  CKPT_ASSIGN_OR_RETURN(req.max_memory, a.stream.max_memory_bytes());
  CKPT_ASSIGN_OR_RETURN(req.layout, a.layout.values());
  req.threads = a.stream.threads;
  req.no_verify = a.no_verify;
  req.keep_quantized = a.keep_quantized;
  req.profile = a.profile;
  return req;
}

int run_from_hf(const FromHfArgs& a) {
  // Under mpirun the shard files of a laid-out (or profile) import are divided among processes.
  Comm* dist = (a.layout.given() || a.profile.given()) && Comm::launched_under_mpi() ? &Comm::world() : nullptr;
  const bool root = !dist || dist->rank() == 0;
  auto parsed = from_hf_request(a);
  if (!parsed.ok()) return error_exit(parsed.status(), root);
  FromHfRequest& req = *parsed;
  req.dist = dist;
  ProgressBar bar("from-hf", root && stderr_is_tty() && !a.json);
  req.progress = bar.callback();
  auto r = run_from_hf_job(req);
  bar.finish();
  if (!r.ok()) return error_exit(r.status(), root);
  if (!root) return 0;
  a.stream.print_memory_note(r->memory);
  if (a.json) {
    std::printf("%s\n", r->to_json().dump(2).c_str());
  } else if (!r->profile.empty()) {
    std::printf("imported %s into %s (%s, profile %s)\n%s", a.src.c_str(), a.out.c_str(), r->layout.c_str(), r->profile.c_str(),
                r->exactness.to_string().c_str());
  } else {
    std::printf("imported %zu tensors (%llu bytes) into %s (%s)", r->tensors, static_cast<unsigned long long>(r->bytes),
                a.out.c_str(), r->layout.c_str());
    if (!r->side_files.empty()) std::printf("; carried %zu tokenizer/side files", r->side_files.size());
    if (!r->skipped.empty()) std::printf("; skipped %zu (inv_freq / tied lm_head)", r->skipped.size());
    std::printf("\n");
  }
  return 0;
}

CommandAction setup_from_hf(CLI::App& sub) {
  auto a = std::make_shared<FromHfArgs>();
  sub.add_option("HF_DIR", a->src, "HuggingFace directory (model.safetensors[.index.json] + config.json) or a .safetensors file")
      ->required();
  sub.add_option("OUT", a->out, "native checkpoint directory to create (must not exist)")->required();
  sub.add_option("--dtype", a->dtype, "cast float weights to bf16|fp16|fp32 (default: keep)");
  sub.add_option("--compress", a->compress, "shard compression: none, zstd[:LEVEL], shuffle+zstd[:LEVEL] (default none)");
  sub.add_option("--digest", a->digest, store::kDigestFlagHelp);
  a->layout.add(sub, "ZeRO stage of the (absent) optimizer state: 0 or 1");
  a->stream.add(sub);
  a->io.add(sub);
  sub.add_flag("--no-fsync", a->no_fsync, "skip fsync (tests, benchmarks)");
  add_no_verify_flag(sub, a->no_verify);
  sub.add_flag("--keep-quantized", a->keep_quantized,
               "a quantized SRC (block/per-tensor FP8): store weights and scales as they are, split with their blocks "
               "(default: dequantized into --dtype, bf16 when none; docs/QUANTIZATION.md)");
  add_source_profile_flag(sub, a->source_profile);
  sub.add_flag("--json", a->json, "Print the result as JSON: out, layout, tensors, bytes, side_files, skipped, seconds (+ profile, exactness)");
  sub.add_option("--profile", a->profile.profile, "store in this built-in profile (docs/PROFILES.md); tokenizer files are not carried");
  sub.add_option("--profile-file", a->profile.profile_file, "store in the profile of this JSON file");
  sub.add_flag("--saturate", a->profile.saturate, "with --profile: clamp values beyond the profile dtype's range (reported)");
  sub.footer(
      "Tokenizer files (tokenizer*.json, tokenizer.model, special_tokens_map.json, generation_config.json, ...)\n"
      "found beside the weights are carried in the checkpoint's metadata (\"hf_files\", with SHA-256) and written\n"
      "back by `ckpt to-hf`, also after `ckpt reshard`.");
  return [a] { return run_from_hf(*a); };
}

CKPT_REGISTER_COMMAND("from-hf", "Import a HuggingFace LLaMA safetensors directory into a native checkpoint", setup_from_hf);

}  // namespace
}  // namespace ckpt::cli
