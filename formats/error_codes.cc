#include "formats/error_codes.h"

#include <iterator>

namespace ckpt {

namespace {

constexpr ErrorKind kArg = ErrorKind::kInvalidArgument;
constexpr ErrorKind kNotFound = ErrorKind::kNotFound;
constexpr ErrorKind kCorrupt = ErrorKind::kCorruption;
constexpr ErrorKind kSum = ErrorKind::kChecksum;
constexpr ErrorKind kUnsup = ErrorKind::kUnsupported;
constexpr ErrorKind kOver = ErrorKind::kOverflow;

// Sorted by area; each code once. Add a code here before using it.
constexpr ErrorCodeEntry kTable[] = {
    // Generic codes, one per kind (Status::InvalidArgument(msg), ...).
    {"InvalidArgument", kArg},
    {"NotFound", kNotFound},
    {"Io", ErrorKind::kIo},
    {"Unsupported", kUnsup},
    {"Internal", ErrorKind::kInternal},
    // Every JSON file ckpt reads (formats/json_read.h).
    {"InvalidJson", kCorrupt},
    {"JsonTooLarge", kCorrupt},
    {"JsonTooDeep", kCorrupt},
    {"DuplicateKey", kCorrupt},  // also a safetensors header rule
    // dtypes and casts (formats/dtype.h).
    {"UnknownDType", kCorrupt},
    {"CastOverflow", kOver},
    {"CastNaN", kOver},
    {"CastInexact", kOver},
    {"CastInvalidBool", kCorrupt},
    // Regions and shapes (formats/region.h).
    {"ShapeOverflow", kCorrupt},
    {"RegionOutOfBounds", kCorrupt},
    {"RegionRank", kCorrupt},
    {"ShortSource", kCorrupt},
    // safetensors header (formats/safetensors/st_header.h).
    {"HeaderTooSmall", kCorrupt},
    {"HeaderTooLarge", kCorrupt},
    {"InvalidHeaderLength", kCorrupt},
    {"InvalidHeader", kCorrupt},
    {"InvalidHeaderDeserialization", kCorrupt},
    {"InvalidOffset", kCorrupt},
    {"InvalidTensorName", kCorrupt},
    {"MetadataIncompleteBuffer", kCorrupt},
    {"TensorInvalidInfo", kCorrupt},
    {"TooManyDimensions", kCorrupt},
    {"UnknownTensorField", kCorrupt},
    {"ValidationOverflow", kCorrupt},
    {"UnsupportedDType", kUnsup},
    // safetensors index and directory (formats/safetensors/st_index.h, st_dir.h), reads.
    {"IndexInvalid", kCorrupt},
    {"IndexBadFileName", kCorrupt},
    {"IndexMismatch", kCorrupt},
    {"IndexMissingFile", kNotFound},
    {"InvalidConfig", kCorrupt},
    {"SliceOutOfRange", kArg},
    {"TooManySlices", kArg},
    // Native store (formats/store/, docs/STORE_FORMAT.md).
    {"UnknownFormat", kCorrupt},
    {"UnsupportedVersion", kUnsup},
    {"UnknownDigest", kUnsup},  // a piece digest algorithm this ckpt does not know (formats/digest.h)
    {"BadField", kCorrupt},
    {"BadByteCount", kCorrupt},
    {"BadFileName", kCorrupt},
    {"BadShape", kCorrupt},
    {"BadShard", kCorrupt},
    {"BadLatest", kCorrupt},
    {"NotCheckpoint", kCorrupt},
    {"DuplicateTensor", kCorrupt},
    {"DuplicateDataset", kCorrupt},
    {"UnknownTensor", kCorrupt},  // a file holds a tensor its model or manifest does not declare
    {"UnexpectedTensor", kCorrupt},
    {"PieceOverlap", kCorrupt},
    {"PieceGap", kCorrupt},
    {"PieceSize", kCorrupt},
    {"FlatRangeGap", kCorrupt},
    {"FlatRangeOutOfBounds", kCorrupt},
    {"MissingDataset", kCorrupt},
    {"DTypeMismatch", kCorrupt},
    {"ShapeMismatch", kCorrupt},  // a stored tensor's shape differs from what its config implies
    {"ReadFailed", kCorrupt},
    {"ChunkCorrupt", kCorrupt},  // a compressed chunk that does not decode (formats/store/chunk_codec.h)
    {"FileTooLarge", kCorrupt},
    {"ShardMissing", kNotFound},
    {"ChecksumMismatch", kSum},
    // Reshard engine (reshard/).
    {"BadLayout", kArg},
    // Cluster files and the trainer's memory check (reshard/cluster.h, trainer/memory_estimate.h).
    {"BadCluster", kArg},
    {"ClusterMismatch", kArg},
    {"RankOutOfMemory", kArg},
    // Communicator (reshard/comm.h).
    {"Mpi", ErrorKind::kIo},            // an MPI call failed (message: the MPI error string)
    {"CommTimeout", ErrorKind::kIo},    // peers did not arrive within CKPT_COMM_TIMEOUT_S
    {"PeerFailed", ErrorKind::kIo},     // another rank failed (fail_all) without a Status of its own
    {"WorldSizeMismatch", kArg},        // mpirun -np differs from the layout's world size
    {"TensorNotFound", kNotFound},
    {"RegionNotCovered", kNotFound},
    {"ZeroBufferOverflow", kOver},
    // Model families and foreign formats (converters/).
    {"LayoutRefused", kArg},
    {"LayoutUnsupported", kUnsup},
    {"MissingTensor", kNotFound},
    {"NoModelConfig", kUnsup},
    {"BadMegatronArgs", kCorrupt},
    {"Base64Invalid", kCorrupt},
    {"HfFilesCorrupt", kCorrupt},
    {"HfFilesChecksum", kSum},
    {"HfFilesTooLarge", kUnsup},
    // Trainer checkpoints (trainer/trainer_state.h).
    {"BadTrainerState", kCorrupt},
    {"NotTrainerCheckpoint", kCorrupt},
    // Trainer gradient sums over replicas (trainer/replica_sum.h).
    {"ReplicaSumMismatch", kArg},  // boxes or tensor lists that differ from the plan / rank 0's
    // The planner (issue 16, trainer/plan/).
    {"BadPlan", kArg},        // plan inputs that do not go together (layers, batch, placement)
    {"PlanInfeasible", kArg}, // no layout of the search space fits: what does not fit, by how much
    // Calibration and emulation of device types (issue 16: trainer/plan/calibrate.h, trainer/emulate.h).
    {"CalibrationFailed", ErrorKind::kIo},  // the MPI measurement (mpirun -np 2) did not run or report
    {"EmulationRefused", kArg},             // --emulate without a cluster file or a device type's speed
};

}  // namespace

std::optional<ErrorKind> kind_of_code(std::string_view code) {
  for (const auto& e : kTable)
    if (code == e.code) return e.kind;
  return std::nullopt;
}

const ErrorCodeEntry* error_code_table(size_t* n) {
  *n = std::size(kTable);
  return kTable;
}

}  // namespace ckpt
