package swarm

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
)

// flipOnDisk changes one byte of c's file in st (cas/FORMAT.md's layout):
// the disk changed a verified blob.
func flipOnDisk(t *testing.T, st *cas.Store, c cas.CID, off int64) {
	t.Helper()
	h := c.Hex()
	f, err := os.OpenFile(filepath.Join(st.Dir(), "blobs", h[:2], h), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x20
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// A seeder serves its copy unchecked (UncheckedSource): one the disk
// changed reaches the fetcher, which refuses it, bans the seeder and says
// so (REJECT bad_data); the seeder then checks what it served that peer,
// finds its copy corrupt and stops serving and announcing it, so the
// next fetcher is not sent it (nor bans it). With VerifyServed the seeder
// finds the change itself as it reads, and refuses the request.
func TestCorruptCopyServedUnchecked(t *testing.T) {
	url := startSignal(t)
	for _, verify := range []bool{false, true} {
		t.Run(map[bool]string{false: "unchecked", true: "VerifyServed"}[verify], func(t *testing.T) {
			checks := make(chan error, 64)
			seed := newTestNode(t, url, func(c *Config) {
				c.VerifyServed = verify
				c.testHooks.checked = func(_ cas.CID, _, _ int64, err error) { checks <- err }
			})
			data := randBytes(51, 3<<20+77)
			inf := put(t, seed.st, data)
			flipOnDisk(t, seed.st, inf.CID, 2<<20+5000)

			first := newTestNode(t, url, nil)
			opt := FetchOptions{Peers: []peer.ID{seed.ID()}, FindTimeout: 2 * time.Second}
			if _, err := first.Fetch(ctxFor(t, time.Minute), first.st, inf.CID, opt); err == nil {
				t.Fatal("fetch from a corrupt copy alone succeeded")
			}
			if got := first.Banned(seed.ID()); got != !verify {
				t.Fatalf("fetcher banned the seeder: %v; want %v", got, !verify)
			}
			if verify {
				if inf, _ := seed.st.Stat(inf.CID); inf.Corrupt {
					t.Fatal("the seeder's copy was marked corrupt; nobody refused what it served")
				}
				return
			}
			// The seeder's check marks its copy corrupt.
			found := false
			for !found {
				select {
				case err := <-checks:
					found = errors.Is(err, cas.ErrCorrupt)
				case <-time.After(10 * time.Second):
					t.Fatal("the seeder did not find its copy corrupt")
				}
			}
			if inf, err := seed.st.Stat(inf.CID); err != nil || !inf.Corrupt {
				t.Fatalf("seeder's copy after the check: %+v, %v; want corrupt", inf, err)
			}
			if s := seed.Stats(); s.CorruptServed == 0 {
				t.Error("Stats.CorruptServed is 0")
			}
			second := newTestNode(t, url, nil)
			if _, err := second.Fetch(ctxFor(t, time.Minute), second.st, inf.CID, opt); err == nil {
				t.Fatal("second fetch succeeded")
			}
			if second.Banned(seed.ID()) || second.Stats().BadSlices != 0 {
				t.Fatal("the second fetcher was sent the corrupt copy")
			}
		})
	}
}
