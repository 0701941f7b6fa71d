// The C++ side of ckpt.open() and the Checkpoint object, free of Python: an opened checkpoint
// (any kind converters/source/open_checkpoint.h reads), reads of any region of a global tensor through
// the engine (reshard/executor.h read_global_box: box intersection with the stored pieces,
// dtype casts), and the regions one rank holds under a layout (reshard/planner.h rank_view with
// the LLaMA sharding rules of the checkpoint's model_config; through the profile views of
// converters/profile/profile_view_job.h when the checkpoint is stored in a non-reference profile or
// another profile is asked for). checkpoint_bind.cc wraps these for Python.
// Thread safety: every method takes the checkpoint's mutex (the sources are one thread at a
// time); the binding releases the GIL before calling them and touches no Python object meanwhile.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/base/status.h"
#include "formats/dtype/dtype.h"
#include "formats/tensor/tensor_io.h"
#include "reshard/layout/layout.h"
#include "reshard/source_index.h"

namespace ckpt {
class ProfileConversion;
class ShardingRules;
}  // namespace ckpt

namespace ckpt::py {

// numpy's name of a dtype ("float32", "bfloat16", "float8_e4m3fn"); and back, also accepting
// ckpt's names ("F32", "BF16") and the CLI aliases ("bf16", "fp32"). Errors: InvalidArgument.
const char* numpy_dtype_name(DType t);
Result<DType> dtype_from_any_name(const std::string& name);

class CheckpointCore {
 public:
  static Result<std::shared_ptr<CheckpointCore>> open(const std::string& path);
  ~CheckpointCore();

  const std::string& path() const { return path_; }
  const std::string& kind() const { return kind_; }
  // Listing and metadata: valid after close() too (copied at open).
  const std::vector<TensorMeta>& tensors() const { return tensors_; }
  const nlohmann::json& metadata() const { return metadata_; }
  const TensorMeta* find(const std::string& name) const;

  // Reads `region` (a box, or a flat range of one) of tensor `name` into `dst` (dst_bytes long:
  // region.numel() elements of `out`, in the region's storage order), cast with `cast`.
  // Errors: NotFound naming the tensor, InvalidArgument for a region outside it, the source's.
  Status read(const std::string& name, const Region& region, DType out, void* dst, size_t dst_bytes,
              const CastOptions& cast);
  void close();
  bool closed();

 private:
  friend class RankView;
  CheckpointCore() = default;
  Status check_open_locked() const;

  std::mutex mu_;
  std::string path_, kind_;
  std::unique_ptr<TensorSource> src_;
  SourceIndex index_;
  std::vector<TensorMeta> tensors_;
  nlohmann::json metadata_;
};

// What one rank holds under a layout, and reads of it: the pieces of rank_view (replicas
// included, ZeRO-1 optimizer state as flat ranges), in the profile asked for (empty: the
// checkpoint's own). Reads go through the profile view when there is one.
class RankView {
 public:
  // `layout`: a layout JSON object (reshard/layout/layout.h from_json) where a symmetric one may leave
  // out the stages (even split of the model's layers) and vocab_divisor / profile (kept from the
  // checkpoint's layout), and may spell layers_per_stage "pp_layers".
  static Result<std::unique_ptr<RankView>> make(std::shared_ptr<CheckpointCore> core, const nlohmann::json& layout,
                                                int rank, const std::string& profile);
  ~RankView();
  const std::vector<Piece>& pieces() const { return pieces_; }
  const std::vector<TensorMeta>& tensors() const { return tensors_; }
  const Layout& layout() const { return layout_; }
  // Reads pieces()[i] (its region, in storage order) into dst as `out`.
  Status read(size_t i, DType out, void* dst, size_t dst_bytes, const CastOptions& cast);

 private:
  RankView() = default;
  std::shared_ptr<CheckpointCore> core_;
  std::unique_ptr<ProfileConversion> conv_;  // null: reads from the checkpoint itself
  std::unique_ptr<ShardingRules> rules_;
  SourceIndex view_index_;                   // of conv_'s source
  Layout layout_;
  std::vector<TensorMeta> tensors_;
  std::vector<Piece> pieces_;
};

}  // namespace ckpt::py
