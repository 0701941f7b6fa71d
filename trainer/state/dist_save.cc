// DistSaver (trainer/state/dist_checkpoint.h): per-rank background save, commit by rank 0.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "converters/model/llama_sharding.h"
#include "formats/base/fs_util.h"
#include "formats/base/json_read.h"
#include "formats/io/write_pool.h"
#include "formats/store/manifest.h"
#include "formats/store/run_dir.h"
#include "formats/store/store_writer.h"
#include "reshard/planner.h"
#include "trainer/state/dist_checkpoint.h"

#include "reshard/layout/holdings.h"

namespace ckpt::trainer {

// What this rank writes: the trainer checkpoint's plan under the run's layout.
struct DistSaver::Plan {
  std::vector<TensorMeta> tensors;  // trainer_tensors(cfg)
  std::vector<Piece> mine;          // this rank's pieces, in the plan's order
  nlohmann::json layout_json;       // the true layout (with the ZeRO-1 description)
  uint64_t bytes = 0;
};

namespace {

// CKPT_TEST_KILL_IN_SAVE=R:S names this rank and step?
bool kill_hook(int rank, int64_t step) {
  const char* v = std::getenv("CKPT_TEST_KILL_IN_SAVE");
  if (!v || !*v) return false;
  int r = -1;
  long long s = -1;
  if (std::sscanf(v, "%d:%lld", &r, &s) != 2) return false;
  return r == rank && s == step;
}

}  // namespace

DistSaver::DistSaver(Comm& world, LlamaConfig cfg, Layout layout, std::string run_dir, store::StoreOptions opts)
    : world_(world), cfg_(std::move(cfg)), layout_(std::move(layout)), run_dir_(std::move(run_dir)),
      opts_(std::move(opts)) {}

DistSaver::~DistSaver() {
  if (writer_.joinable()) writer_.join();
}

uint64_t DistSaver::my_bytes() const { return plan_ ? plan_->bytes : 0; }

int save_write_pool_buffers(uint64_t shard_bytes) {
  const uint64_t n = std::min<uint64_t>(kSaveWritePoolMaxBuffers, shard_bytes / kWriteRequestBytes);
  return n >= 2 ? static_cast<int>(n) : 0;
}

uint64_t save_write_pool_touched(uint64_t shard_bytes, uint64_t largest_piece_bytes) {
  const uint64_t per = std::min<uint64_t>(kWriteRequestBytes, (largest_piece_bytes + 2 * 4096 - 1) / 4096 * 4096);
  return static_cast<uint64_t>(save_write_pool_buffers(shard_bytes)) * per;
}

Status DistSaver::make_plan_once() {
  if (plan_) return Status::Ok();
  if (world_.size() != layout_.world_size())
    return Status::Error("WorldSizeMismatch", "the world has " + std::to_string(world_.size()) +
                                                  " ranks, the layout " + std::to_string(layout_.world_size()));
  auto p = std::make_unique<Plan>();
  p->tensors = trainer_tensors(cfg_);
  std::vector<Piece> whole;
  for (const TensorMeta& t : p->tensors) whole.push_back({t.name, Region{Box::whole(t.shape)}, t.dtype});
  LlamaShardingRules rules(cfg_);
  CKPT_ASSIGN_OR_RETURN(ckpt::Plan plan, ckpt::make_plan(p->tensors, whole, nlohmann::json::object(), layout_, rules));
  for (size_t k = 0; k < plan.pieces.size(); ++k)
    if (plan.piece_rank[k] == world_.rank()) {
      p->bytes += static_cast<uint64_t>(plan.pieces[k].region.numel()) * sizeof(float);
      p->mine.push_back(std::move(plan.pieces[k]));
    }
  p->layout_json = plan.metadata["layout"];
  // The background write's direct requests staged in a pool, several in flight (unless the caller
  // gave one, or asked for buffered writes); under --io auto the pool probes both ways per save run.
  const int n = save_write_pool_buffers(p->bytes);
  if (n > 0 && !opts_.write_pool && opts_.io != IoMode::kBuffered && opts_.codec == store::Codec::kNone) {
    opts_.write_pool = std::make_shared<WritePool>(n);
    opts_.write_pool->set_auto(opts_.io == IoMode::kAuto);
  }
  plan_ = std::move(p);
  return Status::Ok();
}

Status DistSaver::copy_out(const std::vector<HeldRegion>& held) {
  staging_.resize(plan_->mine.size());
  for (size_t k = 0; k < plan_->mine.size(); ++k) {
    const Piece& piece = plan_->mine[k];
    staging_[k].resize(static_cast<size_t>(piece.region.numel()));
    // A planned piece lies in one rectangle of what this rank holds (a cell of a held box under a
    // general layout, or a part of a ZeRO-1 flat range): reshard/layout/holdings.h copy_from_held.
    bool copied = false;
    for (const HeldRegion& h : held)
      if (h.tensor == piece.tensor && h.data &&
          copy_from_held(h.region, h.data, piece.region, staging_[k].data(), sizeof(float))) {
        copied = true;
        break;
      }
    if (!copied)
      return Status::Internal("rank " + std::to_string(world_.rank()) + " must save '" + piece.tensor + "' " +
                              piece.region.to_string() + " but holds no region containing it")
          .with_tensor(piece.tensor);
  }
  return Status::Ok();
}

// Runs on the writer thread (or inline): this rank's shard file, then its records as JSON.
void DistSaver::write_shard(const std::string& partial, int64_t step) {
  Status st;
  nlohmann::json recs = nlohmann::json::array();
  if (!plan_->mine.empty()) {
    auto w = store::StoreWriter::open_rank(partial, world_.rank(), plan_->tensors, plan_->mine, opts_);
    if (!w.ok()) st = w.take_status();
    for (size_t k = 0; st.ok() && k < plan_->mine.size(); ++k) {
      st = (*w)->write(k, staging_[k].data(), static_cast<int64_t>(staging_[k].size()));
      if (st.ok() && kill_hook(world_.rank(), step)) std::raise(SIGKILL);  // test fault: dies mid-shard
    }
    if (st.ok()) {
      auto r = (*w)->close();
      if (r.ok())
        for (const auto& rec : *r) recs.push_back(store::piece_record_to_json(rec));
      else
        st = r.take_status();
    } else if (w.ok()) {
      (*w)->abort();
    }
  }
  write_status_ = st.ok() ? st : std::move(st).with_context("rank " + std::to_string(world_.rank()) + " writing its shard of " + dst_);
  records_json_ = recs.dump();
  done_->store(true, std::memory_order_release);
}

Status DistSaver::save(const std::vector<HeldRegion>& held, const nlohmann::json& metadata, int64_t step,
                       bool async) {
  CKPT_RETURN_IF_ERROR(wait());
  Status st = make_plan_once();
  if (st.ok()) st = copy_out(held);
  CKPT_RETURN_IF_ERROR(world_.agree(st));
  final_ = run_dir_ + "/" + store::step_dir_name(step);
  dst_ = convert_ ? final_ + ".canonical" : final_;
  metadata_ = metadata.is_object() ? metadata : nlohmann::json::object();
  metadata_["layout"] = plan_->layout_json;
  // Rank 0 prepares `<dst>.partial/shards`; everyone learns whether that worked.
  Status prep;
  if (world_.rank() == 0) {
    std::error_code ec;
    std::filesystem::create_directories(run_dir_, ec);
    prep = ec ? Status::Io("cannot create run directory '" + run_dir_ + "': " + ec.message()).with_file(run_dir_)
              : store::StoreWriter::prepare_partial(dst_);
  }
  CKPT_RETURN_IF_ERROR(world_.agree(prep));
  done_ = std::make_shared<std::atomic<bool>>(false);
  in_flight_ = true;
  const std::string partial = store::StoreWriter::partial_dir(dst_);
  if (async) {
    writer_ = std::thread([this, partial, step] { write_shard(partial, step); });
    return Status::Ok();
  }
  write_shard(partial, step);
  return wait();
}

Result<bool> DistSaver::poll() {
  if (!in_flight_) return true;
  int64_t done = done_->load(std::memory_order_acquire) ? 1 : 0;
  CKPT_RETURN_IF_ERROR(world_.all_reduce_sum(&done, 1));
  if (done < world_.size()) return false;
  if (writer_.joinable()) writer_.join();
  in_flight_ = false;
  CKPT_RETURN_IF_ERROR(commit());
  return true;
}

// Every rank's shard is written: agree on the outcome, gather the records, rank 0 finalizes and
// moves `latest`; on any failure the partial directory is removed.
Status DistSaver::commit() {
  const std::string partial = store::StoreWriter::partial_dir(dst_);
  Status group = world_.agree(write_status_);
  if (!group.ok()) {
    if (world_.rank() == 0) (void)remove_tree(partial);
    return group;
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> gathered, world_.gather(records_json_));
  Status fin;
  if (world_.rank() == 0) {
    std::vector<store::PieceRecord> records;
    for (size_t r = 0; r < gathered.size() && fin.ok(); ++r) {
      auto j = parse_json(gathered[r], kManifestJsonLimits, "piece records of rank " + std::to_string(r));
      if (!j.ok()) fin = j.take_status();
      for (size_t i = 0; fin.ok() && i < j->size(); ++i) {
        auto rec = store::piece_record_from_json((*j)[i]);
        if (rec.ok()) records.push_back(std::move(rec).value());
        else fin = rec.take_status();
      }
    }
    if (fin.ok()) fin = store::StoreWriter::finalize(dst_, plan_->tensors, std::move(records), metadata_, opts_);
    if (fin.ok() && !convert_) fin = store::write_latest(run_dir_, dst_.substr(dst_.rfind('/') + 1));
    if (!fin.ok()) (void)remove_tree(partial);
  }
  CKPT_RETURN_IF_ERROR(world_.agree(fin));
  if (!convert_) return Status::Ok();
  // Saving in a profile: the committed canonical checkpoint -> the final one (collective).
  std::vector<std::vector<float>>().swap(staging_);  // the writer has finished; the job's buffers replace them
  Status conv = world_.agree(convert_(dst_, final_, plan_->bytes));
  Status done;
  if (world_.rank() == 0) {
    if (conv.ok()) done = store::write_latest(run_dir_, final_.substr(final_.rfind('/') + 1));
    if (done.ok()) (void)remove_tree(dst_);
  }
  CKPT_RETURN_IF_ERROR(conv);
  return world_.agree(done);
}

Status DistSaver::wait() {
  while (in_flight_) {
    CKPT_ASSIGN_OR_RETURN(bool idle, poll());
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return Status::Ok();
}

}  // namespace ckpt::trainer
