// The zip writer against independent references: zlib's documented CRC-32 check value, and
// libzip (a separate implementation) reading back what we write, with consistency checks on,
// for plain and forced-ZIP64 archives, entries filled in interleaved slabs and from a file.
#include "formats/torch/zip/zip_writer.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zip.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "tests/temp_dir.h"

namespace ckpt::torch {
namespace {

using ckpt::testing::TempDirTest;

TEST(ZipCrc, CheckValueAndIncremental) {
  EXPECT_EQ(zip_crc32(0, "123456789", 9), 0xCBF43926u);  // the CRC-32 check value
  uint32_t c = zip_crc32(0, "1234", 4);
  EXPECT_EQ(zip_crc32(c, "56789", 5), 0xCBF43926u);
  EXPECT_EQ(zip_crc32(0, "", 0), 0u);
}

TEST(ZipLayout, DataIsAlignedAndOrdered) {
  ZipWriter w;
  std::vector<ZipEntrySpec> e;
  for (int i = 0; i < 20; ++i) e.push_back(ZipEntrySpec{std::string(static_cast<size_t>(i + 1), 'n') + std::to_string(i), uint64_t(i * 37)});
  ASSERT_TRUE(w.layout(e).ok());
  uint64_t prev_end = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    EXPECT_EQ(w.data_offset(i) % 64, 0u) << i;
    EXPECT_GE(w.data_offset(i), prev_end + 30 + e[i].name.size() + 4) << i;  // room for the local header
    prev_end = w.data_offset(i) + e[i].size;
  }
  EXPECT_FALSE(w.zip64());
  ZipWriter dup;
  EXPECT_FALSE(dup.layout({{"a", 1}, {"a", 2}}).ok());
  ZipWriter empty_name;
  EXPECT_FALSE(empty_name.layout({{"", 1}}).ok());
}

TEST(ZipLayout, Zip64WhenSizesOrOffsetsNeedIt) {
  ZipWriter small;
  ASSERT_TRUE(small.layout({{"a", 1000}, {"b", 0xFFFFFFFEull - 2000}}).ok());
  EXPECT_FALSE(small.zip64());
  ZipWriter big;  // one entry of 5 GiB: ZIP64 extra field (20 bytes) in its local header
  ASSERT_TRUE(big.layout({{"archive/data/0", 5ull << 30}, {"archive/version", 2}}).ok());
  EXPECT_TRUE(big.zip64());
  EXPECT_EQ(big.data_offset(0) % 64, 0u);
  EXPECT_GE(big.data_offset(0), 30u + 14 + 20 + 4);
  EXPECT_EQ(big.data_offset(1) % 64, 0u);
  // After the big entry: its 24-byte data descriptor, then the second local header (30 + 15 bytes
  // of name + a ZIP64 extra with its own offset, 12 bytes, as miniz writes past 4 GiB + FB).
  EXPECT_GE(big.data_offset(1), big.data_offset(0) + (5ull << 30) + 24 + 30 + 15 + 12 + 4);
  // Central directory: 46 + name + 20 (sizes) for the big entry, 46 + name + 12 (offset) for the
  // small one past 4 GiB; then the ZIP64 end record (56), locator (20) and the classic end (22).
  uint64_t cd_start = big.data_offset(1) + 2 + 24;
  EXPECT_EQ(big.total_size(), cd_start + (46 + 14 + 20) + (46 + 15 + 12) + 56 + 20 + 22);
}

class ZipWriterFile : public TempDirTest {
 protected:
  // Writes entries (content given) in interleaved slabs of 3 bytes, the second entry from a file.
  // `io` and `pool`: how the file is written (OutputFile: buffered, or O_DIRECT with or without a
  // WritePool whose writes are still in flight when finish() writes the headers).
  void write_zip(const std::string& path, const std::vector<std::pair<std::string, std::string>>& entries, bool zip64,
                 IoMode io = IoMode::kBuffered, WritePool* pool = nullptr) {
    std::string src_path = (root_ / "src.bin").string();
    std::ofstream(src_path, std::ios::binary) << entries[1].second;
    ZipWriter w(ZipWriterOptions{64, zip64});
    std::vector<ZipEntrySpec> specs;
    for (const auto& [n, c] : entries) specs.push_back({n, c.size()});
    ASSERT_TRUE(w.layout(specs).ok());
    EXPECT_EQ(w.zip64(), zip64);
    const uint64_t base = 100;  // an embedded zip: bytes before it belong to someone else
    auto out = OutputFile::open(path, O_RDWR | O_CREAT | O_TRUNC, io, base + w.total_size());
    ASSERT_TRUE(out.ok());
    const int fd = out->fd();
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(base + w.total_size())), 0);
    out->set_write_pool(pool);
    w.attach(*out, base, path);
    int sfd = ::open(src_path.c_str(), O_RDONLY);
    ASSERT_TRUE(w.write_from_file(1, sfd, 0, entries[1].second.size()).ok());
    ::close(sfd);
    std::vector<size_t> done(entries.size(), 0);
    done[1] = entries[1].second.size();
    for (bool more = true; more;) {
      more = false;
      for (size_t i = entries.size(); i-- > 0;) {
        size_t n = std::min<size_t>(3, entries[i].second.size() - done[i]);
        if (n == 0) continue;
        ASSERT_TRUE(w.write(i, entries[i].second.data() + done[i], n).ok());
        done[i] += n;
        more = true;
      }
    }
    EXPECT_FALSE(w.write(0, "x", 1).ok());  // past the declared size
    ASSERT_TRUE(w.finish().ok());
    ASSERT_TRUE(out->wait().ok());
    // Cut out the embedded zip for libzip.
    std::string all(base + w.total_size(), '\0');
    ASSERT_EQ(::pread(fd, all.data(), all.size(), 0), static_cast<ssize_t>(all.size()));
    ASSERT_TRUE(out->close().ok());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << all.substr(base);
  }
  void check_with_libzip(const std::string& path, const std::vector<std::pair<std::string, std::string>>& entries) {
    int err = 0;
    zip_t* z = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err);
    ASSERT_NE(z, nullptr) << "libzip error " << err;
    ASSERT_EQ(zip_get_num_entries(z, 0), static_cast<zip_int64_t>(entries.size()));
    for (size_t i = 0; i < entries.size(); ++i) {
      zip_stat_t st;
      ASSERT_EQ(zip_stat_index(z, i, 0, &st), 0);
      EXPECT_EQ(std::string(st.name), entries[i].first);
      EXPECT_EQ(st.size, entries[i].second.size());
      EXPECT_EQ(st.comp_method, ZIP_CM_STORE);
      EXPECT_EQ(st.crc, zip_crc32(0, entries[i].second.data(), entries[i].second.size()));
      zip_file_t* f = zip_fopen_index(z, i, 0);
      ASSERT_NE(f, nullptr);
      std::string got(entries[i].second.size() + 1, '\0');
      zip_int64_t n = zip_fread(f, got.data(), got.size());  // libzip checks the CRC at the end
      EXPECT_EQ(n, static_cast<zip_int64_t>(entries[i].second.size()));
      got.resize(static_cast<size_t>(std::max<zip_int64_t>(n, 0)));
      EXPECT_EQ(got, entries[i].second);
      zip_fclose(f);
    }
    zip_close(z);
  }
};

