// Vendor / framework conventions as data (docs/PROFILES.md). A Profile says how one stack
// stores the LLaMA family's tensors: stored dtype per tensor class, vocab padding, QKV and MLP
// packing, weight orientation, tensor names and config key names. Profiles are JSON files:
// profiles/<name>.json in the repository (built in), or a user's file (--profile-file).
//
// The model behind every profile is the canonical view (HF names, [out, in], no padding,
// converters/model/llama_config.h). A profile's global tensors are described, for a model config and a
// tensor-parallel size, as concatenations along dim 0 of boxes of canonical tensors and rows of
// zeros (ProfileTensor, the generalisation of converters/megatron/megatron_segments.h), optionally stored
// transposed. Converting A -> B is box arithmetic over those maps: A's pieces are mapped to
// canonical boxes, canonical boxes to B's tensors (converters/profile/profile_view.h), and the existing
// planner and executor do the layout change in the same pass.
//
// Global views that depend on tp: packings "per TP rank" (Megatron's fc1 [gate_r; up_r],
// PaddleNLP's gate_up_fused_proj [gate_r | up_r]) define the global tensor as the concatenation of the
// rank tensors of the layout's tp, so every TP rank holds one contiguous box of it; the store's
// manifest records layout and profile together, and the same tensor name at another tp is
// another row order (a conversion handles it like any other profile change).
//
// Optimizer tensors follow their parameter: "optimizer.<kind>.<profile name>", same shape and
// packing as the parameter, dtype from the "optimizer" class.
//
// The profile file (every rule a named code, formats/base/error_codes.cc; docs/PROFILES.md):
//   {
//     "name": "megatron-mcore",                    required, [a-z0-9._-]+ (ProfileBadValue)
//     "description": "one line",                   optional string
//     "dtypes": {"weight": "BF16", "norm": "BF16", "embedding": "BF16", "optimizer": "F32"},
//                                                  required, all four; a float dtype name
//                                                  (safetensors spelling or bf16/fp16/fp32/fp64)
//                                                  or "keep" (the source's dtype)
//     "vocab_padding": {"multiple": 128, "scales_with_tp": true},
//                                                  optional (default 1, false); multiple in
//                                                  [1, 2^20]
//     "qkv_packing": "megatron-groups",            separate | megatron-groups | libai-heads |
//                                                  fused-whole | fused-per-tp
//     "mlp_packing": "fused-per-tp",               separate | fused-per-tp | fused-whole
//     "orientation": "out-in",                     out-in | in-out
//     "names": {"embed": "embedding.word_embeddings.weight",
//               "qkv": "decoder.layers.{i}.self_attention.linear_qkv.weight", ...},
//                                                  kind -> pattern; layer kinds hold "{i}" once,
//                                                  the others (embed, final_norm, lm_head) none
//     "config_keys": {"num_hidden_layers": "num_layers", ...},   optional, HF key -> stack key
//     "sources": ["NVIDIA/Megatron-LM@<commit>:tools/checkpoint/saver_core.py", ...]  optional
//   }
// Rules: ProfileUnknownField (a key not listed above, at any level; a kind or a config key ckpt
// does not know), ProfileBadValue (missing required field, wrong JSON type, unknown enum or dtype
// name, multiple out of range, bad name pattern), ProfileContradiction (a name for a kind the
// packing does not use: "qkv" with separate q/k/v, "q" with a packed qkv, "gate_up" with separate
// gate/up, "gate" with a fused MLP; the bias kinds likewise), ProfileIncompleteNaming (a kind the
// packing needs has no name; at profile_tensors: a bias kind the model needs), ProfileDuplicateName
// (two kinds with one pattern, two canonical keys with one stack key).
// Pure values and functions; thread safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "formats/dtype/dtype.h"
#include "formats/tensor/region.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

enum class QkvPacking : uint8_t {
  kSeparate,        // q_proj, k_proj, v_proj
  kMegatronGroups,  // [q heads of g; k_g; v_g] for each query group g (tp-independent; also PaddleNLP qkv_proj)
  kLibaiHeads,      // per attention head h: [q_h; k_h; v_h] (LiBai query_key_value; needs K == H)
  kFusedWhole,      // [q_all; k_all; v_all]
  kFusedPerTp,      // [q_r; k_r; v_r] for each TP rank r (depends on tp)
};
enum class MlpPacking : uint8_t {
  kSeparate,    // gate_proj, up_proj
  kFusedPerTp,  // [gate_r; up_r] for each TP rank r (Megatron linear_fc1; depends on tp)
  kFusedWhole,  // [gate; up]
};
enum class Orientation : uint8_t { kOutIn, kInOut };  // 2-D linear weights: [out, in] (HF, Megatron) or [in, out] (Paddle)

// Tensor classes for stored dtypes.
enum class TensorClass : uint8_t { kWeight, kNorm, kEmbedding, kOptimizer };

