// The HF names of the MoE families' tensors and the store's canonical stacked experts
// (docs/MOE.md), as aliases (formats/tensor/alias_view.h) in both directions:
//   import: a source in either naming transformers loads -- per expert as save_pretrained writes
//           (Mixtral `block_sparse_moe.experts.{e}.w1/w3/w2.weight`, Qwen `mlp.experts.{e}.
//           {gate,up,down}_proj.weight`) or fused as transformers 5 holds them (`mlp.experts.
//           gate_up_proj` [E, 2F, h], `mlp.experts.down_proj` [E, h, F]), per layer -- seen as the
//           canonical tensors (`mlp.experts.{gate,up,down}_proj.weight` [E, F, h] / [E, h, F],
//           `mlp.gate.weight`, `mlp.shared_experts.*`, `mlp.shared_expert_gate.weight`);
//   export: the canonical tensors seen under the per-expert names of the config's family.
// Named errors: MissingTensor (naming the HF tensor expected), ShapeMismatch, MixedDtypes (the
// experts of one stacked tensor stored in different dtypes). Pure functions; thread safe.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "converters/model/llama_config.h"
#include "formats/tensor/alias_view.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

struct HfAliases {
  std::vector<TensorMeta> tensors;   // the view's tensors (dtypes: their sources')
  std::vector<TensorAlias> aliases;  // onto the inner source's tensors
  std::set<std::string> used;        // the inner source's tensors the aliases read
};

// `canonical`: llama_model_tensors(c, ...) (names and shapes); `src`: the HF source's tensors.
Result<HfAliases> hf_moe_import_aliases(const LlamaConfig& c, const std::vector<TensorMeta>& canonical,
                                        const std::vector<TensorMeta>& src);

// `canonical`: the store's model tensors in canonical order (names, shapes, stored dtypes).
HfAliases hf_moe_export_aliases(const LlamaConfig& c, const std::vector<TensorMeta>& canonical);

// An HF source (directory or file) of an MoE family seen as the canonical tensors (the stacked
// experts), so that every command reads it as it reads a native store; `src` itself when its config
// is no MoE family, or when its tensors do not map (the command that needs them then names what is
// missing, e.g. from-hf's MissingTensor). Errors: the view's (BadAlias; not expected).
Result<std::unique_ptr<TensorSource>> hf_moe_canonical_source(std::unique_ptr<TensorSource> src);

}  // namespace ckpt
