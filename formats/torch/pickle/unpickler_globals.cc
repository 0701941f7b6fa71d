// The restricted unpickler's allow-list: which globals a pickle may name and what each becomes.
// Nothing is imported or called: a global is a name matched against this table, and REDUCE /
// NEWOBJ of an entry builds inert data (docs/TORCH.md: the table, and why each entry is safe).
#include <iterator>

#include "formats/torch/pickle/unpickler_machine.h"

namespace ckpt::torch::unpickler_detail {

namespace {

struct PickleGlobalEntry {
  const char* module;
  const char* name;
  GlobalKind kind;
};

constexpr PickleGlobalEntry kAllowedGlobals[] = {
    {"collections", "OrderedDict", GlobalKind::kOrderedDict},
    {"builtins", "set", GlobalKind::kSetLike},
    {"builtins", "frozenset", GlobalKind::kSetLike},
    {"builtins", "slice", GlobalKind::kRecordClass},
    {"_codecs", "encode", GlobalKind::kCodecsEncode},
    {"torch", "Size", GlobalKind::kTorchSize},
    {"torch._utils", "_rebuild_tensor_v2", GlobalKind::kRebuildV2},
    {"torch._utils", "_rebuild_tensor_v3", GlobalKind::kRebuildV3},
    {"torch._utils", "_rebuild_parameter", GlobalKind::kRebuildParam},
    {"torch._utils", "_rebuild_parameter_with_state", GlobalKind::kRebuildParamState},
    {"torch._tensor", "_rebuild_from_type_v2", GlobalKind::kRebuildFromType},
    {"torch", "Tensor", GlobalKind::kTensorType},
    {"torch._tensor", "Tensor", GlobalKind::kTensorType},
    {"torch.nn.parameter", "Parameter", GlobalKind::kTensorType},
    {"torch.storage", "UntypedStorage", GlobalKind::kStorageClass},
    {"torch", "strided", GlobalKind::kBare},
    {"torch", "sparse_coo", GlobalKind::kBare},
    {"torch", "contiguous_format", GlobalKind::kBare},
    {"torch", "channels_last", GlobalKind::kBare},
    {"torch", "channels_last_3d", GlobalKind::kBare},
    {"torch", "preserve_format", GlobalKind::kBare},
    {"torch", "device", GlobalKind::kRecordClass},
    {"torch.serialization", "_get_layout", GlobalKind::kRecordClass},  // DCP: ('torch.strided',)
    {"argparse", "Namespace", GlobalKind::kRecordClass},
    {"types", "SimpleNamespace", GlobalKind::kRecordClass},
    {"pathlib", "PosixPath", GlobalKind::kRecordClass},
    {"signal", "Signals", GlobalKind::kRecordClass},
    {"io", "BytesIO", GlobalKind::kRecordClass},
    {"numpy.core.multiarray", "_reconstruct", GlobalKind::kRecordClass},
    {"numpy._core.multiarray", "_reconstruct", GlobalKind::kRecordClass},
    {"numpy.core.multiarray", "scalar", GlobalKind::kRecordClass},
    {"numpy._core.multiarray", "scalar", GlobalKind::kRecordClass},
    {"numpy", "ndarray", GlobalKind::kRecordClass},
    {"numpy", "dtype", GlobalKind::kRecordClass},
    // Megatron-LM / megatron-core objects held by `args` (megatron/core/safe_globals.py).
    {"megatron.core.enums", "ModelType", GlobalKind::kRecordClass},
    {"megatron.core.enums", "Fp8Recipe", GlobalKind::kRecordClass},
    {"megatron.core.enums", "Fp4Recipe", GlobalKind::kRecordClass},
    {"megatron.core.transformer.enums", "ModelType", GlobalKind::kRecordClass},
    {"megatron.core.transformer.enums", "LayerType", GlobalKind::kRecordClass},
    {"megatron.core.transformer.enums", "AttnType", GlobalKind::kRecordClass},
    {"megatron.core.transformer.enums", "AttnMaskType", GlobalKind::kRecordClass},
    {"megatron.core.transformer.enums", "AttnBackend", GlobalKind::kRecordClass},
    {"megatron.core.transformer.enums", "CudaGraphScope", GlobalKind::kRecordClass},
    {"megatron.core.optimizer.optimizer_config", "OptimizerConfig", GlobalKind::kRecordClass},
    {"megatron.core.rerun_state_machine", "RerunDiagnostic", GlobalKind::kRecordClass},
    {"megatron.core.rerun_state_machine", "RerunMode", GlobalKind::kRecordClass},
    {"megatron.core.rerun_state_machine", "RerunState", GlobalKind::kRecordClass},
    {"megatron.model.enums", "ModelType", GlobalKind::kRecordClass},  // Megatron-LM before mcore
    {"megatron.model.enums", "LayerType", GlobalKind::kRecordClass},
    {"megatron.model.enums", "AttnType", GlobalKind::kRecordClass},
    {"megatron.model.enums", "AttnMaskType", GlobalKind::kRecordClass},
    // DeepSpeed ZeRO checkpoints (converters/deepspeed/): an enum, the loss scaler and the fragment
    // addresses of param_slice_mappings, plain fields only; getattr only on such a class (an
    // enum member by name).
    {"deepspeed.runtime.zero.config", "ZeroStageEnum", GlobalKind::kPlainClass},
    {"deepspeed.runtime.fp16.loss_scaler", "LossScaler", GlobalKind::kPlainClass},
    {"deepspeed.utils.tensor_fragment", "fragment_address", GlobalKind::kPlainClass},
    {"builtins", "getattr", GlobalKind::kGetattr},
    // torch.distributed.checkpoint's .metadata dataclasses.
    {"torch.distributed.checkpoint.metadata", "Metadata", GlobalKind::kRecordClass},
    {"torch.distributed.checkpoint.metadata", "TensorStorageMetadata", GlobalKind::kRecordClass},
    {"torch.distributed.checkpoint.metadata", "BytesStorageMetadata", GlobalKind::kRecordClass},
    {"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata", GlobalKind::kRecordClass},
    {"torch.distributed.checkpoint.metadata", "TensorProperties", GlobalKind::kRecordClass},
    {"torch.distributed.checkpoint.metadata", "MetadataIndex", GlobalKind::kRecordClass},
    {"torch.distributed.checkpoint.metadata", "StorageMeta", GlobalKind::kRecordClass},
    {"torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING", GlobalKind::kRecordClass},
    {"torch.distributed.checkpoint.filesystem", "_StorageInfo", GlobalKind::kRecordClass},
    // Megatron-Core's torch_dist .metadata also holds its cached global save plans
    // (converters/megatron/dist/megatron_dist_source): dataclasses and an Enum of plain values, kept inert.
    {"torch.distributed.checkpoint.planner", "SavePlan", GlobalKind::kRecordClass},
    {"torch.distributed.checkpoint.planner", "WriteItem", GlobalKind::kRecordClass},
    {"torch.distributed.checkpoint.planner", "WriteItemType", GlobalKind::kRecordClass},
    {"torch.distributed.checkpoint.planner", "TensorWriteData", GlobalKind::kRecordClass},
};

// Protocol 2 writes Python 3 modules under their Python 2 names (Lib/_compat_pickle.py).
std::string_view pickle_canonical_module(std::string_view m) {
  if (m == "__builtin__") return "builtins";
  if (m == "_io") return "io";
  return m;
}

// numpy.dtypes.<X>DType classes (numpy >= 1.25 pickles dtypes through them).
bool is_numpy_dtype_class(std::string_view module, std::string_view name) {
  if (module != "numpy.dtypes" || name.size() < 6 || name.size() > 40 || name.substr(name.size() - 5) != "DType") return false;
  for (char c : name)
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return false;
  return true;
}

}  // namespace

std::optional<AllowedGlobal> find_allowed_global(std::string_view module_in, std::string_view name) {
  // Built once: the table, plus torch's dtypes and storage classes (formats/torch/pickle/py_object.cc).
  static const std::vector<std::pair<std::string, AllowedGlobal>> kTable = [] {
    std::vector<std::pair<std::string, AllowedGlobal>> t;
    for (const auto& e : kAllowedGlobals) {
      std::string c = std::string(e.module) + "." + e.name;
      t.push_back({c, AllowedGlobal{e.kind, c}});
    }
    for (int i = 0; i < kNumDTypes; ++i) {
      auto d = static_cast<DType>(i);
      std::string dn = torch_dtype_name(d);
      t.push_back({dn, AllowedGlobal{GlobalKind::kBare, dn}});
      std::string sc = storage_class_name(d);
      if (sc != "torch.storage.UntypedStorage") t.push_back({sc, AllowedGlobal{GlobalKind::kStorageClass, sc}});
    }
    return t;
  }();
  std::string_view module = pickle_canonical_module(module_in);
  if (module.size() > 200 || name.size() > 200) return std::nullopt;
  std::string full = std::string(module) + "." + std::string(name);
  for (const auto& [k, g] : kTable)
    if (k == full) return g;
  if (is_numpy_dtype_class(module, name)) return AllowedGlobal{GlobalKind::kRecordClass, full};
  return std::nullopt;
}

}  // namespace ckpt::torch::unpickler_detail
