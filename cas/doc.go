// Package cas is the content-addressed store of a peer: blobs named by the
// BLAKE3-256 hash of their bytes (CIDv1 raw, "bafkr4i..."), kept as files
// under blobs/ with their bao outboards (the hash tree at 16 KiB-group
// granularity) under outboards/, and indexed in a bbolt database (sizes,
// pins, links between blobs, access and verification times, partial
// downloads).
//
// It owns: storing a stream durably in one pass (Put, AddFile with 64 MiB
// shards and a collection blob), verified reads of any range (every group
// is checked against the CID before it is returned or served), bao slices
// for the network (AppendSlice) and verified partial downloads that resume
// after a restart (Partial), pins and links, GC under a byte budget, and
// scrub. It does not own the network (swarm) or any file format above the
// byte level (experts owns manifests).
//
// Crash safety: data is written to tmp/, synced, renamed into place, and
// only then indexed in one transaction. Open removes temporary files and
// re-hashes any blob file the index does not name (a crash between rename
// and commit), indexing it if it is whole. A lost index.db is rebuilt the
// same way; only pins are lost.
package cas
