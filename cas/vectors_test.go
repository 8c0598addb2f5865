package cas

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/rdrr/peer/cas/bao"
)

var update = flag.Bool("update", false, "rewrite the test vectors under testdata/ (FORMAT.md names them)")

// The test vectors of FORMAT.md, for implementations elsewhere (a browser
// client): testdata/vectors.json describes them, the .bin and .json files
// next to it hold their bytes.
type vectors struct {
	BaoSlice   baoSliceVector   `json:"bao_slice"`
	Collection collectionVector `json:"collection"`
}

type baoSliceVector struct {
	Input        string `json:"input"`
	Size         int64  `json:"size"`
	GroupSize    int64  `json:"group_size"`
	Groups       int64  `json:"groups"`
	Root         string `json:"root_hex"`
	CID          string `json:"cid"`
	CIDBinary    string `json:"cid_binary_hex"`
	OutboardFile string `json:"outboard_file"`
	OutboardLen  int64  `json:"outboard_len"`
	Off          int64  `json:"off"`
	Len          int64  `json:"len"`
	CoverStart   int64  `json:"cover_start"`
	CoverEnd     int64  `json:"cover_end"`
	SliceFile    string `json:"slice_file"`
	SliceLen     int64  `json:"slice_len"`
}

type collectionVector struct {
	Input        string  `json:"input"`
	Size         int64   `json:"size"`
	Shards       []Shard `json:"shards"`
	BlobFile     string  `json:"blob_file"`
	BlobLen      int64   `json:"blob_len"`
	CID          string  `json:"cid"`
	CIDBinary    string  `json:"cid_binary_hex"`
	RawCID       string  `json:"raw_cid"`
	RawCIDBinary string  `json:"raw_cid_binary_hex"`
}

const vectorInput = "byte i of the input is i % 251, for i from 0"

func vectorBytes(n int64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i % 251)
	}
	return b
}

// makeVectors computes the vectors from their rules.
func makeVectors() (v vectors, files map[string][]byte) {
	files = map[string][]byte{}
	// A bao slice: 7 groups (the last short), a range inside groups 1-3.
	size, off, n := int64(100_000), int64(20_000), int64(30_000)
	data := vectorBytes(size)
	var e bao.Encoder
	e.Write(data)
	root, ob := e.Sum(nil)
	start, end := bao.Cover(size, off, n)
	slice, err := bao.AppendSlice(nil, ob, data[start:end], size, off, n)
	if err != nil {
		panic(err)
	}
	c := RawCID(root)
	v.BaoSlice = baoSliceVector{
		Input: vectorInput, Size: size, GroupSize: GroupSize, Groups: bao.Groups(size),
		Root: hex.EncodeToString(root[:]), CID: c.String(), CIDBinary: hex.EncodeToString(c.Binary()),
		OutboardFile: "bao-outboard.bin", OutboardLen: int64(len(ob)),
		Off: off, Len: n, CoverStart: start, CoverEnd: end,
		SliceFile: "bao-slice.bin", SliceLen: int64(len(slice)),
	}
	files["bao-outboard.bin"], files["bao-slice.bin"] = ob, slice

	// A collection: a file of ShardSize+1000 bytes as AddFile stores it.
	file := vectorBytes(ShardSize + 1000)
	col := &Collection{Size: int64(len(file))}
	for o := 0; o < len(file); o += ShardSize {
		sh := file[o:min(o+ShardSize, len(file))]
		col.Shards = append(col.Shards, Shard{CID: Sum(sh), Size: int64(len(sh))})
	}
	blob := col.Marshal()
	cc := CollectionCID(Sum(blob).Digest())
	v.Collection = collectionVector{
		Input: vectorInput, Size: col.Size, Shards: col.Shards,
		BlobFile: "collection-v1.json", BlobLen: int64(len(blob)),
		CID: cc.String(), CIDBinary: hex.EncodeToString(cc.Binary()),
		RawCID: cc.Raw().String(), RawCIDBinary: hex.EncodeToString(cc.Raw().Binary()),
	}
	files["collection-v1.json"] = blob
	j, _ := json.MarshalIndent(v, "", "  ")
	files["vectors.json"] = append(j, '\n')
	return v, files
}

// The files under testdata/ are what this code computes from the stated
// rules (go test -run TestVectors -update rewrites them), and they work
// through the store: the slice decodes against the root, the collection
// blob parses and its CID reads as the file.
func TestVectors(t *testing.T) {
	v, files := makeVectors()
	if *update {
		for name, b := range files {
			if err := os.WriteFile(filepath.Join("testdata", name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, want := range files {
		got, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatalf("%v (go test -run TestVectors -update writes it)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("testdata/%s differs from what the code computes (%d bytes; want %d)", name, len(got), len(want))
		}
	}

	// The slice file decodes to the input's groups under the root.
	bs := v.BaoSlice
	slice, _ := os.ReadFile(filepath.Join("testdata", bs.SliceFile))
	c, err := ParseCID(bs.CID)
	if err != nil || c.Hex() != bs.Root {
		t.Fatalf("CID %s: %v; want the root %s", bs.CID, err, bs.Root)
	}
	dst := make([]byte, bs.CoverEnd-bs.CoverStart)
	var scratch [bao.GroupSize]byte
	if err := bao.DecodeSlice(dst, slice, c.Digest(), bs.Size, bs.Off, bs.Len, &scratch); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, vectorBytes(bs.CoverEnd)[bs.CoverStart:]) {
		t.Fatal("vector slice decodes to other bytes")
	}
	// A store serves exactly that slice.
	s := newStore(t)
	put(t, s, vectorBytes(bs.Size))
	if got, err := s.AppendSlice(nil, c, bs.Off, bs.Len); err != nil || !bytes.Equal(got, slice) {
		t.Fatalf("store's slice differs from the vector: %v", err)
	}

	// The collection blob parses, and its CID reads as the file.
	cv := v.Collection
	blob, _ := os.ReadFile(filepath.Join("testdata", cv.BlobFile))
	col, err := ParseCollection(blob)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := ParseCID(cv.CID)
	if err != nil || !cc.IsCollection() || cc.Digest() != Sum(blob).Digest() {
		t.Fatalf("collection CID %s: %v; want the collection CID of the blob", cv.CID, err)
	}
	if testing.Short() {
		return
	}
	path := filepath.Join(t.TempDir(), "file")
	file := vectorBytes(cv.Size)
	os.WriteFile(path, file, 0o644)
	inf, err := s.AddFile(context.Background(), path, nil)
	if err != nil || inf.CID != cc {
		t.Fatalf("AddFile of the vector input: %s, %v; want %s", inf.CID, err, cc)
	}
	if got := readFile(t, s, cc); !bytes.Equal(got, file) {
		t.Fatal("the vector collection does not read as its file")
	}
	if got, _ := s.Collection(cc); len(got.Shards) != len(col.Shards) {
		t.Fatalf("stored collection has %d shards; want %d", len(got.Shards), len(col.Shards))
	}
}
