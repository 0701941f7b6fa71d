// Executor threads: source reads stay on the calling thread, sink writes run in chunk order on
// one writer thread, and a failed write or cast stops every later write and aborts the sink.
#include "reshard/executor.h"

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "reshard/memory_io.h"
#include "tests/reshard/executor_world.h"

namespace ckpt {
namespace {

using namespace exec_test;

// A sink that records which thread writes and fails the `fail_at`-th write (0-based; -1 never).
class RecordingSink : public TensorSink {
 public:
  explicit RecordingSink(int fail_at = -1) : fail_at_(fail_at) {}
  Status begin(const std::vector<TensorMeta>& t, const std::vector<Piece>& p, const nlohmann::json& m) override {
    return inner.begin(t, p, m);
  }
  Status write(size_t piece, const void* data, int64_t count) override {
    writer_threads.insert(std::this_thread::get_id());
    if (writes++ == fail_at_) return Status::Io("disk full (injected)");
    return inner.write(piece, data, count);
  }
  Status commit() override { return inner.commit(); }
  void abort() override { inner.abort(); }
  MemorySink inner;
  std::set<std::thread::id> writer_threads;
  int writes = 0;

 private:
  int fail_at_;
};

class RecordingSource : public MemorySource {
 public:
  using MemorySource::MemorySource;
  Status read(size_t piece, const Box& sub, void* dst) override {
    reader_threads.insert(std::this_thread::get_id());
    return MemorySource::read(piece, sub, dst);
  }
  std::set<std::thread::id> reader_threads;
};

TEST(Executor, ReadsOnCallerWritesInOrderOnOneWriterThread) {
  World w;
  w.tensors = {{"w", DType::kF32, {16, 8}}};
  w.global = {make_global({16, 8}, 4, 21)};
  std::vector<Piece> src_pieces = {{"w", Region{Box{{0, 0}, {16, 3}}}, DType::kF32},
                                   {"w", Region{Box{{0, 3}, {16, 5}}}, DType::kF32}};
  std::vector<Piece> dst = {{"w", Region{Box{{0, 0}, {9, 8}}}, DType::kF32}, {"w", Region{Box{{9, 0}, {7, 8}}}, DType::kF32}};
  for (int threads : {1, 2, 3}) {
    RecordingSource src(make_source(w, src_pieces));
    RecordingSink sink;
    ExecOptions o;
    o.threads = threads;
    o.max_chunk_bytes = 40;  // many chunks in flight
    std::vector<uint64_t> progress;
    o.progress = [&](uint64_t done, uint64_t) {
      EXPECT_EQ(src.reader_threads.count(std::this_thread::get_id()), 1u);  // the caller's thread
      progress.push_back(done);
    };
    ASSERT_TRUE(execute(src, sink, w.tensors, dst, {}, o).ok());
    EXPECT_EQ(src.reader_threads, std::set<std::thread::id>{std::this_thread::get_id()}) << threads;
    ASSERT_EQ(sink.writer_threads.size(), 1u) << threads;
    EXPECT_EQ(*sink.writer_threads.begin() == std::this_thread::get_id(), threads == 1) << threads;
    EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
    ASSERT_FALSE(progress.empty());
    EXPECT_EQ(progress.back(), 16u * 8 * 4);
    for (size_t i = 0; i < dst.size(); ++i)
      EXPECT_EQ(sink.inner.checkpoint().data[i], naive_extract(w.global[0], {16, 8}, dst[i].region, 4)) << threads;
  }
}

TEST(Executor, WriteErrorStopsLaterWritesAndAborts) {
  World w;
  w.tensors = {{"w", DType::kF32, {16, 8}}};
  w.global = {make_global({16, 8}, 4, 22)};
  MemorySource src(make_source(w, {{"w", Region{Box::whole({16, 8})}, DType::kF32}}));
  std::vector<Piece> dst = {{"w", Region{Box::whole({16, 8})}, DType::kF32}};
  for (int threads : {1, 2, 3}) {
    RecordingSink sink(/*fail_at=*/3);
    ExecOptions o;
    o.threads = threads;
    o.max_chunk_bytes = 32;  // 16 chunks
    Status st = execute(src, sink, w.tensors, dst, {}, o);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.kind(), ErrorKind::kIo) << st.to_string();
    EXPECT_NE(st.to_string().find("injected"), std::string::npos) << st.to_string();
    EXPECT_NE(st.to_string().find("writing target piece 0"), std::string::npos) << st.to_string();
    EXPECT_EQ(sink.writes, 4) << "no write after the failed one, threads " << threads;
    EXPECT_TRUE(sink.inner.aborted());
    EXPECT_FALSE(sink.inner.committed());
  }
}

TEST(Executor, CastErrorInWorkerStopsWritesAndAborts) {
  std::vector<TensorMeta> t = {{"w", DType::kF32, {64}}};
  std::vector<float> g(64, 1.0f);
  g[40] = 1e30f;  // overflows fp16
  MemoryCheckpoint c;
  c.tensors = t;
  c.pieces = {{"w", Region{Box::whole({64})}, DType::kF32}};
  c.data.emplace_back(reinterpret_cast<const uint8_t*>(g.data()), reinterpret_cast<const uint8_t*>(g.data()) + 256);
  MemorySource src(std::move(c));
  for (int threads : {1, 2, 3}) {
    RecordingSink sink;
    ExecOptions o;
    o.threads = threads;
    o.max_chunk_bytes = 16;  // 8 halves per chunk: chunk 5 holds element 40
    Status st = execute(src, sink, {{"w", DType::kF16, {64}}}, {{"w", Region{Box::whole({64})}, DType::kF16}}, {}, o);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.kind(), ErrorKind::kOverflow) << st.to_string();
    EXPECT_LE(sink.writes, 5) << "nothing written after the failed chunk, threads " << threads;
    EXPECT_TRUE(sink.inner.aborted());
  }
}

}  // namespace
}  // namespace ckpt
