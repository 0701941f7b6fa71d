#include "converters/paddle/paddlenlp_dir.h"

#include <filesystem>

#include "converters/paddle/relabeled_source.h"
#include "converters/profile/profile_view.h"
#include "formats/base/json_read.h"
#include "formats/paddle/pdparams.h"
#include "formats/safetensors/st_dir.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

// Keys only PaddleNLP's LlamaConfig writes (PaddleNLP 2.8.1 save_pretrained; HF's never has them).
constexpr const char* kPaddleOnlyKeys[] = {"fuse_attention_qkv", "fuse_attention_ffn", "tensor_parallel_output", "paddlenlp_version"};

bool exists_in(const fs::path& dir, const char* name) {
  std::error_code ec;
  return fs::exists(dir / name, ec);
}

std::string config_dir_of(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return path;
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

Result<nlohmann::json> read_config(const std::string& path) {
  const fs::path cfg = fs::path(config_dir_of(path)) / "config.json";
  std::error_code ec;
  if (!fs::exists(cfg, ec))
    return Status::Error("NoModelConfig", "'" + path + "' has no config.json beside its tensors: cannot map them");
  return read_json_file(cfg.string(), kConfigJsonLimits, "model config");
}

bool is_pdparams_path(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return exists_in(path, paddle::kPdparamsFileName) || exists_in(path, paddle::kPdparamsIndexName);
  return path.ends_with(".pdparams") && fs::is_regular_file(path, ec);
}

// The tensors of `path` as stored: a PdparamsSource or an HfDirSource.
Result<std::unique_ptr<TensorSource>> open_raw(const std::string& path) {
  std::error_code ec;
  if (is_pdparams_path(path)) {
    CKPT_ASSIGN_OR_RETURN(auto s, paddle::PdparamsSource::open(path));
    return std::unique_ptr<TensorSource>(std::move(s));
  }
  if (fs::is_directory(path, ec)) {
    CKPT_ASSIGN_OR_RETURN(auto s, safetensors::HfDirSource::open(path));
    return std::unique_ptr<TensorSource>(std::move(s));
  }
  CKPT_ASSIGN_OR_RETURN(auto s, safetensors::HfDirSource::open_file(path));
  return std::unique_ptr<TensorSource>(std::move(s));
}

std::string files_of(const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return fs::path(path).filename().string();
  for (const char* f : {paddle::kPdparamsIndexName, paddle::kPdparamsFileName, safetensors::kIndexFileName, safetensors::kSingleFileName})
    if (exists_in(path, f)) return f;
  return "";
}

// The raw tensors relabeled (U16 -> BF16 when the config says bfloat16) under the metadata a
// canonical view needs, then that view in `p`.
Result<std::unique_ptr<TensorSource>> open_raw_in_profile(const std::string& path, std::unique_ptr<TensorSource> raw,
                                                          const Profile& p, nlohmann::json detected) {
  CKPT_ASSIGN_OR_RETURN(nlohmann::json paddle_cfg, read_config(path));
  if (!paddle_cfg.is_object()) return Status::Error("PaddleNlpConfig", "config.json of '" + path + "' is not an object");
  const bool bf16 = paddle_cfg.contains("dtype") && paddle_cfg["dtype"] == "bfloat16";
  nlohmann::json md = raw->metadata().is_object() ? raw->metadata() : nlohmann::json::object();
  auto hf = hf_config_of_paddle(paddle_cfg);
  if (!hf.ok()) return hf.take_status().with_file(path);
  md["model_config"] = *hf;
  md["paddlenlp_config"] = paddle_cfg;
  auto rel = std::make_unique<RelabeledSource>(std::move(raw), DType::kU16, bf16 ? DType::kBF16 : DType::kU16, nlohmann::json::object());
  detected["profile"] = p.name;
  detected["dtype"] = rel->relabeled() ? "bfloat16 (stored as U16, config dtype bfloat16)"
                                       : (paddle_cfg.contains("dtype") && paddle_cfg["dtype"].is_string() ? paddle_cfg["dtype"].get<std::string>()
                                                                                                          : "float32 (no dtype in config.json)");
  md["source_detected"] = detected;
  auto with_md = std::make_unique<RelabeledSource>(std::move(rel), DType::kU16, DType::kU16, std::move(md));
  TensorSource& ref = *with_md;
  auto view = canonical_view(ref, std::move(with_md), p);
  if (!view.ok()) return view.take_status().with_context("read in profile '" + p.name + "'");
  return std::unique_ptr<TensorSource>(std::move(*view));
}

}  // namespace

