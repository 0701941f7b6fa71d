// ckpt from-hf HF_DIR OUT [--tp N --pp N [--pp-layers a,b,..] --dp N [--zero 0|1]]: imports a
// HuggingFace LLaMA directory (single-file or sharded safetensors + config.json, tokenizer files
// carried in the metadata) into a native store checkpoint, optionally laid out for a TP/PP/DP
// layout through the reshard planner (under mpirun the shard files are divided among processes).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "cli/progress.h"
#include "converters/hf_export.h"
#include "converters/hf_import.h"
#include "converters/open_checkpoint.h"
#include "converters/reshard_job.h"
#include "formats/open_source.h"
#include "formats/torch/dcp.h"
#include "formats/store/store_writer.h"
#include "reshard/comm.h"

namespace ckpt::cli {
namespace {

struct FromHfArgs {
  std::string src, out, dtype, compress = "none", digest = "xxh3-128";
  LayoutFlags layout;
  StreamFlags stream;
  IoFlags io;
  bool no_fsync = false;
  ProfileRequest profile;
};

// from-hf --profile: the reshard job from the HF directory (canonical names) into the profile's
// view, in one pass (converters/profile_view_job.h); the layout defaults to tp=pp=dp=1.
int run_from_hf_profile(const FromHfArgs& a) {
  ReshardRequest req;
  req.src = a.src;
  req.dst = a.out;
  req.layout = a.layout.given() ? a.layout.values() : LayoutValues{1, 1, 1, -1, ""};
  req.compress = a.compress;
  req.digest = a.digest;
  req.threads = a.stream.threads;
  req.max_memory = a.stream.max_memory;
  req.profile = a.profile;
  req.dist = Comm::launched_under_mpi() ? &Comm::world() : nullptr;
  const bool root = !req.dist || req.dist->rank() == 0;
  if (!a.dtype.empty())
    return error_exit(Status::InvalidArgument("--dtype and --profile exclude each other (the profile sets the dtypes)"), root);
  auto r = run_reshard_job(req);
  if (!r.ok()) return error_exit(r.status(), root);
  if (root)
    std::printf("imported %s into %s (%s, profile %s)\n%s", a.src.c_str(), a.out.c_str(), r->layout.to_string().c_str(),
                r->profile.c_str(), r->exactness.to_string().c_str());
  return 0;
}

int run_from_hf(const FromHfArgs& a) {
  if (a.profile.given()) return run_from_hf_profile(a);
  const bool layout_given = a.layout.given();
  Comm* dist = layout_given && Comm::launched_under_mpi() ? &Comm::world() : nullptr;
  const bool root = !dist || dist->rank() == 0;
  auto fail = [&](const Status& st) { return error_exit(st, root); };

  HfImportOptions opts;
  opts.threads = a.stream.threads;
  if (auto dt = float_dtype_flag(a.dtype); dt.ok()) opts.dtype = *dt; else return fail(dt.take_status());
  auto so = store::parse_compress_spec(a.compress, "--compress");
  if (!so.ok()) return fail(so.take_status());
  so = store::parse_digest_spec(a.digest, "--digest", *so);
  if (!so.ok()) return fail(so.take_status());
  so->fsync = !a.no_fsync;
  so->hash_threads = a.stream.threads;
  if (auto io = a.io.mode(); io.ok()) so->io = *io; else return fail(io.take_status());
  // HF names in: a HuggingFace directory or file, or a DCP directory of an HF model's state_dict.
  auto kind = detect_source(a.src);
  const bool dcp = torch::is_dcp_dir(a.src);
  if (kind != SourceKind::kHfDir && kind != SourceKind::kSafetensorsFile && !dcp)
    return fail(Status::InvalidArgument("'" + a.src + "' is not a HuggingFace directory (no model.safetensors[.index.json]) "
                                        "nor a DCP directory (.metadata)"));
  {
    auto dir = kind == SourceKind::kSafetensorsFile ? std::filesystem::path(a.src).parent_path() : std::filesystem::path(a.src);
    opts.side_files_dir = dir.empty() ? "." : dir.string();
  }
  auto src = open_checkpoint(a.src);
  if (!src.ok()) return fail(src.take_status());
  auto plan = plan_hf_import(**src, opts);
  if (!plan.ok()) return fail(plan.take_status().with_file(a.src));
  {
    size_t max_src = 1, min_out = 8;
    for (const auto& p : (*src)->pieces()) max_src = std::max(max_src, dtype_size(p.dtype));
    for (const auto& p : plan->pieces) min_out = std::min(min_out, dtype_size(p.dtype));
    // Keep 48 MiB of the budget for the store writer (HDF5, hashing), as `ckpt reshard` does.
    auto chunk = a.stream.chunk_bytes(max_src, min_out, 48ull << 20);
    if (!chunk.ok()) return fail(chunk.take_status());
    opts.max_chunk_bytes = *chunk;
  }

  ProgressBar bar("from-hf", root && stderr_is_tty());
  opts.progress = bar.callback();
  Status st;
  std::string layout_text = "tp=1 pp=1 dp=1";
  if (layout_given) {
    auto layout = a.layout.make(plan->config.num_hidden_layers);
    if (!layout.ok()) return fail(layout.take_status());
    layout_text = layout->to_string();
    StoreExecOptions eo;
    eo.exec.threads = a.stream.threads;
    eo.exec.max_chunk_bytes = opts.max_chunk_bytes;
    eo.store = *so;
    eo.exec.progress = opts.progress;
    st = run_hf_import_to_layout(**src, *plan, *layout, a.out, eo, dist);
  } else {
    store::StoreWriter sink(a.out, *so);
    st = run_hf_import(**src, sink, *plan, opts);
  }
  bar.finish();
  if (!st.ok()) return fail(st);
  if (root) {
    std::printf("imported %zu tensors (%llu bytes) into %s (%s)", plan->tensors.size(),
                static_cast<unsigned long long>(plan->total_bytes), a.out.c_str(), layout_text.c_str());
    if (plan->metadata.contains("hf_files")) std::printf("; carried %zu tokenizer/side files", plan->metadata["hf_files"].size());
    if (!plan->skipped.empty()) std::printf("; skipped %zu (inv_freq / tied lm_head)", plan->skipped.size());
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
