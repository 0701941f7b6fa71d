#include "converters/source/open_checkpoint.h"

#include <filesystem>

#include "converters/deepspeed/deepspeed_source.h"
#include "converters/deepspeed/ds_universal_source.h"
#include "converters/hf/hf_moe_names.h"
#include "converters/megatron/dist/megatron_dist_source.h"
#include "converters/megatron/megatron_dir_source.h"
#include "converters/megatron/megatron_torch_source.h"
#include "converters/model/llama_config.h"
#include "converters/paddle/paddlenlp_dir.h"
#include "converters/profile/profile_view.h"
#include "formats/safetensors/st_dir.h"
#include "formats/store/store_reader.h"
#include "formats/torch/dcp/dcp.h"

namespace ckpt {

namespace fs = std::filesystem;

bool is_native_store(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) &&
         (fs::exists(fs::path(path) / "manifest.json", ec) || fs::exists(fs::path(path) / "latest", ec));
}

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && !is_native_store(path) &&
         (fs::exists(fs::path(path) / safetensors::kIndexFileName, ec) ||
          fs::exists(fs::path(path) / safetensors::kSingleFileName, ec));
}

bool is_safetensors_file(const std::string& path) {
  std::error_code ec;
  constexpr std::string_view kExt = ".safetensors";
  return fs::is_regular_file(path, ec) && path.size() >= kExt.size() &&
         path.compare(path.size() - kExt.size(), kExt.size(), kExt) == 0;
}

namespace {

bool is_dcp(const std::string& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && torch::is_dcp_dir(p);
}

// An MoE family's HF files open in the canonical view (stacked experts, converters/hf/hf_moe_names.h).
Result<std::unique_ptr<TensorSource>> open_hf_dir(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(auto s, safetensors::HfDirSource::open(path));
  return hf_moe_canonical_source(std::unique_ptr<TensorSource>(std::move(s)));
}

Result<std::unique_ptr<TensorSource>> open_safetensors_file(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(auto s, safetensors::HfDirSource::open_file(path));
  return hf_moe_canonical_source(std::unique_ptr<TensorSource>(std::move(s)));
}

Result<std::unique_ptr<TensorSource>> open_store_as_stored(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(auto s, store::StoreReader::open(path));
  return std::unique_ptr<TensorSource>(std::move(s));
}

// A native store; one stored in a profile other than "reference" (its manifest's "profile" /
// "profile_spec") opens as its canonical view (converters/profile/profile_view.h).
Result<std::unique_ptr<TensorSource>> open_native_store(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> src, open_store_as_stored(path));
  const nlohmann::json& md = src->metadata();
  const bool other = md.contains("profile_spec") ||
                     (md.contains("profile") && md["profile"].is_string() && md["profile"] != "reference");
  if (!other) return src;
  CKPT_ASSIGN_OR_RETURN(Profile p, profile_of_metadata(md, path));
  TensorSource& ref = *src;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<CanonicalView> view, canonical_view(ref, std::move(src), p));
  return std::unique_ptr<TensorSource>(std::move(view));
}

// One row per kind, most specific first (see open_checkpoint.h).
constexpr CheckpointKind kCheckpointKinds[] = {
    {"megatron-safetensors", "a Megatron-layout directory written by export-megatron (megatron_args.json, mp_rank_XX[_YYY]/)", is_megatron_dir,
     open_megatron_dir},
    // Megatron-Core torch_dist and Megatron-LM legacy per-rank torch files, above "dcp" (a
    // torch_dist directory is also a DCP directory); torch_dist first: both kinds of run dir hold
    // latest_checkpointed_iteration.txt, and only torch_dist's detect looks into the iteration.
    {"megatron-torch-dist",
     "a Megatron-Core torch_dist directory (metadata.json, .metadata, common.pt), or its run dir (latest_checkpointed_iteration.txt)",
     is_megatron_dist_dir, open_megatron_dist},
    {"megatron-torch", "a Megatron-LM legacy checkpoint (latest_checkpointed_iteration.txt, iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt)",
     is_megatron_torch_dir, open_megatron_torch_dir},
    {"dcp", "a PyTorch Distributed Checkpoint directory (.metadata, __R_K.distcp)", is_dcp, torch::open_dcp_dir},
    // DeepSpeed universal: above "deepspeed-zero" (its step directory also holds mp_rank_00_model_states.pt).
    {"deepspeed-universal",
     "a DeepSpeed universal checkpoint (latest_universal + a step dir with zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt, "
     "zero/optimizer_state.pt and a model states file), or the step dir",
     is_deepspeed_universal_dir, open_deepspeed_universal},
    // DeepSpeed ZeRO: above "native-store", whose detect also takes a directory with `latest`.
    {"deepspeed-zero",
     "a DeepSpeed ZeRO 1/2/3 checkpoint (latest + global_stepN/ with *zero_pp_rank_R_mp_rank_00_optim_states.pt and *model_states.pt), or the step "
     "dir",
     is_deepspeed_dir, open_deepspeed_dir},
    {"native-store", "a native checkpoint or run directory (manifest.json, or 'latest')", is_native_store, open_native_store},
    // PaddleNLP's save_pretrained: above "hf-dir" (its model.safetensors looks like HF's; the
    // config's PaddleNLP keys tell them apart).
    {"paddlenlp",
     "a PaddleNLP directory (model_state.pdparams[.index.json], or model.safetensors[.index.json] with a config.json holding fuse_attention_qkv, "
     "tensor_parallel_output, ...)",
     is_paddlenlp_dir, open_paddlenlp_dir},
    {"hf-dir", "a HuggingFace directory (model.safetensors or model.safetensors.index.json)", is_hf_dir, open_hf_dir},
    {"safetensors", "a .safetensors file", is_safetensors_file, open_safetensors_file},
};