TEST_F(ZipWriterFile, LibzipReadsItBack) {
  std::string big(100000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + 1);
  std::vector<std::pair<std::string, std::string>> e{{"archive/data.pkl", "\x80\x02}q\x00."},
                                                     {"archive/data/0", big},
                                                     {"archive/empty", ""},
                                                     {"archive/version", "3\n"}};
  for (bool zip64 : {false, true})
    for (int how = 0; how < 3; ++how) {  // buffered; direct; direct through a pool of 2 x 16 KiB
      WritePool pool(2, 16u << 10);
      std::string path = (root_ / ((zip64 ? "z64_" : "z_") + std::to_string(how) + ".zip")).string();
      write_zip(path, e, zip64, how == 0 ? IoMode::kBuffered : IoMode::kDirect, how == 2 ? &pool : nullptr);
      check_with_libzip(path, e);
      if (how == 2) {
        EXPECT_GT(pool.stats().writes, 0u);
      }
    }
}

TEST_F(ZipWriterFile, RangesInAnyOrderGiveTheRightCrc) {
  std::string content(1000, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 13 + 5);
  std::string path = (root_ / "ranges.zip").string();
  ZipWriter w;
  ASSERT_TRUE(w.layout({{"a", content.size()}, {"b", 3}}).ok());
  auto out = OutputFile::open(path, O_RDWR | O_CREAT | O_TRUNC, IoMode::kBuffered, w.total_size());
  ASSERT_TRUE(out.ok());
  ASSERT_EQ(::ftruncate(out->fd(), static_cast<off_t>(w.total_size())), 0);
  w.attach(*out, 0, path);
  // Ranges of 7..70 bytes written back to front, with a gap filled last.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (uint64_t at = 0, k = 0; at < content.size(); ++k) {
    uint64_t n = std::min<uint64_t>(7 + (k * 29) % 64, content.size() - at);
    ranges.emplace_back(at, n);
    at += n;
  }
  std::reverse(ranges.begin(), ranges.end());
  std::swap(ranges[2], ranges.back());
  for (auto [at, n] : ranges) ASSERT_TRUE(w.write_at(0, at, content.data() + at, n).ok());
  EXPECT_FALSE(w.write_at(0, 10, "xx", 2).ok());    // overlaps what is written
  EXPECT_FALSE(w.write_at(1, 2, "xx", 2).ok());     // past the end
  ASSERT_TRUE(w.write_at(1, 1, "yz", 2).ok());
  EXPECT_FALSE(w.finish().ok());                    // byte 0 of "b" missing
  ASSERT_TRUE(w.write_at(1, 0, "x", 1).ok());
  ASSERT_TRUE(w.finish().ok());
  ASSERT_TRUE(out->close().ok());
  check_with_libzip(path, {{"a", content}, {"b", "xyz"}});
}

TEST_F(ZipWriterFile, IncompleteEntryIsRefused) {
  ZipWriter w;
  ASSERT_TRUE(w.layout({{"a", 4}}).ok());
  std::string path = (root_ / "x.zip").string();
  auto out = OutputFile::open(path, O_RDWR | O_CREAT | O_TRUNC, IoMode::kBuffered, 4);
  ASSERT_TRUE(out.ok());
  w.attach(*out, 0, path);
  ASSERT_TRUE(w.write(0, "abc", 3).ok());
  EXPECT_FALSE(w.finish().ok());
}

}  // namespace
}  // namespace ckpt::torch
