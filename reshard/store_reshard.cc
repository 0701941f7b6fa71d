#include "reshard/store_reshard.h"

#include "reshard/layout/balance.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <future>
#include <mutex>
#include <optional>
#include <set>

#include "formats/base/fs_util.h"
#include "formats/base/json_read.h"
#include "formats/store/manifest.h"
#include "formats/tensor/write_placement.h"
#include "reshard/dist/comm.h"
#include "reshard/staged_read.h"

namespace ckpt {

namespace {

constexpr double kReshardWaitS = 7 * 24 * 3600.0;  // the longest wait for another process's work

// Adapts one rank's ShardWriter to the TensorSink the executor fills (begin/commit are the
// caller's business).
class ShardSink final : public TensorSink, public WritePlacement {
 public:
  explicit ShardSink(store::ShardWriter* w) : w_(w) {}
  Status begin(const std::vector<TensorMeta>&, const std::vector<Piece>&, const nlohmann::json&) override {
    return Status::Ok();
  }
  Status write(size_t piece, const void* data, int64_t count) override { return w_->write(piece, data, count); }
  bool accepts_file_extents() const override { return w_->accepts_file_extents(); }
  std::optional<uint64_t> piece_file_offset(size_t piece) const override { return w_->piece_file_offset(piece); }
  Status write_from_file(size_t piece, const FileExtent& src, int64_t count) override {
    return w_->write_from_file(piece, src, count);
  }
  bool gathers_file_runs() const override { return w_->accepts_file_extents(); }
  Status write_from_files(size_t piece, const std::vector<FileExtent>& runs, int64_t count) override {
    return w_->write_from_files(piece, runs, count);
  }
  Status commit() override { return Status::Ok(); }
  void abort() override {}

 private:
  store::ShardWriter* w_;
};

// Every process's `mine`, gathered to rank 0 (Status::to_json); each process gets the first
// failure in rank order (its message names the rank), or OK when every process succeeded. A
// failure of the communicator itself is returned as it is.
Status first_failure(Comm& dist, const Status& mine) {
  CKPT_ASSIGN_OR_RETURN(const std::vector<std::string> all, dist.gather(mine.to_json()));
  Status first;
  for (size_t r = 0; r < all.size() && first.ok(); ++r) {  // rank 0 only: the others got none
    first = Status::from_json(all[r]);
    if (!first.ok() && r != 0) first = std::move(first).with_context("reshard process " + std::to_string(r) + " of " +
                                                                    std::to_string(all.size()) + "; nothing was committed");
  }
  CKPT_ASSIGN_OR_RETURN(const std::string text, dist.broadcast(first.to_json()));
  return Status::from_json(text);
}

// Rank 0: parses every process's piece records, runs opts.before_commit and finalizes `dst`.
Status finalize_on_root(const std::vector<std::string>& gathered, const Plan& plan, const std::string& dst,
                        const StoreExecOptions& opts) {
  std::vector<store::PieceRecord> records;
  std::vector<std::string> notes;
  for (const std::string& g : gathered) {
    auto j = parse_json(g, kManifestJsonLimits, "piece records of a reshard process");
    if (!j.ok() || !j->is_object() || !(*j)["records"].is_array() || !(*j)["note"].is_string())
      return Status::Internal("bad piece records gathered from a reshard process: " +
                              (j.ok() ? std::string("not {records, note}") : j.status().to_string()));
    notes.push_back((*j)["note"].get<std::string>());
    for (const auto& rj : (*j)["records"]) {
      CKPT_ASSIGN_OR_RETURN(store::PieceRecord r, store::piece_record_from_json(rj));
      records.push_back(std::move(r));
    }
  }
  if (records.size() != plan.pieces.size())
    return Status::Internal("gathered " + std::to_string(records.size()) + " piece records, the plan has " +
                            std::to_string(plan.pieces.size()));
  nlohmann::json metadata = plan.metadata;
  if (opts.amend_metadata) CKPT_RETURN_IF_ERROR(opts.amend_metadata(notes, metadata));
  if (opts.before_commit) CKPT_RETURN_IF_ERROR(opts.before_commit());
  return store::StoreWriter::finalize(dst, plan.tensors, std::move(records), metadata, opts.store);
}

// The source as this process sees it, counting what it asks for; with CKPT_DIST_TRACE=DIR set,
// finish() writes DIR/rank<R>.json: pid, the shard files this process wrote, the source pieces
// and bytes it asked for (read(), or file ranges offered to the sink, which may still read them
// instead) and its /proc/self/io counters, so a test can check that every process did its share.
// The source's staged reads (reshard/staged_read.h) pass through.
class TracedSource final : public TensorSource, public StagedReads {
 public:
  TracedSource(TensorSource& s, int rank, int nprocs)
      : s_(s), staged_(dynamic_cast<StagedReads*>(&s)), rank_(rank), nprocs_(nprocs) {}
  const std::vector<TensorMeta>& tensors() const override { return s_.tensors(); }
  const std::vector<Piece>& pieces() const override { return s_.pieces(); }
  const nlohmann::json& metadata() const override { return s_.metadata(); }
  std::string describe() const override { return s_.describe(); }
  IntegrityInfo integrity() const override { return s_.integrity(); }
  CheckReport check(const CheckOptions& o) override { return check_of_inner(s_, o, true); }
  Status check_piece(size_t piece) override {
    if (piece >= s_.pieces().size()) return Status::Internal("traced source piece " + std::to_string(piece) + " out of range");
    return s_.check_piece(piece);
  }
  void set_read_threads(int threads) override { s_.set_read_threads(threads); }
  std::optional<RangeCheck> range_check(size_t piece) override {
    return piece < s_.pieces().size() ? s_.range_check(piece) : std::nullopt;
  }
  uint64_t read_memory(int threads) const override { return s_.read_memory(threads); }
  Status read(size_t piece, const Box& sub, void* dst) override {
    note(piece, static_cast<uint64_t>(sub.numel()) * dtype_size(s_.pieces()[piece].dtype));
    return s_.read(piece, sub, dst);
  }
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override {
    auto e = s_.file_extent(piece, sub);
    if (e) note(piece, e->bytes);
    return e;
  }
  uint64_t staged_bytes(size_t piece, const Box& sub) override { return staged_ ? staged_->staged_bytes(piece, sub) : 0; }
  Status read_stage(size_t piece, const Box& sub, void* stage) override {
    if (!staged_) return Status::Internal("source has no staged reads");
    note(piece, static_cast<uint64_t>(sub.numel()) * dtype_size(s_.pieces()[piece].dtype));
    return staged_->read_stage(piece, sub, stage);
  }
  Status finish_stage(size_t piece, const Box& sub, const void* stage, void* dst, int64_t ld) override {
    if (!staged_) return Status::Internal("source has no staged reads");
    return staged_->finish_stage(piece, sub, stage, dst, ld);
  }
  void wrote(const std::string& file) { files_.push_back(file); }
  void finish(const Status& st) const {
    const char* dir = std::getenv("CKPT_DIST_TRACE");
    if (!dir || !*dir) return;
    nlohmann::json j = {{"rank", rank_}, {"nprocs", nprocs_}, {"pid", static_cast<int64_t>(getpid())},
                        {"ok", st.ok()}, {"error", st.ok() ? "" : st.to_string()}, {"files", files_},
                        {"source_pieces", pieces_}, {"source_bytes", bytes_}};
    std::ifstream io("/proc/self/io");
    uint64_t v = 0;
    for (std::string k; io >> k >> v;) j["io"][k.substr(0, k.size() - 1)] = v;  // "rchar: 123"
    std::ofstream(std::string(dir) + "/rank" + std::to_string(rank_) + ".json") << j.dump();
  }

