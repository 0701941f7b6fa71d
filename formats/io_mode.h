// How a job reads and writes files: kBuffered through the page cache (mapped reads), kDirect with
// O_DIRECT, kAuto chosen per file or per run (formats/file_io_direct.h says how).
#pragma once

namespace ckpt {

enum class IoMode { kAuto, kBuffered, kDirect };

}  // namespace ckpt
