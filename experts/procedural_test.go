package experts

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/cas/bao"
)

// A procedural source serves the same verified bytes as the written model.
func TestProceduralSourceServesTheModel(t *testing.T) {
	dir, _ := writeTiny(t, 9)
	mb, _ := os.ReadFile(filepath.Join(dir, ManifestFile))
	ps, err := NewProceduralSource(mb)
	if err != nil {
		t.Fatal(err)
	}
	st := openStore(t)
	info, _, err := AddModel(t.Context(), st, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ps.CID() != info.CID {
		t.Fatalf("procedural collection %s; the stored model is %s", ps.CID(), info.CID)
	}
	col, _ := st.Collection(info.CID)
	blobs := []cas.CID{info.CID}
	for _, s := range col.Shards {
		blobs = append(blobs, s.CID)
	}
	for _, c := range blobs {
		inf, err := ps.Stat(c)
		if err != nil {
			t.Fatalf("Stat %s: %v", c, err)
		}
		want, _ := st.Stat(c)
		if inf.Size != want.Size {
			t.Fatalf("%s: %d bytes; the store has %d", c, inf.Size, want.Size)
		}
		// Fetch it in 256 KiB slices, verifying each as a peer would.
		got := make([]byte, inf.Size)
		for off := int64(0); off < inf.Size; off += 256 << 10 {
			n := min(256<<10, inf.Size-off)
			slice, err := ps.AppendSlice(nil, c, off, n)
			if err != nil {
				t.Fatal(err)
			}
			start, end := bao.Cover(inf.Size, off, n)
			cover := make([]byte, end-start)
			var scratch [bao.GroupSize]byte
			if err := bao.DecodeSlice(cover, slice, c.Digest(), inf.Size, off, n, &scratch); err != nil {
				t.Fatalf("%s [%d, +%d): %v", c, off, n, err)
			}
			copy(got[off:], cover[off-start:off-start+n])
		}
		r, _ := st.Open(c)
		stored := make([]byte, inf.Size)
		r.ReadAt(stored, 0)
		r.Close()
		if string(got) != string(stored) {
			t.Fatalf("%s: served bytes differ from the stored ones", c)
		}
	}
}

// A manifest whose hash the generator does not make is never served.
func TestProceduralSourceRefusesWrongHash(t *testing.T) {
	dir, _ := writeTiny(t, 9)
	mb, _ := os.ReadFile(filepath.Join(dir, ManifestFile))
	m, _ := Decode(mb)
	m.Shards[0].Hash = strings.Repeat("00", 32)
	bad, _ := m.Encode()
	ps, err := NewProceduralSource(bad)
	if err != nil {
		t.Fatal(err)
	}
	_, err = ps.AppendSlice(nil, m.Shards[0].CID(), 0, 1024)
	var se *ShardError
	if !errors.As(err, &se) {
		t.Fatalf("AppendSlice of a shard whose hash is wrong: %v; want a *ShardError", err)
	}
	// A manifest that is not the preset's layout is refused up front.
	m.Shards[0].Hash = strings.Repeat("ab", 32)
	m.Synth.Preset = "mixtral-8x7b"
	other, _ := m.Encode()
	if _, err := NewProceduralSource(other); err == nil {
		t.Fatal("a tiny-moe manifest claiming the mixtral preset was accepted")
	}
}
