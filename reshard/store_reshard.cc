#include "reshard/store_reshard.h"

#include <algorithm>

#include "formats/store/fs_util.h"
#include "formats/store/manifest.h"
#include "reshard/dist.h"

namespace ckpt {

namespace {

// Adapts one rank's ShardWriter to the TensorSink the executor fills (begin/commit are the
// caller's business).
class ShardSink final : public TensorSink {
 public:
  explicit ShardSink(store::ShardWriter* w) : w_(w) {}
  Status begin(const std::vector<TensorMeta>&, const std::vector<Piece>&, const nlohmann::json&) override {
    return Status::Ok();
  }
  Status write(size_t piece, const void* data, int64_t count) override { return w_->write(piece, data, count); }
  bool accepts_file_extents() const override { return w_->accepts_file_extents(); }
  Status write_from_file(size_t piece, const FileExtent& src, int64_t count) override {
    return w_->write_from_file(piece, src, count);
  }
  Status commit() override { return Status::Ok(); }
  void abort() override {}

 private:
  store::ShardWriter* w_;
};

}  // namespace

std::vector<size_t> files_for_process(const Plan& plan, int proc, int nprocs) {
  if (nprocs <= 1) {
    std::vector<size_t> all(plan.files.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    return all;
  }
  std::vector<size_t> order(plan.files.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return plan.files[a].bytes_written > plan.files[b].bytes_written;
  });
  std::vector<uint64_t> load(static_cast<size_t>(nprocs), 0);
  std::vector<size_t> mine;
  for (size_t f : order) {
    size_t best = 0;
    for (size_t p = 1; p < load.size(); ++p)
      if (load[p] < load[best]) best = p;
    load[best] += plan.files[f].bytes_written + 1;
    if (static_cast<int>(best) == proc) mine.push_back(f);
  }
  std::sort(mine.begin(), mine.end());
  return mine;
}

namespace {

// Fills the shard files `mine` (indices into plan.files) from `src`, each through its own
// ShardWriter under `partial`; appends their piece records (JSON) to `records`.
Status fill_files(TensorSource& src, const SourceIndex& index, const Plan& plan, const std::vector<size_t>& mine,
                  const std::string& partial, const StoreExecOptions& opts, nlohmann::json& records) {
  uint64_t my_total = 0, my_done = 0;
  for (size_t f : mine) my_total += plan.files[f].bytes_written;
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
      return st;
    }
    CKPT_ASSIGN_OR_RETURN(std::vector<store::PieceRecord> recs, w->close());
    for (const auto& r : recs) records.push_back(store::piece_record_to_json(r));
    my_done += fw.bytes_written;
  }
  return Status::Ok();
}

// The piece records gathered from every process (one JSON array each), checked against the plan.
Status parse_records(const std::vector<std::string>& gathered, const Plan& plan,
                     std::vector<store::PieceRecord>& records) {
  for (const std::string& g : gathered) {
    auto j = nlohmann::json::parse(g, nullptr, false);
    if (j.is_discarded() || !j.is_array()) return Status::Internal("bad piece records gathered from a reshard process");
    for (const auto& rj : j) {
      CKPT_ASSIGN_OR_RETURN(store::PieceRecord r, store::piece_record_from_json(rj));
      records.push_back(std::move(r));
    }
  }
  if (records.size() != plan.pieces.size())
    return Status::Internal("gathered " + std::to_string(records.size()) + " piece records, the plan has " +
                            std::to_string(plan.pieces.size()));
  return Status::Ok();
}

}  // namespace

Status execute_plan_to_store(TensorSource& src, const Plan& plan, const std::string& dst_in,
                             const StoreExecOptions& opts, Dist* dist) {
  std::string dst = dst_in;
  while (dst.size() > 1 && dst.back() == '/') dst.pop_back();
  const int rank = dist ? dist->rank() : 0;
  const int nprocs = dist ? dist->size() : 1;
  const std::string partial = store::StoreWriter::partial_dir(dst);

  // Rank 0 prepares `<dst>.partial/shards`; everyone learns whether that worked.
  Status st;
  if (rank == 0) st = store::StoreWriter::prepare_partial(dst);
  if (dist) {
    std::string msg = dist->broadcast(st.ok() ? "" : st.to_string());
    if (!msg.empty()) return st.ok() ? Status::Io("rank 0 could not prepare '" + partial + "': " + msg) : st;
  } else if (!st.ok()) {
    return st;
  }

  // Fill my files.
  CKPT_ASSIGN_OR_RETURN(SourceIndex index, SourceIndex::build(src));
  nlohmann::json my_records = nlohmann::json::array();
  st = fill_files(src, index, plan, files_for_process(plan, rank, nprocs), partial, opts, my_records);

  // Everyone done and OK? Then gather the records and let rank 0 finalize.
  const bool all = dist ? dist->all_ok(st.ok()) : st.ok();
  if (!all) {
    if (dist) dist->barrier();
    if (rank == 0) (void)store::remove_tree(partial);
    return st.ok() ? Status::Io("another reshard process failed; nothing was committed") : st;
  }
  std::vector<std::string> gathered =
      dist ? dist->gather(my_records.dump()) : std::vector<std::string>{my_records.dump()};
  Status fin;
  if (rank == 0) {
    std::vector<store::PieceRecord> records;
    fin = parse_records(gathered, plan, records);
    if (fin.ok() && opts.before_commit) fin = opts.before_commit();
    if (fin.ok()) fin = store::StoreWriter::finalize(dst, plan.tensors, std::move(records), plan.metadata, opts.store);
    if (!fin.ok()) (void)store::remove_tree(partial);
  }
  if (dist) {
    std::string msg = dist->broadcast(fin.ok() ? "" : fin.to_string());
    if (rank != 0 && !msg.empty()) return Status::Io("rank 0 failed to finalize: " + msg);
  }
  return fin;
}

}  // namespace ckpt
