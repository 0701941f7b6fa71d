#include "formats/store/chunk_codec.h"

#include <zstd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "formats/store/h5/zstd_filter.h"

namespace ckpt::store {

ChunkGrid ChunkGrid::of(const std::vector<hsize_t>& dims, const std::vector<hsize_t>& chunk) {
  ChunkGrid g;
  g.dims = dims;
  g.chunk = chunk;
  // piece_chunk_dims cuts the dims before k to 1 and takes those after k whole: k is the last dim
  // not taken whole (every dim whole: k = 0, one chunk).
  g.k = 0;
  for (size_t d = dims.size(); d-- > 0;)
    if (chunk[d] != dims[d]) {
      g.k = d;
      break;
    }
  for (size_t d = g.k + 1; d < dims.size(); ++d) g.inner *= dims[d];
  g.per_run = dims.empty() ? 1 : (dims[g.k] + chunk[g.k] - 1) / chunk[g.k];
  uint64_t outer = 1;
  for (size_t d = 0; d < g.k; ++d) outer *= dims[d];
  g.num_chunks = outer * g.per_run;
  return g;
}

uint64_t ChunkGrid::first(uint64_t c) const {
  const uint64_t o = c / per_run, j = c % per_run;
  return o * dims[k] * inner + j * chunk[k] * inner;
}

uint64_t ChunkGrid::valid(uint64_t c) const {
  const uint64_t j = c % per_run;
  const uint64_t rows = std::min<uint64_t>(chunk[k], dims[k] - j * chunk[k]);
  return rows * inner;
}

std::vector<hsize_t> ChunkGrid::offset(uint64_t c) const {
  std::vector<hsize_t> off(dims.size(), 0);
  uint64_t o = c / per_run;
  off[k] = (c % per_run) * chunk[k];
  for (size_t d = k; d-- > 0;) {
    off[d] = o % dims[d];
    o /= dims[d];
  }
  return off;
}

uint64_t ChunkGrid::chunk_of(uint64_t element) const {
  const uint64_t run = dims[k] * inner;
  return (element / run) * per_run + (element % run) / (chunk[k] * inner);
}

namespace {

// H5Z_FILTER_SHUFFLE of 2-byte elements (bf16, fp16) with SSE2, 16 elements at a time: low bytes
// are the words masked and packed, high bytes the words shifted and packed; the inverse
// interleaves them again. (The generic byte loop runs at ~2.5 GB/s, a third of the zstd time.)
// Returns the elements done; the caller finishes the rest.
size_t shuffle2_sse2(const unsigned char* src, unsigned char* dst, size_t n, bool inverse) {
  size_t i = 0;
#if defined(__SSE2__)
  if (!inverse) {
    const __m128i mask = _mm_set1_epi16(0x00FF);
    for (; i + 16 <= n; i += 16) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i + 16));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm_packus_epi16(_mm_and_si128(a, mask), _mm_and_si128(b, mask)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + n + i), _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
    }
  } else {
    for (; i + 16 <= n; i += 16) {
      const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + n + i));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), _mm_unpacklo_epi8(lo, hi));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i + 16), _mm_unpackhi_epi8(lo, hi));
    }
  }
#else
  (void)src, (void)dst, (void)n, (void)inverse;
#endif
  return i;
}

// H5Z_FILTER_SHUFFLE: n = bytes / esize elements; byte j of element i goes to j * n + i; the
// bytes % esize left over stay at the end unchanged.
void shuffle_bytes(const unsigned char* src, unsigned char* dst, size_t bytes, size_t esize, bool inverse) {
  const size_t n = bytes / esize;
  const size_t first = esize == 2 ? shuffle2_sse2(src, dst, n, inverse) : 0;
  for (size_t j = 0; j < esize; ++j) {
    unsigned char* plane = inverse ? nullptr : dst + j * n;
    const unsigned char* splane = inverse ? src + j * n : nullptr;
    if (!inverse)
      for (size_t i = first; i < n; ++i) plane[i] = src[i * esize + j];
    else
      for (size_t i = first; i < n; ++i) dst[i * esize + j] = splane[i];
  }
  std::memcpy(dst + n * esize, src + n * esize, bytes - n * esize);
}

struct CctxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DctxFree {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};

}  // namespace

void ChunkBuffer::reserve(size_t n) {
  if (n <= capacity) return;
  data = std::make_unique_for_overwrite<char[]>(n);
  capacity = n;
}

Status encode_chunk_into(Codec codec, int level, size_t esize, const void* src, size_t bytes, ChunkBuffer& out,
                         const std::function<void()>& src_done) {
  thread_local std::unique_ptr<ZSTD_CCtx, CctxFree> cctx(ZSTD_createCCtx());
  thread_local std::vector<unsigned char> shuffled;
  struct SrcDone {  // src_done on every path, once
    const std::function<void()>* f;
    void operator()() {
      if (f && *f) (*f)();
      f = nullptr;
    }
    ~SrcDone() { (*this)(); }
  } done{&src_done};
  const void* in = src;
  if (encode_copies_input(codec, esize)) {
    shuffled.resize(bytes);
    shuffle_bytes(static_cast<const unsigned char*>(src), shuffled.data(), bytes, esize, false);
    in = shuffled.data();
    done();
  }
  out.reserve(ZSTD_compressBound(bytes));
  ZSTD_CCtx_reset(cctx.get(), ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_checksumFlag, 1);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_contentSizeFlag, 1);
  const size_t got = ZSTD_compress2(cctx.get(), out.data.get(), out.capacity, in, bytes);
  if (ZSTD_isError(got)) return Status::Internal(std::string("zstd compression failed: ") + ZSTD_getErrorName(got));
  out.size = got;
  return Status::Ok();
}

Result<std::string> encode_chunk(Codec codec, int level, size_t esize, const void* src, size_t bytes) {
  thread_local ChunkBuffer buf;
  CKPT_RETURN_IF_ERROR(encode_chunk_into(codec, level, esize, src, bytes, buf));
  return std::string(buf.data.get(), buf.size);
}

Status decode_chunk(Codec codec, size_t esize, const void* stored, size_t stored_bytes, void* dst, size_t bytes) {
  thread_local std::unique_ptr<ZSTD_DCtx, DctxFree> dctx(ZSTD_createDCtx());
  thread_local std::vector<unsigned char> tmp;
  const unsigned long long n = ZSTD_getFrameContentSize(stored, stored_bytes);
  if (n == ZSTD_CONTENTSIZE_ERROR || n == ZSTD_CONTENTSIZE_UNKNOWN || n != bytes || n > kZstdMaxChunkBytes)
    return Status::Error("ChunkCorrupt", "stored chunk of " + std::to_string(stored_bytes) + " bytes is not a zstd frame of " +
                                             std::to_string(bytes) + " bytes");
  const bool shuffled = codec == Codec::kShuffleZstd && esize > 1;
  void* out = dst;
  if (shuffled) {
    tmp.resize(bytes);
    out = tmp.data();
  }
  const size_t got = ZSTD_decompressDCtx(dctx.get(), out, bytes, stored, stored_bytes);
  if (ZSTD_isError(got) || got != bytes)
    return Status::Error("ChunkCorrupt", std::string("zstd frame does not decode: ") + (ZSTD_isError(got) ? ZSTD_getErrorName(got) : "short"));
  if (shuffled) shuffle_bytes(tmp.data(), static_cast<unsigned char*>(dst), bytes, esize, true);
  return Status::Ok();
}

}  // namespace ckpt::store
