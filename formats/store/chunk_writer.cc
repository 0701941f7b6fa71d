#include "formats/store/chunk_writer.h"

#include <algorithm>
#include <cstring>

#include "formats/base/thread_name.h"
#include "formats/store/direct_vfd.h"
#include "formats/store/h5/h5_handles.h"

namespace ckpt::store {

ChunkWriter::~ChunkWriter() {
  for (auto& p : fifo_) p.stored.wait();  // no compression left running for a writer that is gone
}

size_t ChunkWriter::add(hid_t ds, const std::vector<hsize_t>& dims, const std::vector<hsize_t>& chunk, size_t esize, Codec codec, int level,
                        std::string desc, std::string tensor) {
  Stream s;
  s.ds = ds;
  s.grid = ChunkGrid::of(dims, chunk);
  s.esize = esize;
  s.codec = codec;
  s.level = level;
  s.desc = std::move(desc);
  s.tensor = std::move(tensor);
  streams_.push_back(std::move(s));
  return streams_.size() - 1;
}

Status ChunkWriter::write(size_t id, const void* data, uint64_t count) {
  CKPT_RETURN_IF_ERROR(error_);
  Stream& s = streams_.at(id);
  const char* src = static_cast<const char*>(data);
  std::vector<std::future<void>> read_done;  // tasks reading `data`: waited for on every return
  struct WaitReads {
    std::vector<std::future<void>>& f;
    ~WaitReads() {
      for (auto& x : f) x.wait();
    }
  } wait_reads{read_done};
  const bool direct_ok = encode_copies_input(s.codec, s.esize);
  while (count > 0) {
    const uint64_t c = s.grid.chunk_of(s.pos);
    const uint64_t in_chunk = s.pos - s.grid.first(c);
    const uint64_t take = std::min<uint64_t>(count, s.grid.valid(c) - in_chunk);
    if (direct_ok && in_chunk == 0 && take == s.grid.chunk_elems()) {  // a whole chunk here: no staging
      s.pos += take;
      CKPT_RETURN_IF_ERROR(submit(id, c, src, &read_done));
      src += take * s.esize;
      count -= take;
      continue;
    }
    if (s.stage.empty()) {
      const size_t bytes = s.grid.chunk_elems() * s.esize;
      if (!spare_.empty()) {
        s.stage = std::move(spare_.back());
        spare_.pop_back();
      }
      s.stage.resize(bytes);
      const size_t valid = s.grid.valid(c) * s.esize;
      if (valid < bytes) std::memset(s.stage.data() + valid, 0, bytes - valid);  // zeros after an edge chunk's rows
    }
    std::memcpy(s.stage.data() + in_chunk * s.esize, src, take * s.esize);
    s.pos += take;
    src += take * s.esize;
    count -= take;
    if (in_chunk + take == s.grid.valid(c)) CKPT_RETURN_IF_ERROR(submit(id, c));
  }
  return Status::Ok();
}

Status ChunkWriter::submit(size_t id, uint64_t chunk, const char* src, std::vector<std::future<void>>* read_done) {
  Stream& s = streams_[id];
  const Codec codec = s.codec;
  const int level = s.level;
  const size_t esize = s.esize;
  const size_t bytes = s.grid.chunk_elems() * esize;
  std::shared_ptr<std::vector<char>> buf;
  std::shared_ptr<std::promise<void>> done;
  if (src) {
    done = std::make_shared<std::promise<void>>();
    read_done->push_back(done->get_future());
  } else {
    buf = std::make_shared<std::vector<char>>(std::move(s.stage));
    s.stage.clear();
    src = buf->data();
  }
  std::shared_ptr<ChunkBuffer> out;
  if (!spare_out_.empty()) {
    out = std::move(spare_out_.back());
    spare_out_.pop_back();
  } else {
    out = std::make_shared<ChunkBuffer>();
  }
  fifo_.push_back({id, chunk, buf, out, pool_->submit([buf, out, done, src, bytes, codec, level, esize] {
                     name_store_thread("ckpt-encode");
                     if (!done) return encode_chunk_into(codec, level, esize, src, bytes, *out);
                     return encode_chunk_into(codec, level, esize, src, bytes, *out, [&done] { done->set_value(); });
                   })});
  // Bounded: the oldest chunk is written once the pipeline holds enough to keep the pool busy.
  while (fifo_.size() > std::min(2 * static_cast<size_t>(pool_->size()) + 1, max_inflight_)) CKPT_RETURN_IF_ERROR(write_front());
  return Status::Ok();
}

Status ChunkWriter::write_front() {
  Pending p = std::move(fifo_.front());
  fifo_.pop_front();
  Status stored = p.stored.get();
  if (p.raw && spare_.size() < 4) spare_.push_back(std::move(*p.raw));  // compressed: the task is done with it
  const Stream& s = streams_[p.id];
  if (!stored.ok()) {
    error_ = std::move(stored).with_tensor(s.tensor);
    return error_;
  }
  const std::vector<hsize_t> off = s.grid.offset(p.chunk);
  {
    auto lock = h5_lock();
    if (H5Dwrite_chunk(s.ds, H5P_DEFAULT, 0, off.data(), p.out->size, p.out->data.get()) < 0) {
      error_ = shard_io_failure("HDF5 write of chunk " + std::to_string(p.chunk) + " of " + s.desc, path_).with_tensor(s.tensor);
      return error_;
    }
  }
  spare_out_.push_back(std::move(p.out));  // at most the chunks in flight: 2 x pool size + 1
  return Status::Ok();
}

Status ChunkWriter::flush() {
  while (!fifo_.empty()) {
    Status st = write_front();
    if (!st.ok()) {
      for (auto& p : fifo_) p.stored.wait();
      fifo_.clear();
      return st;
    }
  }
  return error_;
}

}  // namespace ckpt::store
