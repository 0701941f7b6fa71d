// The files of a DeepSpeed ZeRO step directory (the layout and the named errors:
// converters/deepspeed/deepspeed_source.h), found and parsed: the step directory `latest` names, the
// rank files (every rank present), each rank's optimizer file (stage, partition_count, fp32
// partitions, paddings, Adam state: validated as to structure and types, sizes left to
// ds_partitions.h) and the model states' param_shapes. Read through the restricted unpickler.
// Functions of the files only; a RankOptim's TorchFile is one thread at a time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "converters/deepspeed/ds_partitions.h"
#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "formats/torch/torch_file.h"

namespace ckpt::deepspeed_detail {

inline constexpr const char* kModelStates12 = "mp_rank_00_model_states.pt";
inline constexpr const char* kModelStates3 = "zero_pp_rank_0_mp_rank_00_model_states.pt";

// One rank's optimizer file, parsed.
struct RankOptim {
  std::string path;
  std::unique_ptr<torch::TorchFile> file;
  int stage = -1;
  int64_t partition_count = 0;               // max over groups
  std::vector<const torch::TensorRef*> fp32;  // per group
  std::vector<const torch::TensorRef*> exp_avg, exp_avg_sq;  // per group (empty: no Adam state)
  std::vector<double> steps;                  // per group
  std::vector<int64_t> group_paddings;        // stages 1/2
  std::vector<std::vector<int64_t>> alignment_paddings;
  const torch::PyObj* param_groups = nullptr;
  std::string no_state;  // why the Adam state is not there ("" when it is)
};

struct RankFiles {
  std::vector<std::string> optim;  // by rank
  std::string prefix;              // "" or "bf16_"
};

// A step directory: holds kModelStates12 or kModelStates3 (file names only).
bool is_step_dir(const std::filesystem::path& p);

// DeepSpeedNotZero naming `file`.
Status not_zero(const std::string& file, const std::string& msg);
// "F32", "BF16", ...; the training dtype as DeepSpeed's config names it ("fp32", "bf16", "fp16").
std::string dt(DType d);
std::string train_dtype(DType d);

// The Adam step `v` (`what` in `f`): an int (FusedAdam), a float, or a 0-d tensor (torch AdamW) read from `f`.
Result<double> step_of(const torch::PyObj* v, torch::TorchFile& f, const std::string& what);
// One rank's [bf16_]zero_pp_rank_R_mp_rank_00_optim_states.pt.
Result<RankOptim> read_rank_optim(const std::string& path);
// param_shapes of a model states file: per param group, the parameters in order (frozen and
// shared parameters: Unsupported).
Result<std::vector<std::vector<DsParamShape>>> param_shapes(const torch::PyObj* root, const std::string& file);
// The step directory of `path` (itself, or the tag `latest` names: DeepSpeedLatest); *tag its name.
Result<std::string> step_dir_of(const std::string& path, std::string* tag);
// The optimizer rank files of step directory `dir`, ranks 0..n-1 (DeepSpeedMissingRank;
// tensor- and expert-parallel files: Unsupported).
Result<RankFiles> rank_files(const std::string& dir);
// The model's config.json from the first of `dirs` holding one, into meta["model_config"] (its path
// in meta["deepspeed"]["config_json"]); none: meta unchanged. DeepSpeed keeps no config of its own.
Status read_config_beside(const std::vector<std::string>& dirs, nlohmann::json& meta);

}  // namespace ckpt::deepspeed_detail