struct VocabPadding {
  int64_t multiple = 1;         // padded rows: ceil(V / m) * m with m = multiple (x tp when scales_with_tp)
  bool scales_with_tp = false;  // Megatron: make_vocab_size_divisible_by * tp
  int64_t padded(int64_t vocab, int tp) const;
};

struct Profile {
  std::string name;         // "megatron-mcore"
  std::string description;  // one line
  // Stored dtype per class; nullopt = keep the source's dtype ("keep" in JSON).
  std::optional<DType> dtype_weight, dtype_norm, dtype_embedding, dtype_optimizer;
  VocabPadding vocab;
  QkvPacking qkv = QkvPacking::kSeparate;
  MlpPacking mlp = MlpPacking::kSeparate;
  Orientation orientation = Orientation::kOutIn;
  // Tensor kind -> name pattern ("{i}" = global layer index). Kinds: embed, final_norm, lm_head,
  // input_norm, post_norm, q, k, v, qkv, o, gate, up, gate_up, down, and the bias kinds q_bias,
  // k_bias, v_bias, qkv_bias, o_bias, gate_bias, up_bias, gate_up_bias, down_bias.
  std::vector<std::pair<std::string, std::string>> names;
  // Canonical (HF config.json) key -> this stack's key, for the config written beside the tensors.
  std::vector<std::pair<std::string, std::string>> config_keys;
  std::vector<std::string> sources;  // the framework files this convention was read from (docs)

  // The stored dtype of a tensor of class `c` whose source dtype is `src`.
  DType stored_dtype(TensorClass c, DType src) const;
  // The pattern of `kind`, or "" when the profile does not name it.
  std::string pattern(const std::string& kind) const;
  nlohmann::json to_json() const;
};

// Parses and validates a profile; every problem a named code (error_codes.cc): ProfileUnknownField,
// ProfileBadValue (unknown packing/orientation/dtype name, non-positive multiple),
// ProfileContradiction (e.g. qkv "separate" with a "qkv" name, libai heads with biases...),
// ProfileIncompleteNaming (a kind the packing needs has no name), ProfileDuplicateName.
// `origin` (file path or "built-in <name>") is named in every message.
Result<Profile> profile_from_json(const nlohmann::json& j, const std::string& origin);

// The profiles shipped in profiles/*.json (compiled in): hf, megatron-mcore, megatron-legacy,
// paddlenlp, libai, reference.
std::vector<std::string> builtin_profile_names();
Result<Profile> builtin_profile(const std::string& name);  // ProfileUnknown lists the names
// A built-in name, or a JSON file when `file` is non-empty (--profile-file).
Result<Profile> load_profile(const std::string& name, const std::string& file = "");

// One slab of a profile tensor (untransposed orientation): `box` of canonical tensor `canonical`,
// or `zero_rows` rows of zeros (vocab padding) when `canonical` is empty.
struct ProfileSegment {
  std::string canonical;
  Box box;
  int64_t zero_rows = 0;
  int64_t rows() const { return canonical.empty() ? zero_rows : (box.ndim() ? box.extent[0] : 1); }
};

struct ProfileTensor {
  std::string name;        // in the profile's naming
  Shape shape;             // as stored (transposed when `transposed`)
  DType dtype;             // as stored
  bool transposed = false; // stored as the transpose of the concatenation of the segments (2-D only)
  TensorClass cls = TensorClass::kWeight;
  std::vector<ProfileSegment> segments;  // concatenated along dim 0 (before the transpose)

  // The shape of the concatenation of the segments (= shape, or shape reversed when transposed).
  Shape untransposed_shape() const;
};

// The canonical boxes and zero rows that make up `box` (untransposed coordinates of `t`, inside
// untransposed_shape()), in row order: each segment's rows clipped to the box's rows, its trailing
// dims narrowed to the box's. Empty segments are dropped.
std::vector<ProfileSegment> profile_segments_in(const ProfileTensor& t, const Box& box);

// Names for the enums (as in the JSON files).
const char* qkv_packing_name(QkvPacking p);
const char* mlp_packing_name(MlpPacking p);
const char* orientation_name(Orientation o);
const char* tensor_class_name(TensorClass c);

// The profile's global tensors for a model: one per canonical tensor or packed group of them, in
// canonical order, optimizer tensors after the model's (for each canonical optimizer tensor in
// `canonical`, whose dtypes are the source dtypes). `tp` matters for per-TP packings and
// tp-scaled vocab padding. Refuses (ProfileUnsupported, naming the rule) models the convention
// cannot express: libai heads with GQA (K != H), per-TP packing with tp not dividing the heads...
Result<std::vector<ProfileTensor>> profile_tensors(const Profile& p, const LlamaConfig& config,
                                                   const std::vector<TensorMeta>& canonical, int tp);

}  // namespace ckpt
