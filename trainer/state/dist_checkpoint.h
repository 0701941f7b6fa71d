// Checkpoints of the parallel trainer, saved by every rank and resumed on any layout.
// Save (DistSaver): the trainer checkpoint's plan (place_tensors of trainer_tensors(cfg) under the
// run's layout with the LLaMA rules: each element once, balanced over its holders) gives every
// rank its pieces; save() copies them out of the live held buffers into staging buffers (reused
// from one save to the next), then writes them into `<run>/step-XXXXXXXX.partial/shards/rNNNNN.h5`
// (on a background thread when async). poll(), called on every rank every step, notices when all
// ranks have finished: rank 0 then commits the manifest (true layout, caller's metadata; written
// last, atomic rename) and moves `latest`. A failure on any rank reaches every rank (the same
// Status) and the partial directory is removed; `latest` still names the previous checkpoint.
// Load (dist_load): any native-store checkpoint of any layout; the digests of its pieces are
// checked with the work split over the ranks by bytes, every rank stops with the same error
// before reading; then each rank reads exactly its held regions through the engine.
// Test fault hook: env CKPT_TEST_KILL_IN_SAVE=R:S makes world rank R raise SIGKILL in the middle
// of writing its shard of the step-S save (after its first piece is written).
// Thread safety: one object per process, its methods on the main thread (the Comm's thread);
// the background writer touches only the staging buffers and its own shard file.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "formats/base/status.h"
#include "formats/store/store_options.h"
#include "reshard/dist/comm.h"
#include "reshard/layout/layout.h"
#include "trainer/optim/held_region.h"

namespace ckpt::trainer {

// The background write of a rank's shard of `shard_bytes` stages its direct requests in a WritePool
// (formats/io/write_pool.h) of this many buffers of kWriteRequestBytes, several in flight: one per
// request the shard fills, up to kSaveWritePoolMaxBuffers; none (0) below two. Kept from one save to
// the next; the memory estimate counts it in the checkpoint term (trainer/memory_estimate.h).
inline constexpr int kSaveWritePoolMaxBuffers = 4;
int save_write_pool_buffers(uint64_t shard_bytes);
// The pool's pages a save touches (what it adds to RSS): each buffer up to the largest request,
// which holds at most the largest piece (+ its first 4 KiB block's head; the buffers are mapped,
// untouched pages cost nothing).
uint64_t save_write_pool_touched(uint64_t shard_bytes, uint64_t largest_piece_bytes);

class DistSaver {
 public:
  // `world`: the world communicator (size == layout.world_size()); `run_dir`: where the
  // step-XXXXXXXX checkpoints and `latest` go. The plan is computed on the first save.
  DistSaver(Comm& world, LlamaConfig cfg, Layout layout, std::string run_dir, store::StoreOptions opts = {});
  ~DistSaver();  // joins a background write still running (nothing is committed)
  DistSaver(const DistSaver&) = delete;
  DistSaver& operator=(const DistSaver&) = delete;

  // Computes the plan now (local; save() does it on first use): Trainer::create calls it so that
  // a layout the planner cannot place is refused before any work.
  Status prepare() { return make_plan_once(); }
  // Collective. Waits for the save in flight (returns its error), copies this rank's pieces out
  // of `held` (what this rank holds: rank_view's regions) and starts writing step `step` with
  // `metadata` (model_config, trainer, ...; "layout" is replaced by the run's true layout).
  // async == false: returns once the checkpoint is committed (as save + wait).
  Status save(const std::vector<HeldRegion>& held, const nlohmann::json& metadata, int64_t step, bool async);
  // Collective, cheap (nothing, or one all-reduce of an integer, while a save is in flight):
  // true when no save is in flight any more (committed now or before); false while some rank is
  // still writing; an error (the same on every rank) when the save failed.
  Result<bool> poll();
  // Collective: poll until the save in flight is committed or failed.
  Status wait();
  bool in_flight() const { return in_flight_; }
  // Bytes this rank writes per save (0 before the first save).
  uint64_t my_bytes() const;
  // Saving in a profile (trainer/train_profile.h): each checkpoint is committed canonical as
  // `step-XXXXXXXX.canonical` first, then `convert(staged, final, budget)` (collective, every rank)
  // writes `step-XXXXXXXX` with at most `budget` bytes of buffers (this rank's staging bytes, whose
  // copies are released first, so the memory estimate's staging term covers the conversion);
  // `latest` moves after that and the staged copy is removed. Not set: the canonical checkpoint
  // is the final one.
  using Convert = std::function<Status(const std::string& staged, const std::string& dst, uint64_t budget)>;
  void set_convert(Convert convert) { convert_ = std::move(convert); }

  struct Plan;

 private:
  Status make_plan_once();
  Status copy_out(const std::vector<HeldRegion>& held);
  Status commit();
  void write_shard(const std::string& partial, int64_t step);

  Comm& world_;
  LlamaConfig cfg_;
  Layout layout_;
  std::string run_dir_;
  store::StoreOptions opts_;
  std::unique_ptr<Plan> plan_;
  std::vector<std::vector<float>> staging_;  // one per piece of this rank
  nlohmann::json metadata_;
  std::string dst_;                          // the checkpoint being saved (the staged one with convert_)
  std::string final_;                        // the checkpoint the save ends as
  Convert convert_;
  std::thread writer_;
  bool in_flight_ = false;
  // Written by the writer thread, read on the main thread after `done_` (acquire).
  Status write_status_;
  std::string records_json_;
  std::shared_ptr<std::atomic<bool>> done_;
};

// Loads the checkpoint `path` (a checkpoint dir, or a run dir whose `latest` is followed; any
// layout, one-process checkpoints included) into `held` on every rank of `world`. Collective.
// Checks that its model_config equals `cfg` and that every trainer tensor is there with its
// shape; verifies the pieces' digests (split over the ranks by bytes); then reads exactly the
// held regions. Every rank gets the same error (naming the piece, tensor or file) or the
// checkpoint's metadata (model_config, layout, trainer, ...).
// `layout`: the run's layout (world.size() must equal its world size). weights_only (`ckpt train
// --init`): any checkpoint with a model_config equal to `cfg` and the model tensors (`from-hf`'s
// output), no 'trainer' metadata or optimizer tensors needed; `held` names model tensors only.
Result<nlohmann::json> dist_load(Comm& world, const std::string& path, const LlamaConfig& cfg, const Layout& layout,
                                 const std::vector<HeldRegion>& held, bool weights_only = false);

}  // namespace ckpt::trainer
