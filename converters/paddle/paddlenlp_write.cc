#include "converters/paddle/paddlenlp_write.h"

#include <set>

#include "converters/model/llama_config.h"
#include "converters/paddle/relabeled_source.h"
#include "converters/profile/profile_view.h"

namespace ckpt {

namespace {

// config.json as PaddleNLP writes it: the source's own PaddleNLP config when it came from one
// (metadata "paddlenlp_config"), else the HF config; then the packing, dtype and no torch_dtype.
nlohmann::json paddle_config(const nlohmann::json& md, const LlamaConfig& cfg, const Profile& p, DType dt) {
  nlohmann::json c = md.contains("paddlenlp_config") && md["paddlenlp_config"].is_object() ? md["paddlenlp_config"] : cfg.to_json();
  c.erase("torch_dtype");
  c["architectures"] = {"LlamaForCausalLM"};
  c["model_type"] = "llama";
  c["fuse_attention_qkv"] = p.qkv != QkvPacking::kSeparate;
  c["fuse_attention_ffn"] = p.mlp != MlpPacking::kSeparate;
  if (!c.contains("tensor_parallel_output")) c["tensor_parallel_output"] = true;
  if (!c.contains("seq_length")) c["seq_length"] = cfg.max_position_embeddings;
  c.erase("dtype");
  if (dt == DType::kBF16) c["dtype"] = "bfloat16";
  if (dt == DType::kF16) c["dtype"] = "float16";
  return c;
}

}  // namespace

bool is_paddlenlp_profile(const std::string& name) { return name == "paddlenlp" || name == "paddlenlp-fused"; }

Result<PaddleNlpExport> paddlenlp_export_view(TensorSource& canon, const std::string& profile, std::optional<DType> dtype) {
  if (!is_paddlenlp_profile(profile))
    return Status::InvalidArgument("--profile " + profile + ": to-hf writes the hf profile and PaddleNLP's (paddlenlp, paddlenlp-fused)");
  const nlohmann::json& md = canon.metadata();
  if (!md.is_object() || !md.contains("model_config"))
    return Status::Error("NoModelConfig", "'" + canon.describe() + "' has no model config: cannot write PaddleNLP's tensors");
  CKPT_ASSIGN_OR_RETURN(LlamaConfig cfg, LlamaConfig::from_json(md["model_config"]));
  CKPT_ASSIGN_OR_RETURN(Profile p, builtin_profile(profile));
  if (dtype) p.dtype_weight = p.dtype_norm = p.dtype_embedding = *dtype;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<ProfileView> view, profile_view(canon, nullptr, p, cfg, 1));
  std::set<DType> dts;
  for (const TensorMeta& t : view->tensors())
    if (t.name.rfind("optimizer.", 0) != 0) dts.insert(t.dtype);
  if (dts.size() != 1 || !(dtype_is_float(*dts.begin())))
    return Status::Error("PaddleNlpMixedDtypes", "'" + canon.describe() + "' holds weights in " + std::to_string(dts.size()) +
                                                     " dtypes; PaddleNLP's config.json has one: give --dtype bf16|fp16|fp32");
  const DType dt = *dts.begin();
  PaddleNlpExport out;
  out.profile = p.name;
  out.config = paddle_config(md, cfg, p, dt);
  nlohmann::json vmd = view->metadata();
  vmd.erase("model_config");  // the export plan takes the tensors as they are
  out.view = std::make_unique<RelabeledSource>(std::move(view), DType::kBF16, DType::kU16, std::move(vmd));
  return out;
}

}  // namespace ckpt
