// Test tool for the Python interop tests: writes a native store from raw little-endian tensor
// bytes (e.g. numpy's tofile) through the multi-rank path (open_rank per rank + finalize).
// Usage: store_write_tool SPEC.json, with SPEC =
//   {"dst": dir, "codec": "none"|"zstd"|"shuffle+zstd", "level": 1, "chunk_bytes": 4194304,
//    "digest": "xxh3-128"|"sha256" (default xxh3-128),
//    "ranks": 2, "metadata": {...},
//    "tensors": [{"name", "dtype", "shape", "data": raw file, "split": "whole"|"rows"|"cols"|"flat",
//                 "parts": k}]}
// Pieces are dealt to ranks round-robin. Exit 0 on success, 1 with a message otherwise.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "formats/store/store_writer.h"

using namespace ckpt;
using namespace ckpt::store;
using nlohmann::json;

static int fail(const std::string& m) {
  std::fprintf(stderr, "store_write_tool: %s\n", m.c_str());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) return fail("usage: store_write_tool SPEC.json");
  std::ifstream sf(argv[1]);
  json spec = json::parse(sf, nullptr, false);
  if (spec.is_discarded()) return fail("spec is not JSON");
  const std::string dst = spec.at("dst");
  StoreOptions opts;
  auto codec = codec_from_name(spec.value("codec", std::string("none")));
  if (!codec.ok()) return fail(codec.status().to_string());
  opts.codec = *codec;
  opts.zstd_level = spec.value("level", 1);
  opts.chunk_bytes = spec.value("chunk_bytes", uint64_t{4} << 20);
  opts.hash_threads = spec.value("threads", 1);        // the pool that compresses chunks
  const int64_t slab = spec.value("slab", int64_t{0});  // elements per write() call; 0: a piece at once
  auto digest = parse_digest_spec(spec.value("digest", std::string("xxh3-128")), "digest", opts);
  if (!digest.ok()) return fail(digest.status().to_string());
  opts = *digest;
  const int ranks = spec.value("ranks", 1);
  std::vector<TensorMeta> metas;
  std::vector<Piece> pieces;
  std::vector<std::vector<char>> data;  // per tensor, dense row-major
  for (const auto& t : spec.at("tensors")) {
    TensorMeta m;
    m.name = t.at("name");
    auto dt = dtype_from_name(t.at("dtype").get<std::string>());
    if (!dt.ok()) return fail(dt.status().to_string());
    m.dtype = *dt;
    m.shape = t.at("shape").get<Shape>();
    auto n = shape_numel(m.shape);
    if (!n.ok()) return fail(n.status().to_string());
    std::ifstream df(t.at("data").get<std::string>(), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(df)), std::istreambuf_iterator<char>());
    if (bytes.size() != static_cast<size_t>(*n) * dtype_size(m.dtype)) return fail("data size mismatch for " + m.name);
    data.push_back(std::move(bytes));
    const std::string split = t.value("split", std::string("whole"));
    const int64_t parts = t.value("parts", 1);
    const Box whole = Box::whole(m.shape);
    if (split == "whole" || m.shape.empty()) {
      pieces.push_back({m.name, Region{whole, 0, -1}, m.dtype});
    } else if (split == "flat") {
      for (int64_t k = 0; k < parts; ++k) pieces.push_back({m.name, Region{whole, *n * k / parts, *n * (k + 1) / parts}, m.dtype});
    } else {
      const size_t d = split == "rows" ? 0 : m.shape.size() - 1;
      for (int64_t k = 0; k < parts; ++k) {
        Box b = whole;
        b.offset[d] = m.shape[d] * k / parts;
        b.extent[d] = m.shape[d] * (k + 1) / parts - b.offset[d];
        pieces.push_back({m.name, Region{b, 0, -1}, m.dtype});
      }
    }
    metas.push_back(std::move(m));
  }
  Status st = StoreWriter::prepare_partial(dst);
  if (!st.ok()) return fail(st.to_string());
  std::vector<PieceRecord> all;
  for (int rank = 0; rank < ranks; ++rank) {
    std::vector<Piece> mine;
    for (size_t i = 0; i < pieces.size(); ++i)
      if (static_cast<int>(i % static_cast<size_t>(ranks)) == rank) mine.push_back(pieces[i]);
    auto sw = StoreWriter::open_rank(StoreWriter::partial_dir(dst), rank, metas, mine, opts);
    if (!sw.ok()) return fail(sw.status().to_string());
    for (size_t k = 0; k < mine.size(); ++k) {
      size_t ti = 0;
      while (metas[ti].name != mine[k].tensor) ++ti;
      const size_t es = dtype_size(metas[ti].dtype);
      // Gather the piece in storage order box by box (each box's row-major run is contiguous).
      std::vector<char> buf(static_cast<size_t>(mine[k].region.numel()) * es);
      size_t at = 0;
      for (const Box& b : mine[k].region.boxes()) {
        copy_box(data[ti].data(), Box::whole(metas[ti].shape), buf.data() + at, b, b, es);
        at += static_cast<size_t>(b.numel()) * es;
      }
      const int64_t numel = mine[k].region.numel();
      for (int64_t a = 0; st.ok() && a < numel; a += slab > 0 ? slab : numel)
        st = (*sw)->write(k, buf.data() + static_cast<size_t>(a) * es, std::min(numel - a, slab > 0 ? slab : numel));
      if (!st.ok()) return fail(st.to_string());
    }
    auto recs = (*sw)->close();
    if (!recs.ok()) return fail(recs.status().to_string());
    all.insert(all.end(), recs->begin(), recs->end());
  }
  st = StoreWriter::finalize(dst, metas, all, spec.value("metadata", json::object()), opts);
  if (!st.ok()) return fail(st.to_string());
  return 0;
}
