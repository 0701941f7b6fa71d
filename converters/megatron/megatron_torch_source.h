// Reading a Megatron-LM / FlagScale LEGACY checkpoint (one torch.save file per rank, as
// megatron/training/checkpointing.py writes it) in canonical HF view:
//   <run>/latest_checkpointed_iteration.txt          "<N>" or "release"
//   <run>/iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt
//       {'args': argparse.Namespace, 'checkpoint_version': 3.0, 'iteration': N,
//        'model': {name: tensor, ...}, 'optimizer': ..., 'opt_param_scheduler': ..., 'rng_state': ...}
// The files are read by the restricted unpickler (formats/torch), never by running pickle code.
// Both naming generations are accepted: mcore (decoder.layers.N.self_attention.linear_qkv.weight,
// TE or local norm names) and the older Megatron-LM names (language_model.encoder.layers.N.
// self_attention.query_key_value.weight, input_norm / input_layernorm, post_attention_norm /
// post_attention_layernorm, dense_h_to_4h, dense_4h_to_h, final_norm / final_layernorm,
// language_model.output_layer); they are renamed to mcore names and mapped through the segment
// map (converters/megatron/megatron_rank_source.h). Layer indices restart in each pipeline stage; the
// per-stage counts are read off the files (uneven FlagScale splits).
// A virtual (interleaved) pipeline's files hold 'model0' .. 'model{v-1}' instead of 'model', layer
// indices restarting in each chunk: chunk c of rank p is read as stage c * pp + p of a plain
// pipeline of pp * v chunk stages (converters/megatron/megatron_vpp.h); named errors
// MegatronVppChunkMissing, MegatronVppChunkCountMismatch (between files, or against the args),
// MegatronVppLayersNotDivisible, MegatronVppNeedsPipeline, MegatronVppLayerCountMismatch,
// MegatronVppUneven; metadata megatron.virtual_pipeline and no layout; their optimizer state is
// not read (megatron.optimizer_not_imported says so).
#pragma once

#include <memory>
#include <string>

#include "formats/tensor/tensor_io.h"

namespace ckpt {

// True when `path` is a run dir holding latest_checkpointed_iteration.txt, or an iteration dir
// holding mp_rank_*/model_optim_rng.pt.
bool is_megatron_torch_dir(const std::string& path);

// Opens such a directory (the run dir: the iteration that latest_checkpointed_iteration.txt names)
// as a TensorSource in canonical view. Config and layout come from rank (0, 0)'s pickled args
// (bounded, type-checked: BadMegatronArgs naming the file and key); the vocabulary is args.vocab_size
// when given (padding rows skipped), else padded_vocab_size. Every rank file must be present and
// hold every expected tensor with its exact shape. Metadata: model_config, layout, megatron_args,
// megatron {format, iteration, checkpoint_version, iteration_dir}.
Result<std::unique_ptr<TensorSource>> open_megatron_torch_dir(const std::string& path);

// The 'model' entry name in mcore naming: older names renamed, mcore names kept; "" for entries
// that are not model tensors ckpt maps.
std::string megatron_mcore_name(const std::string& name);

}  // namespace ckpt
