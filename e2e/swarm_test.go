package e2e

import (
	"context"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm"
)

// fileSize is 200 MiB (a collection of four shards), smaller under -short.
func fileSize() int64 {
	if testing.Short() {
		return 70 << 20
	}
	return 200 << 20
}

func serveChild(t *testing.T, url, home string, env ...string) (*child, peer.ID) {
	t.Helper()
	c := startChild(t, "serve", append([]string{envHome + "=" + home, envSignal + "=" + url, envTopic + "=t"}, env...)...)
	id, err := peer.Decode(strings.Fields(c.expect("ready", 30*time.Second))[0])
	if err != nil {
		t.Fatal(err)
	}
	return c, id
}

// A collection moves byte-exact from a peer in another process.
func TestTwoProcessCollection(t *testing.T) {
	url := startSignal(t)
	path := writeRandomFile(t, t.TempDir(), 1, fileSize())
	homeA, c := newHome(t, path)
	srv, srvID := serveChild(t, url, homeA)
	b := newLocalNode(t, url, t.TempDir(), "t")
	start := time.Now()
	info, err := b.Fetch(ctxFor(t, 5*time.Minute), b.st, c, swarm.FetchOptions{Peers: []peer.ID{srvID}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bytes in %v (%.0f MB/s)", fileSize(), time.Since(start), float64(fileSize())/time.Since(start).Seconds()/1e6)
	if info.CID != c || !sameFile(t, b.st, c, path) {
		t.Fatal("fetched collection differs from the file")
	}
	srv.stop(10 * time.Second)
}

// A peer that flips bytes is caught and banned; the fetch completes,
// byte-exact, from the honest one. Both serve at once.
func TestTwoProcessBadPeer(t *testing.T) {
	url := startSignal(t)
	path := writeRandomFile(t, t.TempDir(), 2, 70<<20)
	homeH, c := newHome(t, path)
	homeL, _ := newHome(t, path)
	_, honest := serveChild(t, url, homeH)
	_, liar := serveChild(t, url, homeL, envFlip+"=every")
	b := newLocalNode(t, url, t.TempDir(), "t")
	if _, err := b.Fetch(ctxFor(t, 5*time.Minute), b.st, c, swarm.FetchOptions{Peers: []peer.ID{liar, honest}}); err != nil {
		t.Fatal(err)
	}
	if !sameFile(t, b.st, c, path) {
		t.Fatal("fetched file differs")
	}
	if !b.Banned(liar) || b.Banned(honest) {
		t.Fatalf("banned: liar %v, honest %v", b.Banned(liar), b.Banned(honest))
	}
	var bad []swarm.Event
	for _, e := range b.Events() {
		if e.Kind == swarm.EventBadData {
			bad = append(bad, e)
		}
	}
	// One event: the first bad group (a whole group, or the tail of a
	// small blob); slices in flight when the ban fell are refused quietly.
	if len(bad) != 1 || bad[0].Peer != liar || bad[0].Off%cas.GroupSize != 0 || bad[0].Len <= 0 || bad[0].Len > cas.GroupSize {
		t.Fatalf("bad-data events %+v; want one naming %s and one group", bad, liar)
	}
}

// The flipped group of a single-byte liar is exactly the one reported,
// and nothing of it reaches the disk.
func TestTwoProcessFirstBadGroup(t *testing.T) {
	url := startSignal(t)
	data := writeRandomFile(t, t.TempDir(), 3, 24<<20)
	homeL, c := newHome(t, data)
	raw, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	const badOff = 9<<20 + 4321
	_, liar := serveChild(t, url, homeL, envFlip+"="+c.String()+":"+hex.EncodeToString(raw[badOff:badOff+32]))
	b := newLocalNode(t, url, t.TempDir(), "t")
	if _, err := b.Fetch(ctxFor(t, time.Minute), b.st, c, swarm.FetchOptions{Peers: []peer.ID{liar}, FindTimeout: time.Second}); err == nil {
		t.Fatal("fetch from a liar succeeded")
	}
	ev := b.Events()
	want := int64(badOff) / cas.GroupSize * cas.GroupSize
	found := false
	for _, e := range ev {
		found = found || e.Kind == swarm.EventBadData && e.Peer == liar && e.CID == c && e.Off == want && e.Len == cas.GroupSize
	}
	if !found {
		t.Fatalf("events %+v; want bad_data for group [%d, +16 KiB) of %s from %s", ev, want, c, liar)
	}
	p, err := b.st.OpenPartial(c, int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if p.Have(want, cas.GroupSize) {
		t.Fatal("the flipped group was written")
	}
	var missing int64
	for _, r := range p.Missing() {
		missing += r.Len
	}
	if missing == int64(len(raw)) {
		t.Fatal("none of the liar's good pieces was kept")
	}
}

// A fetcher killed mid-way (SIGKILL) resumes from what it had verified.
func TestTwoProcessResumeAfterKill(t *testing.T) {
	url := startSignal(t)
	size := int64(160 << 20)
	path := writeRandomFile(t, t.TempDir(), 4, size)
	homeA, c := newHome(t, path)
	// Served at 40 MB/s at most: unbounded, loopback moves the file in
	// under a second, and the fetch could end between the moment it is
	// seen most done and the kill (every shard whole, nothing to resume).
	a := newLocalNodeWith(t, url, homeA, "t", func(c *swarm.Config) { c.ServeRate = 40e6 })
	homeB, _ := newHome(t, "")
	env := []string{envHome + "=" + homeB, envSignal + "=" + url, envTopic + "=t", envCID + "=" + c.String()}

	// Killed once a shard is in its store (durable: "progress" counts
	// bytes written, and a shard whose last byte was written may still be
	// syncing) and most bytes have been written (shards in progress have
	// flushed groups).
	f1 := startChild(t, "fetch", env...)
	var done1, stored1 int64
	for deadline := time.After(2 * time.Minute); stored1 == 0 || done1 < size*85/100; {
		select {
		case l, ok := <-f1.lines:
			if !ok {
				t.Fatal("first fetch exited before it was killed")
			}
			if rest, found := strings.CutPrefix(l, "error "); found {
				t.Fatalf("first fetch: %s", rest)
			}
			if strings.HasPrefix(l, "done ") {
				t.Fatal("first fetch finished before it was killed")
			}
			if rest, found := strings.CutPrefix(l, "progress "); found {
				done1, _ = strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			}
			if rest, found := strings.CutPrefix(l, "stored "); found {
				stored1, _ = strconv.ParseInt(rest, 10, 64)
			}
		case <-deadline:
			t.Fatalf("first fetch: %d bytes written, %d stored after 2m", done1, stored1)
		}
	}
	f1.kill()
	// The seeder may still complete requests of the dead fetcher (into
	// SCTP buffers, until its serving budget for that peer is full): what
	// it served the first fetch is read once that has stopped.
	served1 := a.Stats().ServedBytes
	for settle := time.Now().Add(10 * time.Second); time.Now().Before(settle); {
		time.Sleep(time.Second)
		s := a.Stats().ServedBytes
		if s == served1 {
			break
		}
		served1 = s
	}

	// What survived the crash: verified shards and flushed groups of the
	// shards in progress.
	st, err := cas.Open(homeB, cas.Options{})
	if err != nil {
		t.Fatal(err)
	}
	col, err := a.st.Collection(c)
	if err != nil {
		t.Fatal(err)
	}
	inProgress, err := st.Partials()
	if err != nil {
		t.Fatal(err)
	}
	var kept, partial int64
	for _, sh := range col.Shards {
		if st.Has(sh.CID) {
			kept += sh.Size
			continue
		}
		if _, ok := inProgress[sh.CID]; !ok {
			continue
		}
		p, err := st.OpenPartial(sh.CID, sh.Size)
		if err != nil {
			t.Fatal(err)
		}
		partial += sh.Size
		for _, r := range p.Missing() {
			partial -= r.Len
		}
		p.Close()
	}
	st.Close()
	// Groups of a shard in progress are durable where the store flushed
	// them (after 64 MiB or 2 s of its download); the second fetch must
	// skip them as it skips whole shards.
	t.Logf("killed after %d bytes served; %d bytes of whole shards and %d of flushed groups kept", served1, kept, partial)
	if kept < stored1 {
		t.Fatalf("%d bytes of whole shards survived the kill; the fetcher had stored %d", kept, stored1)
	}
	// On a loaded machine every byte may be written and flushed before
	// the first shard's commit, so nothing is missing: the second fetch
	// must then resume the shards in progress from their flushed groups,
	// writing nothing (a fresh-clone make test saw 32 MiB whole and 128
	// MiB flushed). Only whole shards everywhere leave nothing to resume.
	if kept >= size {
		t.Fatalf("every shard was whole after the kill (%d bytes): nothing to resume", kept)
	}

	// The second fetch writes exactly what was missing: its progress lines
	// count the verified bytes it wrote, from 0 in each round.
	f2 := startChild(t, "fetch", env...)
	var wrote, last int64
	deadline := time.After(2 * time.Minute)
	for finished := false; !finished; {
		select {
		case l, ok := <-f2.lines:
			if !ok {
				t.Fatal("second fetch exited before \"done\"")
			}
			if rest, found := strings.CutPrefix(l, "error "); found {
				t.Fatalf("second fetch: %s", rest)
			}
			if rest, found := strings.CutPrefix(l, "progress "); found {
				done, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
				if done < last { // a new round
					wrote += last
				}
				last = done
			}
			finished = strings.HasPrefix(l, "done ")
		case <-deadline:
			t.Fatal("second fetch: no \"done\" line in 2m")
		}
	}
	wrote += last
	f2.stop(10 * time.Second)
	if want := size - kept - partial; wrote != want {
		t.Fatalf("resumed fetch wrote %d bytes; %d were missing (%d kept in whole shards, %d in flushed groups)", wrote, want, kept, partial)
	}
	again := a.Stats().ServedBytes - served1
	t.Logf("resumed fetch wrote %d bytes, the seeder served %d", wrote, again)
	if again > size-kept-partial+16<<20 {
		t.Fatalf("resumed fetch moved %d bytes; %d of %d were kept", again, kept+partial, size)
	}
	st, err = cas.Open(homeB, cas.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if !sameFile(t, st, c, path) {
		t.Fatal("resumed file differs")
	}
}

func ctxFor(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
