// The optimizer state of a Megatron-LM LEGACY rank file (model_optim_rng.pt, non-distributed
// optimizer), mapped to the rank's model parameters. What megatron-core 0.16 writes there
// (megatron/training/checkpointing.py generate_state_dict: state_dict['optimizer'] =
// optimizer.state_dict(); megatron/core/optimizer/optimizer.py):
//   FP32Optimizer                      -> the torch Adam/AdamW state_dict itself:
//        {'state': {id: {'step': tensor(), 'exp_avg': T, 'exp_avg_sq': T}},
//         'param_groups': [{'wd_mult', 'lr_mult', 'max_lr', 'min_lr', 'lr', 'betas', 'eps',
//                           'weight_decay', ..., 'params': [id, ...]}, ...]}
//   Float16OptimizerWithFloat16Params  -> {'optimizer': <that state_dict over fp32 masters>,
//        'fp32_from_fp16_params': [[fp32 master per param of group g] per group],
//        'grad_scaler': {...} (fp16 only)}
//   ChainedOptimizer of one optimizer  -> that optimizer's state_dict (several: a list; refused)
// The integer ids are torch's: the params of param_groups numbered in order. megatron-core's
// _get_param_groups (megatron/core/optimizer/__init__.py) builds the groups from the model
// chunk's named_parameters() in order, split by its standard override: 1-dim and *.bias
// parameters get wd_mult 0.0, the others none; each group lists its parameters in
// named_parameters order, which is the order of the 'model' state dict entries. So group g's
// k-th id is the k-th model tensor of g's kind (wd_mult == 0: 1-dim or bias; else the rest).
// TransformerEngine's FusedAdam keeps 'step' in the param group instead of per parameter: both
// are read. The distributed optimizer keeps no 'state' here: its moments are in distrib_optim.pt
// (converters/megatron/megatron_distrib_optim.h); only the step is read here (param_groups).
// Pure functions of the parsed file; thread safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/tensor/tensor_io.h"
#include "formats/torch/torch_file.h"

namespace ckpt {

// The prefixes of optimizer tensors: in a rank file's tensor list before the mcore name, in the
// canonical view before the HF name (the native store's names, converters/model/llama_sharding.cc).
inline constexpr const char* kMegatronOptimPrefixes[] = {"optimizer.exp_avg.", "optimizer.exp_avg_sq.",
                                                         "optimizer.fp32_param."};

struct MegatronModelParam {
  std::string name;  // mcore name
  Shape shape;
  DType dtype = DType::kF32;
  const torch::TensorRef* ref = nullptr;  // the model tensor (the master of an fp32 parameter)
};

struct MegatronOptimTensor {
  std::string name;  // kMegatronOptimPrefixes[k] + mcore name
  const torch::TensorRef* ref = nullptr;
};

struct MegatronLegacyOptim {
  std::vector<MegatronOptimTensor> tensors;  // empty when there is no usable state
  std::optional<int64_t> step;               // Adam step count (common to all parameters)
  nlohmann::json adam = nlohmann::json::object();  // megatron_adam_hyper
  std::string not_imported;  // why an existing 'optimizer' entry was not mapped ("" otherwise)
};

// lr, min_lr, max_lr, beta1, beta2, eps, weight_decay of the first weight-decay group of a torch
// optimizer's param_groups list (else of the first group); those absent are left out.
nlohmann::json megatron_adam_hyper(const torch::PyObj* groups);

// True for the parameters megatron-core puts in the wd_mult = 0 group: 1-dim or named *.bias.
bool megatron_no_weight_decay(const std::string& name, const Shape& shape);

// The 'optimizer' entry of `file`'s root dict mapped to `params` (the rank's model tensors in
// 'model' order). Errors name the file and the key: MegatronOptimizerState (malformed entry),
// MegatronOptimizerParams (group sizes do not match the model), MegatronOptimizerUnknownParam
// (state for an id no group lists), MegatronOptimizerMissingMoment (exp_avg / exp_avg_sq / state
// missing for a parameter), ShapeMismatch (a moment or master not of its parameter's shape),
// MegatronOptimizerStep (parameters at different steps).
Result<MegatronLegacyOptim> megatron_legacy_optimizer(torch::TorchFile& file,
                                                      const std::vector<MegatronModelParam>& params);

// lr, beta1, beta2, eps, weight_decay of a torch Adam/AdamW state_dict's param_groups (the first
// group with weight decay, else the first; Megatron's wd_mult honoured); {} when not a list. Also
// the DeepSpeed reader's (converters/deepspeed/).
nlohmann::json torch_adam_hyper(const torch::PyObj* param_groups);

// The mcore named_parameters() position of a parameter within its layer / model (export order:
// embedding, layers by index and module order, final norm, output layer).
bool megatron_param_order_less(const std::string& a, const std::string& b);

}  // namespace ckpt