bool is_paddlenlp_dir(const std::string& path) {
  std::error_code ec;
  if (path.ends_with(".pdparams") && fs::is_regular_file(path, ec)) return true;
  if (!fs::is_directory(path, ec) || exists_in(path, "manifest.json")) return false;
  if (exists_in(path, paddle::kPdparamsFileName) || exists_in(path, paddle::kPdparamsIndexName)) return true;
  if (!exists_in(path, safetensors::kSingleFileName) && !exists_in(path, safetensors::kIndexFileName)) return false;
  auto cfg = read_json_file((fs::path(path) / "config.json").string(), kConfigJsonLimits, "model config");
  if (!cfg.ok() || !cfg->is_object()) return false;
  for (const char* k : kPaddleOnlyKeys)
    if (cfg->contains(k)) return true;
  return false;
}

Result<nlohmann::json> hf_config_of_paddle(const nlohmann::json& pc) {
  auto refuse = [](const std::string& why) { return Status::Error("PaddleNlpConfig", "PaddleNLP config.json: " + why); };
  if (pc.contains("alibi") && pc["alibi"].is_boolean() && pc["alibi"].get<bool>()) return refuse("alibi true (transformers' LLaMA has rope only)");
  if (pc.contains("rope_scaling_type") && !pc["rope_scaling_type"].is_null())
    return refuse("rope_scaling_type " + pc["rope_scaling_type"].dump() + " (not mapped)");
  static const char* kHfKeys[] = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                                  "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
                                  "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
                                  "attention_bias", "mlp_bias", "hidden_act"};
  nlohmann::json hf = nlohmann::json::object();
  for (const char* k : kHfKeys)
    if (pc.contains(k)) hf[k] = pc[k];
  hf["architectures"] = {"LlamaForCausalLM"};
  hf["model_type"] = "llama";
  if (!hf.contains("hidden_act")) hf["hidden_act"] = "silu";
  const nlohmann::json dt = pc.contains("dtype") ? pc["dtype"] : nlohmann::json("float32");
  if (!dt.is_string() || (dt != "float32" && dt != "bfloat16" && dt != "float16"))
    return refuse("dtype " + dt.dump() + " (expected float32, bfloat16 or float16)");
  hf["torch_dtype"] = dt;
  return hf;
}

Result<Profile> paddlenlp_profile_for(bool fused_qkv, bool fused_ffn) {
  if (fused_qkv == fused_ffn) return builtin_profile(fused_qkv ? "paddlenlp-fused" : "paddlenlp");
  // One packing fused: the unfused profile with that packing (and its names) taken from the fused one.
  CKPT_ASSIGN_OR_RETURN(Profile plain, builtin_profile("paddlenlp"));
  CKPT_ASSIGN_OR_RETURN(Profile fused, builtin_profile("paddlenlp-fused"));
  nlohmann::json j = plain.to_json();
  const nlohmann::json f = fused.to_json();
  const std::vector<std::string> drop = fused_qkv ? std::vector<std::string>{"q", "k", "v", "q_bias", "k_bias", "v_bias"}
                                                  : std::vector<std::string>{"gate", "up", "gate_bias", "up_bias"};
  for (const std::string& k : drop) j["names"].erase(k);
  for (const char* k : fused_qkv ? std::vector<const char*>{"qkv", "qkv_bias"} : std::vector<const char*>{"gate_up", "gate_up_bias"})
    if (f["names"].contains(k)) j["names"][k] = f["names"][k];
  const char* packing = fused_qkv ? "qkv_packing" : "mlp_packing";
  j[packing] = f[packing];
  j["name"] = fused_qkv ? "paddlenlp-fused-qkv" : "paddlenlp-fused-ffn";
  j["description"] = std::string("PaddleNLP LLaMA with only ") + (fused_qkv ? "fuse_attention_qkv" : "fuse_attention_ffn") + " on";
  return profile_from_json(j, "PaddleNLP names of the source");
}

Result<std::unique_ptr<TensorSource>> open_paddlenlp_dir(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> raw, open_raw(path));
  bool qkv = false, ffn = false;
  for (const TensorMeta& t : raw->tensors()) {
    qkv = qkv || t.name.find(".self_attn.qkv_proj.") != std::string::npos;
    ffn = ffn || t.name.find(".mlp.gate_up_fused_proj.") != std::string::npos;
  }
  CKPT_ASSIGN_OR_RETURN(Profile p, paddlenlp_profile_for(qkv, ffn));
  const std::string files = files_of(path);
  nlohmann::json detected = {{"kind", "paddlenlp"},
                             {"files", files},
                             {"why", is_pdparams_path(path) ? files + " (paddle.save of a state dict)"
                                                            : files + " beside a config.json with PaddleNLP's keys"}};
  return open_raw_in_profile(path, std::move(raw), p, std::move(detected));
}

Result<std::unique_ptr<TensorSource>> open_in_profile(const std::string& path, const Profile& p) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<TensorSource> raw, open_raw(path));
  nlohmann::json detected = {{"kind", is_paddlenlp_dir(path) ? "paddlenlp" : "safetensors"}, {"files", files_of(path)},
                             {"why", "--source-profile " + p.name}};
  return open_raw_in_profile(path, std::move(raw), p, std::move(detected));
}

}  // namespace ckpt
