// MemoryFit (converters/jobs/memory_fit.h): the floor is the reserve plus the smallest chunk budget; the
// note is there only below the floor and tells what was asked, what is needed, and what to give.
#include "converters/jobs/memory_fit.h"

#include <gtest/gtest.h>

#include "formats/io/source_blocks.h"

namespace ckpt {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(MemoryFit, FloorIsTheReservePlusTheSmallestChunkBudget) {
  auto f = memory_fit("64M", 100 * kMiB);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->max_memory, 64 * kMiB);
  EXPECT_EQ(f->floor, 100 * kMiB + kMinChunkBudgetBytes);
  EXPECT_TRUE(f->below_floor());
  EXPECT_EQ(f->to_json(), (nlohmann::json{{"max_memory", 64 * kMiB}, {"floor", 104 * kMiB}, {"read_ahead", 0}}));
}

TEST(MemoryFit, ReadAheadIsReportedAndLeftOutOfTheFloor) {
  SourceBlocks blocks(64 * kMiB, 8);
  auto f = memory_fit("256M", 24 * kMiB + 8 * kMiB + blocks.capacity(), &blocks);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->read_ahead, 64 * kMiB);
  EXPECT_EQ(f->floor, 32 * kMiB + kMinChunkBudgetBytes);  // the reserve without the read-ahead
  EXPECT_FALSE(f->below_floor());
}

TEST(MemoryFit, NoteBelowTheFloorNamesBudgetFloorThreadsAndTheFix) {
  auto f = memory_fit("64M", 100 * kMiB);
  ASSERT_TRUE(f.ok());
  const std::string note = f->note(2);
  EXPECT_NE(note.find("--max-memory 64 MiB is below the 104 MiB"), std::string::npos) << note;
  EXPECT_NE(note.find("--threads 2"), std::string::npos) << note;
  EXPECT_NE(note.find("Give --max-memory 104M or more"), std::string::npos) << note;
}

TEST(MemoryFit, NoNoteAtOrAboveTheFloor) {
  auto at = memory_fit("52M", 48 * kMiB);
  ASSERT_TRUE(at.ok());
  EXPECT_FALSE(at->below_floor());
  EXPECT_EQ(at->note(2), "");
  auto above = memory_fit("1G", 48 * kMiB);
  ASSERT_TRUE(above.ok());
  EXPECT_EQ(above->note(4), "");
}

TEST(MemoryFit, FloorRoundsUpToWholeMiBInTheNote) {
  auto f = memory_fit("1M", 48 * kMiB + 1);  // 52 MiB + 1 byte: ask for 53M, never less than needed
  ASSERT_TRUE(f.ok());
  EXPECT_NE(f->note(1).find("Give --max-memory 53M"), std::string::npos) << f->note(1);
}

TEST(MemoryFit, BadBudgetNamesTheFlag) {
  auto f = memory_fit("lots", 0);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("--max-memory"), std::string::npos) << f.status().to_string();
}

}  // namespace
}  // namespace ckpt
