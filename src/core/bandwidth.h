#pragma once
// Memory bandwidth as a decode step meets it: the bound a batch-1 step cannot beat is the bytes of
// weights it reads over the rate the machine reads them.

namespace mf {

// GB/s of one pass of reads over a 256 MB buffer by all intra-op threads, each reading its share as
// four interleaved streams (the row kernel's tiles read several weight rows at once); best of three.
double read_bandwidth_gbs();

// GB/s of a 256 MB copy counting the bytes read and the bytes written; best of three.
double copy_bandwidth_gbs();

}  // namespace mf
