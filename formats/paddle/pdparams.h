// model_state.pdparams: what paddle.save writes for a state dict (PaddleNLP 2.8.1's save_pretrained
// with safe_serialization=False), read without running any Python:
//
//   pickle, protocol 2..4, root: a dict
//     "<structured name>" -> numpy array, as numpy pickles a plain ndarray:
//         numpy.core.multiarray._reconstruct(numpy.ndarray, (0,), b'b')     (REDUCE)
//         BUILD (1, shape: tuple of ints, dtype, is_fortran: False, data: bytes)
//       dtype: numpy.dtype(code, False, True) + BUILD (3, '<' | '|' | '=', None, None, None, -1, -1, 0)
//       (numpy >= 1.25 may name numpy.dtypes.<X>DType classes; numpy 2 numpy._core.multiarray)
//     "StructuredToParameterName@@" -> dict str -> str (structured name -> Paddle parameter name;
//       kept as metadata, never a tensor)
//   data: the array's bytes in C order, numel * itemsize of them, little-endian.
//
// Rules, one named code each (formats/base/error_codes.cc):
//   ForbiddenGlobal (unpickler): any global other than the numpy ones above and the plain
//     containers, refused naming module and class before anything is built; nothing is executed.
//   PdparamsNotStateDict: the root is not a dict, or a key is not a str.
//   PdparamsBadArray: a value that is neither a plain numpy array in the form above nor the name
//     map (names the key and what it holds, e.g. a record of class 'argparse.Namespace').
//   PdparamsBadDtype: a dtype code ckpt does not map (f2 f4 f8 i1 i2 i4 i8 u1 u2 u4 u8 b1) or big-endian.
//   PdparamsFortranOrder: is_fortran True (paddle.save never writes it).
//   PdparamsSizeMismatch: data bytes != numel * itemsize (a truncated or wrong-shape array).
//   PdparamsBadNameMap: the name map is not a dict of str -> str.
//   PickleTruncated & co (unpickler): a file cut short anywhere.
// Large data bytes are kept by reference (UnpickleLimits::bytes_by_reference_over): opening reads
// the pickle once (peak memory: the file's size while it is parsed), reads pread the arrays.
// Thread safety: immutable after open(); read() may be called concurrently.
#pragma once

#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include "formats/base/fs_util.h"
#include "formats/base/status.h"
#include "formats/tensor/tensor_io.h"

namespace ckpt::paddle {

inline constexpr const char* kPdparamsFileName = "model_state.pdparams";
inline constexpr const char* kPdparamsIndexName = "model_state.pdparams.index.json";
inline constexpr const char* kNameMapKey = "StructuredToParameterName@@";

struct PdparamsArray {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  uint64_t offset = 0;  // of the data in the file
  uint64_t bytes = 0;
  std::string inline_data;  // the data when the pickle did not hold it as plain bytes (protocol 2)
};

struct PdparamsContents {
  std::vector<PdparamsArray> arrays;                // in the pickle's order
  std::map<std::string, std::string> name_map;      // StructuredToParameterName@@
};

// Parses the bytes of a .pdparams file (offsets refer to `bytes`). Errors as listed above.
Result<PdparamsContents> parse_pdparams(std::string_view bytes);

// numpy dtype code ("f4", "u2", ...) -> DType; false when ckpt maps none.
bool dtype_from_numpy_code(std::string_view code, DType* out);

// One .pdparams file, or the shards of a model_state.pdparams.index.json (weight_map: name ->
// file; every listed file present, every tensor in exactly one file, index and files agreeing).
class PdparamsSource final : public TensorSource {
 public:
  // `path`: a .pdparams file, or a directory holding model_state.pdparams.index.json or
  // model_state.pdparams. metadata(): {"pdparams_name_map": {...}} when the file has one.
  static Result<std::unique_ptr<PdparamsSource>> open(const std::string& path);

  const std::vector<TensorMeta>& tensors() const override { return metas_; }
  const std::vector<Piece>& pieces() const override { return pieces_; }
  Status read(size_t piece, const Box& sub, void* dst) override;
  std::optional<FileExtent> file_extent(size_t piece, const Box& sub) override;
  const nlohmann::json& metadata() const override { return meta_; }
  std::string describe() const override { return path_; }
  IntegrityInfo integrity() const override {
    return {"paddle pdparams", "",
            "a .pdparams pickle has no checksums: structure validated and every byte read, content integrity not checkable", {}};
  }
  PieceStorage piece_storage(size_t piece) override;

 private:
  Status add_file(const std::string& file, const std::set<std::string>* expected);
  std::string path_;
  std::vector<std::string> files_;
  std::vector<ScopedFd> fds_;
  std::vector<PdparamsArray> arrays_;   // per piece
  std::vector<size_t> file_of_;         // per piece
  std::vector<TensorMeta> metas_;
  std::vector<Piece> pieces_;
  nlohmann::json meta_ = nlohmann::json::object();
};

}  // namespace ckpt::paddle