 private:
  void note(size_t piece, uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    pieces_.insert(piece);
    bytes_ += bytes;
  }
  TensorSource& s_;
  StagedReads* staged_;
  int rank_, nprocs_;
  std::mutex mu_;
  std::set<size_t> pieces_;
  uint64_t bytes_ = 0;
  std::vector<std::string> files_;
};

}  // namespace

std::vector<size_t> files_for_process(const Plan& plan, int proc, int nprocs) {
  if (nprocs <= 1) {
    std::vector<size_t> all(plan.files.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return all;
  }
  std::vector<uint64_t> sizes;
  for (const FileWork& f : plan.files) sizes.push_back(f.bytes_written);
  return balanced_share(sizes, nprocs, proc);
}

namespace {

// A shard whose pieces are all handed to its writer, closing on another thread (its copies' last
// writes, HDF5's metadata, the fsync) while the next shard fills: the shard files are written two
// at a time instead of one after another with an fsync between (with a write pool; else closed
// before the next shard opens, as a deferred future). The future is declared after the
// writer: it is waited for before the writer goes.
struct ClosingShard {
  std::unique_ptr<store::ShardWriter> w;
  std::future<Result<std::vector<store::PieceRecord>>> records;
  const FileWork* fw = nullptr;
};

// Waits for the shard closing in `c` (if any): its records appended to `records`, in file order.
Status finish_closing(std::optional<ClosingShard>& c, TracedSource& src, nlohmann::json& records) {
  if (!c) return Status::Ok();
  Result<std::vector<store::PieceRecord>> recs = c->records.get();
  const std::string file = c->fw->file;
  c.reset();
  if (!recs.ok()) return recs.take_status();
  for (const auto& r : *recs) records.push_back(store::piece_record_to_json(r));
  src.wrote(file);
  return Status::Ok();
}

// Fills the shard files `mine` (indices into plan.files) from `src`, each through its own
// ShardWriter under `partial`, one filling while the one before closes; appends their piece records
// (JSON) to `records`.
Status fill_files(TracedSource& src, const SourceIndex& index, const Plan& plan, const std::vector<size_t>& mine,
                  const std::string& partial, const StoreExecOptions& opts, nlohmann::json& records) {
  uint64_t my_total = 0, my_done = 0;
  for (size_t f : mine) my_total += plan.files[f].bytes_written;
  std::optional<ClosingShard> closing;
  for (size_t f : mine) {
    const FileWork& fw = plan.files[f];
    std::vector<Piece> pieces;
    pieces.reserve(fw.pieces.size());
    for (size_t k : fw.pieces) pieces.push_back(plan.pieces[k]);
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<store::ShardWriter> w,
                          store::StoreWriter::open_rank(partial, fw.rank, plan.tensors, pieces, opts.store));
    ShardSink sink(w.get());
    ExecOptions eo = opts.exec;
    eo.only_pieces.clear();
    const uint64_t base = my_done;
    if (opts.exec.progress)
      eo.progress = [&, base](uint64_t d, uint64_t) { opts.exec.progress(base + d, my_total); };
    Status st = execute_into(src, index, sink, pieces, eo);
    if (!st.ok()) {
      w->abort();
      return st;  // `closing` is waited for on the way out
    }
    CKPT_RETURN_IF_ERROR(finish_closing(closing, src, records));
    store::ShardWriter* wp = w.get();
    closing.emplace();
    closing->w = std::move(w);
    closing->fw = &fw;
    // Only where the writes go through the write pool, whose buffers both shards share: a shard's
    // own buffers (copy stages, compressed chunks in flight) are budgeted for one shard at a time.
    closing->records = std::async(opts.store.write_pool ? std::launch::async : std::launch::deferred, [wp] { return wp->close(); });
    if (!opts.store.write_pool) CKPT_RETURN_IF_ERROR(finish_closing(closing, src, records));  // closed now
    my_done += fw.bytes_written;
  }
  return finish_closing(closing, src, records);
}

}  // namespace

Status execute_plan_to_store(TensorSource& src_in, const Plan& plan, const std::string& dst_in,
                             const StoreExecOptions& opts, Comm* dist) {
  std::string dst = dst_in;
  while (dst.size() > 1 && dst.back() == '/') dst.pop_back();
  const int rank = dist ? dist->rank() : 0;
  const int nprocs = dist ? dist->size() : 1;
  // Every wait below is for the other processes' I/O (rank 0 re-hashes the whole source before
  // committing): as long as their bytes take, so not bounded by CKPT_COMM_TIMEOUT_S. A rank that
  // dies ends the job through mpirun; one that fails says so when the processes agree.
  CommTimeoutScope peers_work(std::max(Comm::timeout_s(), kReshardWaitS));
  TracedSource src(src_in, rank, nprocs);
  const std::string partial = store::StoreWriter::partial_dir(dst);

  // Rank 0 prepares `<dst>.partial/shards`; everyone learns whether that worked.
  Status st;
  if (rank == 0) st = store::StoreWriter::prepare_partial(dst);
  if (dist) {
    CKPT_ASSIGN_OR_RETURN(const std::string text, dist->broadcast(st.to_json()));
    Status root = Status::from_json(text);
    if (!root.ok()) return rank == 0 ? root : std::move(root).with_context("rank 0 could not prepare '" + partial + "'");
  } else if (!st.ok()) {
    return st;
  }

  // Fill my files.
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(src));
  nlohmann::json my_records = nlohmann::json::array();
  st = fill_files(src, index, plan, files_for_process(plan, rank, nprocs), partial, opts, my_records);
  src.finish(st);

  // Everyone done and OK? Then gather the records and let rank 0 finalize.
  Status group = dist ? first_failure(*dist, st) : st;
  if (!group.ok()) {
    if (rank == 0) (void)remove_tree(partial);
    return st.ok() ? group : st;
  }
  const nlohmann::json mine = {{"records", std::move(my_records)},
                               {"note", opts.process_note ? opts.process_note() : std::string()}};
  std::vector<std::string> gathered{mine.dump()};
  if (dist) {
    auto g = dist->gather(gathered.front());
    if (!g.ok()) {
      if (rank == 0) (void)remove_tree(partial);
      return g.take_status();
    }
    gathered = std::move(*g);
  }
  Status fin;
  if (rank == 0) {
    fin = finalize_on_root(gathered, plan, dst, opts);
    if (!fin.ok()) (void)remove_tree(partial);
  }
  if (dist) {
    auto text = dist->broadcast(fin.to_json());
    if (!text.ok()) return rank == 0 ? fin : text.take_status();  // rank 0: committed or not, as fin says
    Status root = Status::from_json(*text);
    if (rank != 0 && !root.ok()) return std::move(root).with_context("rank 0 failed to finalize");
  }
  return fin;
}

}  // namespace ckpt
