// How a job reads and writes files: kBuffered through the page cache (mapped reads), kDirect with
// O_DIRECT, kAuto chosen per file or per run (formats/io/output_file.h says how).
#pragma once

namespace ckpt {

enum class IoMode { kAuto, kBuffered, kDirect };

}  // namespace ckpt
