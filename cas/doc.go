// Package cas is the content-addressed store of a peer: blobs named by the
// BLAKE3-256 hash of their bytes, kept as files under blobs/ with their bao
// outboards (the hash tree at 16 KiB-group granularity) under outboards/,
// and indexed by digest in a bbolt database (sizes, pins, links between
// blobs, access and verification times, partial downloads).
//
// A CID says how to read a blob: codec raw ("bafkr4i...") reads the bytes
// as themselves, codec collection ("bagaybqabdyq...", 0x300001) reads them
// as the list of shards of a larger file. Bytes are never read as a
// collection because of what they contain, only because the CID says so;
// the two CIDs of the same bytes share one stored blob, while pins are per
// CID. FORMAT.md specifies CIDs, verified slices and collections for other
// implementations, with test vectors in testdata/.
//
// It owns: storing a stream durably in one pass (Put, AddFile with 64 MiB
// shards and a collection blob), verified reads of any range (every group
// is checked against the CID before it is returned), bao slices for the
// network (AppendSlice; AppendSliceUnchecked for a server whose receivers
// verify, with CheckRange for what one refused) and verified partial
// downloads that resume
// after a restart (Partial), pins and links, GC under a byte budget, and
// scrub. It does not own the network (swarm) or any file format above the
// byte level (experts owns manifests).
//
// Crash safety: data is written to tmp/, synced, renamed into place, its
// directory synced, and only then indexed in one transaction
// (TestDurabilityOrder checks that order). Open removes temporary files and
// re-hashes any blob file the index does not name (a crash between rename
// and commit), indexing it in place if it is whole, so a crash during that
// recovery loses nothing (TestCrashKill). A lost index.db is rebuilt the
// same way; pins, and which blobs were held as collections, are lost.
//
// Platforms: the Store (bbolt and files) builds for native targets only;
// names, collections and verification (cid.go, types.go,
// collection_format.go, errors.go and package bao) build for js/wasm too,
// where the browser peer keeps blobs in its own store (swarm/browser).
package cas
