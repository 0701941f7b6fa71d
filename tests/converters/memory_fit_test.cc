// How a job fits --max-memory (converters/jobs/memory_fit.h): the floor is the reserve plus the
// smallest chunk budget; the note is there only below the floor and tells what was asked, what is
// needed, and what to give; the store writer takes more than its least only beside 64 MiB of chunks;
// the read-ahead takes what is left beside 32 MiB of chunks, within [64, 512] MiB. Expected values
// are worked out here from the rules, not read back from the code.
#include "converters/jobs/memory_fit.h"

#include <gtest/gtest.h>

#include "formats/io/output_file.h"
#include "formats/io/source_blocks.h"
#include "reshard/executor.h"
#include "reshard/store_reshard.h"

namespace ckpt {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(MemoryFit, FloorIsTheReservePlusTheSmallestChunkBudget) {
  const MemoryFit f = memory_fit(64 * kMiB, 100 * kMiB);
  EXPECT_EQ(f.max_memory, 64 * kMiB);
  EXPECT_EQ(f.floor, 100 * kMiB + kMinChunkBudgetBytes);
  EXPECT_TRUE(f.below_floor());
  EXPECT_EQ(f.to_json(), (nlohmann::json{{"max_memory", 64 * kMiB}, {"floor", 104 * kMiB}, {"read_ahead", 0}, {"write_pool", 0}}));
}

TEST(MemoryFit, ReadAheadIsReportedAndLeftOutOfTheFloor) {
  SourceBlocks blocks(64 * kMiB, 8);
  const MemoryFit f = memory_fit(256 * kMiB, 24 * kMiB + 8 * kMiB + blocks.capacity(), &blocks);
  EXPECT_EQ(f.read_ahead, 64 * kMiB);
  EXPECT_EQ(f.floor, 32 * kMiB + kMinChunkBudgetBytes);  // the reserve without the read-ahead
  EXPECT_FALSE(f.below_floor());
}

TEST(MemoryFit, NoteBelowTheFloorNamesBudgetFloorThreadsAndTheFix) {
  const std::string note = memory_fit(64 * kMiB, 100 * kMiB).note(2);
  EXPECT_NE(note.find("--max-memory 64 MiB is below the 104 MiB"), std::string::npos) << note;
  EXPECT_NE(note.find("--threads 2"), std::string::npos) << note;
  EXPECT_NE(note.find("Give --max-memory 104M or more"), std::string::npos) << note;
}

TEST(MemoryFit, NoNoteAtOrAboveTheFloor) {
  const MemoryFit at = memory_fit(52 * kMiB, 48 * kMiB);
  EXPECT_FALSE(at.below_floor());
  EXPECT_EQ(at.note(2), "");
  EXPECT_EQ(memory_fit(1024 * kMiB, 48 * kMiB).note(4), "");
}

TEST(MemoryFit, FloorRoundsUpToWholeMiBInTheNote) {
  const MemoryFit f = memory_fit(1 * kMiB, 48 * kMiB + 1);  // 52 MiB + 1 byte: ask for 53M, never less than needed
  EXPECT_NE(f.note(1).find("Give --max-memory 53M"), std::string::npos) << f.note(1);
}

TEST(ChunkBudget, WhatIsLeftBesideTheReserveNeverLessThanTheLeast) {
  // Above the floor: the chunks get the budget less the reserve.
  EXPECT_EQ(chunk_bytes_within(256 * kMiB, 2, 4, 2, 48 * kMiB), exec_chunk_bytes(208 * kMiB, 2, 4, 2));
  // At or below it: the least chunk budget, whatever --max-memory says.
  EXPECT_EQ(chunk_bytes_within(52 * kMiB, 2, 4, 2, 48 * kMiB), exec_chunk_bytes(kMinChunkBudgetBytes, 2, 4, 2));
  EXPECT_EQ(chunk_bytes_within(1 * kMiB, 3, 2, 2, 48 * kMiB), exec_chunk_bytes(kMinChunkBudgetBytes, 3, 2, 2));
}

TEST(ReadAheadFit, TakesWhatIsLeftBesideTheStagesAndThe32MiBOfChunks) {
  // 256M, reserve 48 MiB, 4 copy threads (16 MiB of stages): 256 - 48 - 16 - 32 = 160 MiB ahead.
  const ReadAheadFit f = fit_read_ahead(256 * kMiB, 48 * kMiB, 4);
  ASSERT_TRUE(f.blocks);
  EXPECT_EQ(f.blocks->capacity(), 160 * kMiB);
  EXPECT_EQ(f.bytes, 160 * kMiB + 4 * kCopyThreadReadAheadBytes);
}

TEST(ReadAheadFit, NoneBelow64MiBAndAtMost512MiB) {
  // 48 + 16 + 32 + 63 MiB: one MiB short of the least read-ahead.
  EXPECT_FALSE(fit_read_ahead((48 + 16 + 32 + 63) * kMiB, 48 * kMiB, 4).blocks);
  const ReadAheadFit least = fit_read_ahead((48 + 16 + 32 + 64) * kMiB, 48 * kMiB, 4);
  ASSERT_TRUE(least.blocks);
  EXPECT_EQ(least.blocks->capacity(), 64 * kMiB);
  const ReadAheadFit most = fit_read_ahead(8192 * kMiB, 48 * kMiB, 4);
  ASSERT_TRUE(most.blocks);
  EXPECT_EQ(most.blocks->capacity(), 512 * kMiB);
  // Whole blocks only: 70 MiB of room reads 64 MiB ahead (8 MiB blocks).
  EXPECT_EQ(fit_read_ahead((48 + 16 + 32 + 70) * kMiB, 48 * kMiB, 4).blocks->capacity(), 64 * kMiB);
}

TEST(StoreWriterFit, UncompressedTakesTwiceTheThreadsOnlyBeside64MiBOfChunks) {
  const uint64_t extra = 2 * kCopyThreadBytes;  // --threads 2
  store::StoreOptions short_of;
  short_of.io = IoMode::kBuffered;
  EXPECT_EQ(fit_store_writer(kStoreWriterReserveBytes + extra + 64 * kMiB - 1, 2, short_of), kStoreWriterReserveBytes);
  EXPECT_EQ(short_of.hash_threads, 2);
  store::StoreOptions enough;
  enough.io = IoMode::kBuffered;
  EXPECT_EQ(fit_store_writer(kStoreWriterReserveBytes + extra + 64 * kMiB, 2, enough), kStoreWriterReserveBytes + extra);
  EXPECT_EQ(enough.hash_threads, 4);
  EXPECT_FALSE(enough.read_ahead);  // buffered: mapped reads, no read-ahead
}

TEST(StoreWriterFit, DirectOrAColdSourceUnderAutoReadsAhead) {
  store::StoreOptions direct;
  direct.io = IoMode::kDirect;
  // 256M, 4 copy threads: 256 - 48 - 16 - 32 = 160 MiB beside the chunks: the write pool takes
  // what 128 MiB of read-ahead leaves, 32 MiB (2 x 16 MiB requests in flight), the read-ahead the
  // rest; reserved with the stages instead of the copy buffers.
  EXPECT_EQ(fit_store_writer(256 * kMiB, 2, direct), kStoreWriterReserveBytes + 16 * kMiB + 32 * kMiB + 128 * kMiB);
  ASSERT_TRUE(direct.read_ahead);
  EXPECT_EQ(direct.read_ahead->capacity(), 128 * kMiB);
  ASSERT_TRUE(direct.write_pool);
  EXPECT_EQ(direct.write_pool->memory(), 32 * kMiB);
  store::StoreOptions warm, cold;
  warm.io = cold.io = IoMode::kAuto;
  fit_store_writer(256 * kMiB, 2, warm, /*cold_source=*/false);
  fit_store_writer(256 * kMiB, 2, cold, /*cold_source=*/true);
  EXPECT_FALSE(warm.read_ahead);
  EXPECT_TRUE(cold.read_ahead);
  EXPECT_TRUE(warm.write_pool && cold.write_pool);  // auto writes through the pool, which chooses per run
}

// The write pool: none for buffered or compressed stores, or when the budget holds fewer than two
// of its buffers; its bytes are counted in what the writer reserves, not in the job's floor.
TEST(StoreWriterFit, WritePoolOnlyWhereTheBudgetHoldsIt) {
  store::StoreOptions buffered;
  buffered.io = IoMode::kBuffered;
  fit_store_writer(1024 * kMiB, 2, buffered);
  EXPECT_FALSE(buffered.write_pool);
  store::StoreOptions zstd;
  zstd.codec = store::Codec::kShuffleZstd;
  zstd.io = IoMode::kDirect;
  fit_store_writer(1024 * kMiB, 2, zstd);
  EXPECT_FALSE(zstd.write_pool);
  const uint64_t extra = 2 * kCopyThreadBytes;
  store::StoreOptions tight;
  tight.io = IoMode::kAuto;
  EXPECT_EQ(fit_store_writer(kStoreWriterReserveBytes + extra + 64 * kMiB + 31 * kMiB, 2, tight), kStoreWriterReserveBytes + extra);
  EXPECT_FALSE(tight.write_pool);
  store::StoreOptions two;
  two.io = IoMode::kAuto;
  const uint64_t r = fit_store_writer(kStoreWriterReserveBytes + extra + 64 * kMiB + 32 * kMiB, 2, two);
  ASSERT_TRUE(two.write_pool);
  EXPECT_EQ(r, kStoreWriterReserveBytes + extra + 32 * kMiB);
  const MemoryFit fit = memory_fit(kStoreWriterReserveBytes + extra + 96 * kMiB, r, nullptr, two.write_pool.get());
  EXPECT_EQ(fit.write_pool, 32 * kMiB);
  EXPECT_EQ(fit.floor, kStoreWriterReserveBytes + extra + kMinChunkBudgetBytes);
}

TEST(StoreWriterFit, CompressedChunksInFlightReservedBeside64MiBOfChunksElseThree) {
  store::StoreOptions so;
  so.codec = store::Codec::kShuffleZstd;
  const uint64_t per_chunk = 2 * so.chunk_bytes, want = (2 * 2 + 2) * per_chunk;  // --threads 2
  EXPECT_EQ(fit_store_writer(kStoreWriterReserveBytes + want + 64 * kMiB, 2, so),
            kStoreWriterReserveBytes + want + 2 * so.chunk_bytes);
  EXPECT_EQ(so.chunk_memory, want);
  EXPECT_EQ(so.hash_threads, 2);
  store::StoreOptions tight;
  tight.codec = store::Codec::kShuffleZstd;
  EXPECT_EQ(fit_store_writer(kStoreWriterReserveBytes + want + 64 * kMiB - 1, 2, tight),
            kStoreWriterReserveBytes + 3 * per_chunk + 2 * tight.chunk_bytes);
  EXPECT_EQ(tight.chunk_memory, 3 * per_chunk);
}

}  // namespace
}  // namespace ckpt
