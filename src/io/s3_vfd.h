// s3_vfd.h — HDF5 reading an S3 object as a file (internal to saetrain_io).
//
// A read-only HDF5 virtual file driver whose reads are range GETs of one object (s3_io.h): HDF5
// itself reads the superblock, object headers, attributes and chunk indexes exactly as it does
// from a file, so an object is validated by the same code and refused for the same reasons.
// Small reads (metadata) go through a cache of 256 KiB blocks per open object (the first and
// the last block are fetched together on open: h5py's metadata sits at the start, attributes
// added after the data at the end); large reads (H5Dread of a chunk) are fetched directly. A
// read past the object's end reads zeros, as HDF5's POSIX driver does.
#pragma once

#include <memory>
#include <string>

#include "h5.h"
#include "saetrain/s3.h"

namespace saetrain::io {

// Opens `obj` read-only (every read If-Match its ETag). Throws Error naming the object when it
// is not readable HDF5 or a request failed (the request's own line: access denied, no such key,
// the object changed, the endpoint unreachable).
h5::File s3_open_file(std::shared_ptr<const S3Client> client, const S3Object& obj);

// Starts fetching the blocks that opening `obj` reads first (its first and last), to be taken
// by s3_open_file: a caller about to open many objects one after the other (dataset_open) asks
// for the next ones early. At most 64 MiB of such blocks are held.
void s3_vfd_prefetch(const S3Client& client, const S3Object& obj);

// Throws (and clears) the exception of the last request of this thread's HDF5 calls on an S3
// object that failed (its Error line, or StopRequested); returns when none failed. HDF5 reports
// a failed read only as "read failed", so callers that see an HDF5 call fail on an object ask
// here for the reason.
void s3_vfd_rethrow();

}  // namespace saetrain::io
