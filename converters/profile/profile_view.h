// Profile views (docs/PROFILES.md "Transforms and the exactness report"): the two
// TensorSources through which a conversion between profiles is an ordinary reshard plan.
//
//  - CanonicalView (canonical_view): a checkpoint stored in profile P presented as canonical
//    tensors (HF names, [out, in], no padding, P's stored dtypes). Every (piece x segment) of P's
//    tensors (converters/profile/profile.h ProfileTensor) becomes a piece of its canonical tensor, as
//    converters/megatron/megatron_rank_source does for Megatron. Transposed tensors are read back
//    transposed in tiles of at most `tile_bytes` (rows of the stored tensor, so the source reads
//    stay contiguous). Padding rows are not pieces of anything; check_padding() reads them and
//    reports non-zero ones as "dropped padding rows".
//  - ProfileView (profile_view): a canonical source presented as profile B's global tensors
//    (names, shapes, stored dtypes, packing, transpose, zero padding rows). Its pieces are the
//    canonical pieces mapped through B's segments (and one zero piece per padding segment); reads
//    cast to B's dtypes with the tracking cast (converters/profile/exactness.h), saturating and counting
//    what was clamped, and transpose in tiles. With CastOptions::overflow kError (no --saturate)
//    the first read that clamps anything fails (CastOverflow: the tensor, this read's count and
//    the count so far), so a job stops at its first overflowing chunk; kSaturate: it goes on.
// Where the mapping is the identity on bytes (no transpose, no cast) file_extent passes through,
// so a file-to-file copy still happens.
// Thread safety: read/file_extent may be called from several threads at once when the underlying
// source allows it (the executor's workers); the tracker is locked.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "converters/model/llama_config.h"
#include "converters/profile/exactness.h"
#include "converters/profile/profile.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt {

inline constexpr uint64_t kProfileTileBytes = uint64_t{4} << 20;

class CanonicalView : public TensorSource {
 public:
  // Reads every padding row of the source (bounded tiles) and adds a "dropped padding rows"
  // entry per tensor holding padding: elements read, non-zero ones (changed), max |value|.
  virtual Status check_padding(ExactnessReport& report) = 0;
};

class ProfileView : public TensorSource {
 public:
  // What the reads so far met (narrowing casts per tensor); thread safe.
  virtual ExactnessReport report() const = 0;
  // The target profile's tensors this view presents (for ProfileShardingRules).
  virtual const std::vector<ProfileTensor>& stored_tensors() const = 0;
};

// The low-level constructors, from the profile tensors themselves (tests build them by hand).
// `src` must outlive the view unless it is `owner` (which may be null).
//  canonical: the canonical tensors (names, shapes; dtypes are taken from the source); every one
//    must be covered by a profile tensor of the source, every source tensor must be one of `pts`
//    with the same shape (errors ProfileTensorMismatch naming the tensor and the profile).
Result<std::unique_ptr<CanonicalView>> make_canonical_view(TensorSource& src, std::unique_ptr<TensorSource> owner,
                                                           const std::vector<TensorMeta>& canonical,
                                                           const std::vector<ProfileTensor>& pts,
                                                           nlohmann::json metadata, uint64_t tile_bytes = kProfileTileBytes);
//  pts: the target profile's tensors for `canon`'s canonical tensors (profile_tensors()).
Result<std::unique_ptr<ProfileView>> make_profile_view(TensorSource& canon, std::unique_ptr<TensorSource> owner,
                                                       const std::vector<ProfileTensor>& pts, nlohmann::json metadata,
                                                       const CastOptions& cast = {},
                                                       uint64_t tile_bytes = kProfileTileBytes);

// The profile a source's metadata names ("profile_spec" when present, else the built-in
// "profile"); "reference" when it names none.
Result<Profile> profile_of_metadata(const nlohmann::json& metadata, const std::string& origin);

// The canonical tensors of a source in profile `p`: the model's (llama_model_tensors) and an
// optimizer tensor per parameter for each "optimizer.<kind>.<stored name>" the source holds.
Result<std::vector<TensorMeta>> canonical_tensors_of(const Profile& p, const LlamaConfig& config,
                                                     const std::vector<TensorMeta>& stored, int tp);

// The canonical view of `src`, stored in `p` at its layout's tp (metadata: model_config and
// layout, as a native store has them). Metadata of the view: the source's, with "profile"
// "reference" and "source_profile" p.name.
Result<std::unique_ptr<CanonicalView>> canonical_view(TensorSource& src, std::unique_ptr<TensorSource> owner,
                                                      const Profile& p, uint64_t tile_bytes = kProfileTileBytes);

// `canon` (canonical tensors) presented in profile `b` at tensor-parallel size `tp`. Metadata: the
// source's, with "profile" b.name and "profile_spec" b.to_json().
Result<std::unique_ptr<ProfileView>> profile_view(TensorSource& canon, std::unique_ptr<TensorSource> owner,
                                                  const Profile& b, const LlamaConfig& config, int tp,
                                                  const CastOptions& cast = {},
                                                  uint64_t tile_bytes = kProfileTileBytes);

namespace profile_view_detail {

// The shape of the untransposed concatenation of a profile tensor.
Shape concat_shape(const ProfileTensor& t);
// A box of the stored tensor <-> the same elements in the concatenation (a swap when transposed).
Box stored_to_concat(const ProfileTensor& t, const Box& stored);
inline Box concat_to_stored(const ProfileTensor& t, const Box& concat) { return stored_to_concat(t, concat); }
// A box of the concatenation inside segment `s` (first row `row0`) <-> the canonical box.
Box concat_to_canonical(const ProfileSegment& s, int64_t row0, const Box& concat);
Box canonical_to_concat(const ProfileSegment& s, int64_t row0, const Box& canon);
// True when the profile tensor is canonical tensor `shape` as it is (one whole segment, no
// transpose), so flat pieces map as they are.
bool is_identity(const ProfileTensor& t, const Shape& canonical_shape);

// Reads a column band `sub` (2-D, narrower than its piece) of `piece` of `src` into `dst` (dense)
// from the file range the source stores the band's rows in (TensorSource::file_extent of the
// rows across the piece's width), mapped and gathered row by row (formats/base/file_io.h
// read_file_blocks): only the band's bytes are copied, where HDF5's strided read copies the whole
// span through its sieve buffer. False (nothing read) when the band is the piece's width or the
// source has no such range; the caller reads it then.
Result<bool> gather_column_band(TensorSource& src, size_t piece, const Box& sub, uint8_t* dst);

// A buffer of at least `bytes` of the calling thread, one per `slot` (0..3), reused by every tile
// read of the views on that thread (kept at its largest size: at most a tile or its cast). The
// profile view uses slots 0..2, the canonical view (which a profile view reads) slot 3.
uint8_t* tile_scratch(int slot, size_t bytes);

}  // namespace profile_view_detail

}  // namespace ckpt