// A model config beyond ckpt's bounds (converters/model/llama_config.h) is refused by every command,
// verify and inspect included, before anything is sized by it; other config errors are left to
// the commands that need a valid config (reshard, to-hf, train).
Result<std::unique_ptr<TensorSource>> bounded(std::unique_ptr<TensorSource> src) {
  const nlohmann::json& md = src->metadata();
  if (md.is_object() && md.contains("model_config") && md["model_config"].is_object()) {
    auto c = LlamaConfig::from_json(md["model_config"]);
    if (!c.ok() && c.status().code() == "ConfigTooLarge")
      return c.take_status().with_context("model_config of '" + src->describe() + "'");
  }
  return src;
}

}  // namespace

std::span<const CheckpointKind> checkpoint_kinds() { return kCheckpointKinds; }

const CheckpointKind* detect_checkpoint(const std::string& path) {
  for (const auto& k : kCheckpointKinds)
    if (k.detect(path)) return &k;
  return nullptr;
}

Result<std::unique_ptr<TensorSource>> open_checkpoint(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::NotFound("no such file or directory '" + path + "'");
  if (const CheckpointKind* k = detect_checkpoint(path)) {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> src, k->open(path));
    return bounded(std::move(src));
  }
  std::string kinds;
  for (const auto& k : kCheckpointKinds) kinds += std::string("\n  ") + k.name + ": " + k.looks_like;
  return Status::Unsupported("'" + path + "' is no checkpoint kind ckpt reads; it accepts:" + kinds);
}

Result<std::unique_ptr<TensorSource>> open_checkpoint_as(const CheckpointKind& kind, const std::string& path, bool as_stored) {
  const bool stored = as_stored && kind.detect == &is_native_store;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> src, stored ? open_store_as_stored(path) : kind.open(path));
  return bounded(std::move(src));
}

Result<std::unique_ptr<TensorSource>> open_checkpoint_in_profile(const std::string& path, const std::string& profile) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Status::NotFound("no such file or directory '" + path + "'");
  CKPT_ASSIGN_OR_RETURN(Profile p, load_profile(profile));
  const CheckpointKind* k = detect_checkpoint(path);
  if (k != nullptr && k->detect == &is_native_store) {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> src, open_store_as_stored(path));
    const nlohmann::json& md = src->metadata();
    const bool named = md.contains("profile") && md["profile"].is_string();
    const std::string stored = named ? md["profile"].get<std::string>() : "reference";
    if (stored != p.name)
      return Status::Error("SourceProfileUnsupported", "--source-profile " + p.name + ": '" + path +
                                                           "' is a native store that records its profile ('" + stored + "'); name none, or that one");
    return open_checkpoint(path);
  }
  const bool takes =
      k != nullptr && (k->detect == &is_paddlenlp_dir || k->detect == &is_hf_dir || k->detect == &is_safetensors_file);
  if (!takes) {
    const std::string what =
        k ? std::string("a ") + k->name + " checkpoint, whose files record their own conventions" : "no checkpoint kind ckpt reads";
    return Status::Error("SourceProfileUnsupported",
                         "--source-profile " + p.name + ": '" + path + "' is " + what +
                             "; --source-profile applies to HF / PaddleNLP directories and .safetensors / .pdparams files");
  }
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> src, open_in_profile(path, p));
  return bounded(std::move(src));
}

Result<std::unique_ptr<TensorSource>> open_checkpoint_as_stored(const std::string& path) {
  const CheckpointKind* k = detect_checkpoint(path);  // a row above native-store may take a dir with `latest`
  if (k == nullptr || k->detect != &is_native_store) return open_checkpoint(path);
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> src, open_store_as_stored(path));
  return bounded(std::move(src));
}

}  // namespace ckpt
