#include "formats/base/error_codes.h"

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
    // Every JSON file ckpt reads (formats/base/json_read.h).
    {"InvalidJson", kCorrupt},
    {"JsonTooLarge", kCorrupt},
    {"JsonTooDeep", kCorrupt},
    {"JsonTooManyValues", kCorrupt},  // more values than the file's kind allows (JsonLimits::max_values)
    {"DuplicateKey", kCorrupt},  // also a safetensors header rule
    // dtypes and casts (formats/dtype/dtype.h).
    {"UnknownDType", kCorrupt},
    {"CastOverflow", kOver},
    {"CastNaN", kOver},
    {"CastInexact", kOver},
    {"CastInvalidBool", kCorrupt},
    {"F4Packed", kUnsup},  // a cast between F4 (packed pairs) and another dtype (f4_unpack / f4_pack instead)
    {"F4OddLastDim", kUnsup},  // an F4 tensor whose last dimension is odd: its rows would split bytes
    // Quantized weights (converters/quant/, docs/QUANTIZATION.md).
    {"QuantScaleMissing", kCorrupt},    // an FP8 weight of a quantized checkpoint without its scales
    {"QuantPayloadMissing", kCorrupt},  // scales without their weight
    {"QuantScaleShape", kCorrupt},      // scales whose shape does not match the weight's blocks
    {"QuantScaleDType", kCorrupt},
    {"QuantPayloadDType", kCorrupt},
    {"QuantBlockSize", kCorrupt},       // quantization_config.weight_block_size malformed
    {"QuantScaleNotFinite", kCorrupt},  // a NaN / Inf scale (E8M0: 0xFF)
    {"QuantNotFinite", kOver},          // quantizing a NaN / Inf value
    {"QuantSplitBlock", kUnsup},        // a reshard split inside a quantization block (--requantize to allow)
    {"QuantUnsupported", kUnsup},       // a quantization request ckpt cannot do (tensor kind, dtype, shape)
    // Regions and shapes (formats/tensor/region.h).
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
    {"ConfigTooLarge", kCorrupt},  // a model config number above its bound (converters/model/llama_config.h)
    {"SliceOutOfRange", kArg},
    {"TooManySlices", kArg},
    // Native store (formats/store/, docs/STORE_FORMAT.md).
    {"UnknownFormat", kCorrupt},
    {"UnsupportedVersion", kUnsup},
    {"UnknownDigest", kUnsup},  // a piece digest algorithm this ckpt does not know (formats/digest/digest.h)
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
    {"TooManyPieces", kCorrupt},  // more pieces of one tensor than kMaxPiecesPerTensor
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
    // A dataset's HDF5 storage against its piece record (StoreReader::check_storage, docs/INTEGRITY.md).
    {"LayoutMismatch", kCorrupt},       // contiguous for codec none, chunked for a compressed codec
    {"FilterMismatch", kCorrupt},       // the filter pipeline is not exactly the codec's
    {"StorageSizeMismatch", kCorrupt},  // a contiguous dataset's storage size != the record's bytes
    {"StorageOutOfFile", kCorrupt},     // a contiguous dataset's data range is not inside its file
    {"ChunkShapeMismatch", kCorrupt},   // v3: chunk dims that are not the store writer's
    // The manifest checksum (manifest v3 "manifest_digest", formats/store/manifest.h).
    {"ManifestChecksumMissing", kCorrupt},  // a v3 manifest without it
    {"ManifestChecksumMismatch", kSum},     // the manifest was changed after it was written
    // Reshard engine (reshard/).
    {"BadLayout", kArg},
    // Writers (formats/base/fs_util.h PartialDir, DirLock).
    {"DestinationBusy", kArg},  // another process holds the lock of the output (its .partial, a run dir)
    // Cluster files and the trainer's memory check (reshard/dist/cluster.h, trainer/memory_estimate.h).
    {"BadCluster", kArg},
    {"ClusterMismatch", kArg},
    {"RankOutOfMemory", kArg},
    // Communicator (reshard/dist/comm.h).
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
    {"UnsupportedModel", kUnsup},  // a model family (or its MoE) a command does not support (docs/MOE.md)
    {"BadAlias", kArg},            // a renamed view's boxes that do not fit (formats/tensor/alias_view.h)
    {"MixedDtypes", kCorrupt},     // the experts of one stacked tensor stored in different dtypes
    {"NoModelConfig", kUnsup},
    {"BadMegatronArgs", kCorrupt},
    {"MissingMegatronCommonState", kCorrupt},   // torch_dist: neither common.pt nor the common_state item
    {"BadMegatronCommonState", kCorrupt},       // common_state outside its file, or not [state dict]
    {"BadMegatronIntegrity", kCorrupt},         // integrity.json malformed
    {"MegatronIntegrityMismatch", kSum},        // a file's SHA-256 differs from integrity.json's
    {"MegatronIntegrityMissingFile", kCorrupt}, // a file integrity.json lists is missing
    // DeepSpeed ZeRO checkpoints (converters/deepspeed/).
    {"DeepSpeedLatest", kCorrupt},          // `latest` unreadable or naming no step directory
    {"DeepSpeedMissingRank", kNotFound},    // a rank's optimizer file or the model states file absent
    {"DeepSpeedPartitionCount", kCorrupt},  // partition_count vs the rank files found; groups per rank
    {"DeepSpeedPartitionSize", kCorrupt},   // a group's partitions not of one size over the ranks
    {"DeepSpeedPadding", kCorrupt},         // group padding larger than a partition, alignment paddings malformed
    {"DeepSpeedGroupSize", kCorrupt},       // parameters + paddings do not fill the partitions exactly
    {"DeepSpeedParamShape", kCorrupt},      // a param_shapes entry with a negative or oversized shape
    {"DeepSpeedNotZero", kCorrupt},         // a file not of DeepSpeed's structure (key, what it holds)
    {"DeepSpeedStage", kCorrupt},           // zero_stage unknown, or ranks at different stages
    {"DeepSpeedOptimizerState", kCorrupt},  // an Adam moment missing or not of its partition's size
    {"DeepSpeedStepMismatch", kCorrupt},    // ranks or groups at different Adam steps
    // DeepSpeed universal checkpoints written (converters/deepspeed/ds_universal_export.h).
    {"DeepSpeedNoOptimizerState", kArg},       // the source has no Adam state and --weights-only was not given
    {"DeepSpeedPartialOptimizerState", kArg},  // Adam moments for some parameters only
    {"DeepSpeedNoStep", kArg},                 // Adam moments but no recorded step and no --step
    {"DeepSpeedNotFloat", kArg},               // a weight or state of an integer dtype
    {"DeepSpeedParamName", kArg},              // a parameter name that cannot be a directory under zero/
    {"DeepSpeedUniversal", kCorrupt},          // a universal checkpoint read: missing fp32.pt, wrong size, partial moments, bad name
    {"BadDistOptimArgs", kCorrupt},             // distributed optimizer: args give no bucket layout (dp, bucket size)
    {"UnsupportedDistOptim", kUnsup},           // distributed optimizer form not read (instances, grad buffers)
    {"DistOptimBucketCount", kCorrupt},         // recorded buckets != derived buckets
    {"DistOptimPastBuffer", kCorrupt},          // a bucket's numel_unpadded past its padded buffer
    {"DistOptimBucketMismatch", kCorrupt},      // bucket sizes do not add up to the parameters'
    {"MissingDistOptimState", kCorrupt},        // a bucket without masters or a moment the others have
    {"DistOptimRangeNotCovered", kCorrupt},     // a parameter's bucket elements not all stored
    // export-megatron --dist-opt / --megatron-version (converters/megatron/megatron_dist_opt_export.h)
    {"DistOptNoOptimizerState", kNotFound},     // the source holds no Adam state to write
    {"DistOptNoStep", kNotFound},               // the source records no optimizer step
    {"DistOptNeedsLocalSpec", kArg},            // legacy --dist-opt without --local-norms
    {"DistOptNeedsMegatronFormat", kArg},       // --dist-opt with --format safetensors
    {"DistOptBadFlag", kArg},                   // --dp / --ddp-bucket-size out of range
    {"UnsupportedMegatronVersion", kUnsup},     // --megatron-version not 0.16 .. 0.19
    {"BadDistOptimState", kCorrupt},            // dp_zero_gather_scatter param_state not megatron-core's structure
    {"Base64Invalid", kCorrupt},
    {"HfFilesCorrupt", kCorrupt},
    {"HfFilesChecksum", kSum},
    {"HfFilesTooLarge", kUnsup},
    // Trainer checkpoints (trainer/state/trainer_state.h).
    {"BadTrainerState", kCorrupt},
    {"NotTrainerCheckpoint", kCorrupt},
    {"TrainerStateOutOfRange", kCorrupt},  // a resumed field (LR, betas, eps, step...) outside its range
    // Trainer gradient sums over replicas (trainer/optim/replica_sum.h).
    {"ReplicaSumMismatch", kArg},  // boxes or tensor lists that differ from the plan / rank 0's
    // PyTorch files written by ckpt (write side: formats/torch/pickle/pickler, torch_file_writer,
    // dcp_writer).
    {"PickleWriteInvalid", kArg},   // an object tree the pickler cannot write (bad UTF-8, cycle, ...)
    {"TorchWriteInvalid", kArg},    // storages undeclared / mismatched, a tensor outside its storage
    {"DcpWriteInvalid", kArg},      // DCP pieces that are not boxes, or in another dtype than the tensor
    // formats/torch (DCP): PyTorch Distributed Checkpoint directories (formats/torch/dcp/dcp.h, docs/DCP.md).
    {"DcpBadMetadata", kCorrupt},       // .metadata is not the Metadata records torch writes
    {"DcpUnknownDType", kUnsup},        // a tensor's dtype ckpt does not read
    {"DcpChunkOutside", kCorrupt},      // a chunk does not lie inside its tensor
    {"DcpChunkOverlap", kCorrupt},      // two chunks of one tensor share elements
    {"DcpMissingStorage", kCorrupt},    // a chunk or bytes item without its storage_data entry
    {"DcpDuplicateStorage", kCorrupt},  // two storage_data entries for one item
    {"DcpBadPath", kCorrupt},           // relative_path absolute, empty or with '..'
    {"DcpItemPastFile", kCorrupt},      // offset + length past the end of the .distcp file
    {"DcpItemSize", kCorrupt},          // a raw item's length != chunk elements * dtype size
    {"DcpItemMismatch", kCorrupt},      // an embedded torch.save item's tensor differs from its chunk
    {"DcpTransform", kUnsup},           // items stored through transforms (zstandard, ...)
    {"DcpTooLarge", kCorrupt},          // counts or sizes beyond ckpt's bounds
    // Megatron-Core torch_dist checkpoints (converters/megatron/dist/, docs/MEGATRON_DIST.md).
    {"NotMegatronDist", kCorrupt},  // a torch_dist dir without the stacked GPT tensors it must hold
    // Calibration and emulation of device types (trainer/plan/calibrate.h, trainer/emulate.h).
    {"CalibrationFailed", ErrorKind::kIo},  // the MPI measurement (mpirun -np 2) did not run or report
    {"EmulationRefused", kArg},             // --emulate without a cluster file or a device type's speed
    // Megatron-LM legacy per-rank torch files (converters/megatron/megatron_torch_source).
    {"MegatronNotStateDict", kCorrupt},  // a model_optim_rng.pt that is not Megatron's dict with a 'model' state dict
    // Megatron virtual (interleaved) pipelines (converters/megatron/megatron_vpp.h).
    {"MegatronVppChunkMissing", kCorrupt},        // model0 .. model{v-1} with one missing
    {"MegatronVppChunkCountMismatch", kCorrupt},  // rank files (or the args) disagree on the chunk count
    {"MegatronVppLayerCountMismatch", kCorrupt},  // a chunk's layers != num_layers / (pp * vpp)
    {"MegatronVppLayersNotDivisible", kArg},      // num_layers % (pp * vpp) != 0 (import or --vpp)
    {"MegatronVppNeedsPipeline", kArg},           // a virtual pipeline with pp = 1
    {"MegatronVppUneven", kUnsup},                // uneven first/last stages or a layout with a virtual pipeline
    {"MegatronExpertCountMismatch", kCorrupt},    // an MoE rank file holds more local experts than num_experts / ep (docs/MOE.md)
    {"MegatronVppFormat", kArg},                  // --vpp with an export format that has no chunks (safetensors)
    {"MegatronVppOptimizer", kUnsup},             // --format torch --vpp, optimizer state without --dist-opt
    // formats/torch (unpickler, torch zip).
    {"ForbiddenGlobal", kCorrupt},          // a pickle names a global not on the allow-list
    {"PickleTruncated", kCorrupt},          // the pickle ends inside an opcode or before STOP
    {"PickleBadOpcode", kCorrupt},          // a byte that is no pickle opcode
    {"PickleUnsupportedOpcode", kCorrupt},  // INST, OBJ, EXT*, PERSID, out-of-band buffers
    {"PickleUnsupportedProtocol", kUnsup},  // PROTO above 5
    {"PickleMemoIndex", kCorrupt},          // GET of an unset index, or an index past the bound
    {"PickleTooDeep", kCorrupt},            // MARK nesting or object nesting past the bound
    {"PickleTooLarge", kCorrupt},           // objects, stack, string or container past the bound
    {"PickleStackUnderflow", kCorrupt},     // an opcode pops more than the stack holds
    {"PickleBadValue", kCorrupt},           // an opcode applied to the wrong kind of value
    {"PickleBadUtf8", kCorrupt},            // a str that is not UTF-8
    {"PickleBadPersistentId", kCorrupt},    // not ('storage', torch.XStorage, key, location, numel)
    {"PickleBadReduce", kCorrupt},          // REDUCE / NEWOBJ / BUILD on what may not be called
    {"PickleBadTensor", kCorrupt},          // tensor rebuild arguments not as torch.save writes them
    // PaddleNLP model_state.pdparams (formats/paddle/pdparams.h) and directories (converters/paddle).
    {"PdparamsNotStateDict", kCorrupt},   // the pickle's root is not a dict of str keys
    {"PdparamsBadArray", kCorrupt},       // a value that is not a plain numpy array (names what it is)
    {"PdparamsBadDtype", kUnsup},         // a numpy dtype ckpt does not map, or big-endian
    {"PdparamsFortranOrder", kUnsup},     // an array stored in Fortran order
    {"PdparamsSizeMismatch", kCorrupt},   // data bytes != numel * itemsize (truncated / wrong shape)
    {"PdparamsBadNameMap", kCorrupt},     // StructuredToParameterName@@ not a dict of str -> str
    {"NonFloatWeight", kUnsup},           // an integer / U16 tensor where a float weight is expected
    {"PaddleNlpConfig", kCorrupt},        // a PaddleNLP config.json asking for what ckpt cannot map (alibi, rope scaling, a dtype)
    {"PaddleNlpMixedDtypes", kUnsup},     // writing PaddleNLP files from weights in several dtypes without --dtype
    {"SourceProfileUnsupported", kUnsup}, // --source-profile on a kind that records its own conventions
    {"IntTooLarge", kUnsup},                // an integer beyond int64
    {"TorchNotZip", kCorrupt},              // not a zip (nor a ZIP64) archive
    {"TorchZipCorrupt", kCorrupt},          // libzip refuses the archive or an entry's data
    {"ZipCrcMismatch", kCorrupt},           // an entry's CRC-32 differs from its central directory / local record
    {"IncompleteCheckpoint", kCorrupt},     // a torch_dist without metadata.json, a DCP without .metadata
    {"TorchNoDataPkl", kCorrupt},           // no <archive>/data.pkl
    {"TorchPickleTooLarge", kCorrupt},      // data.pkl larger than TorchFileLimits::max_pickle_bytes
    {"TorchByteOrder", kUnsup},             // byteorder other than 'little'
    {"TorchZipMethod", kUnsup},             // an entry neither stored nor deflated, or encrypted
    {"TorchStorageMissing", kCorrupt},      // a persistent id names data/<key> that is absent
    {"TorchStorageSize", kCorrupt},         // data/<key> size != numel * element size, or conflicting ids
    {"TorchTensorOutOfStorage", kCorrupt},  // size / stride / offset reach past the storage
    {"TorchReadRange", kArg},               // a read outside a storage or a tensor
    // The planner (trainer/plan/, docs/PLAN.md).
    {"BadPlan", kArg},        // plan inputs that do not go together (layers, batch, placement)
    {"PlanInfeasible", kArg}, // no layout of the search space fits: what does not fit, by how much
    // Vendor / framework profiles (converters/profile/profile*.h, docs/PROFILES.md).
    {"ProfileUnknownField", kCorrupt},      // a profile key (top level, dtypes, vocab_padding, names, config_keys) ckpt does not know
    {"ProfileBadValue", kCorrupt},          // a missing field, a wrong JSON type, an unknown packing/orientation/dtype, a bad name pattern
    {"ProfileContradiction", kCorrupt},     // fields that cannot hold together (a "qkv" name with separate q/k/v packing, ...)
    {"ProfileIncompleteNaming", kCorrupt},  // a tensor kind the packing or the model needs has no name
    {"ProfileDuplicateName", kCorrupt},     // two kinds (or two config keys) mapped to the same name
    {"ProfileUnknown", kArg},               // --profile names no built-in profile
    {"ProfileUnsupported", kUnsup},         // a model the convention cannot express (LiBai heads with GQA, per-TP packing with tp not dividing)
    {"ProfileNotSplittable", kArg},         // a packed tensor whose TP rank's part is not one box at this tp
    // Profile conversions, engine side (converters/profile/profile_view.h, exactness.h).
    {"ProfileTensorMismatch", kCorrupt},  // a stored tensor that is not its profile's (name or shape)
    {"BadExactnessReport", kCorrupt},     // an exactness report (manifest, a process's) that does not parse
    // Megatron-LM optimizer state (converters/megatron/megatron_torch_optim.h, docs/MEGATRON_OPTIM.md).
    {"MegatronOptimizerState", kCorrupt},         // 'optimizer' entry malformed (no param_groups, ids not ints...)
    {"MegatronOptimizerParams", kCorrupt},        // param groups' sizes / kinds do not match the model's parameters
    {"MegatronOptimizerUnknownParam", kCorrupt},  // 'state' holds an id that no param group lists
    {"MegatronOneMomentExport", kUnsup},          // one-moment state without --dist-opt or without args.optimizer lion
    {"MegatronOptimizerMissingMoment", kCorrupt}, // a parameter (or rank) without exp_avg / exp_avg_sq / state
    {"MegatronOptimizerStep", kCorrupt},          // parameters of one rank at different Adam steps
    // The planner's calibrated cost terms (trainer/plan/cost_model.h CostCalibration).
    {"BadCalibration", kArg},  // a --calibration file's cost_terms: unknown key, wrong type, value out of range
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
