package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/swarm"
)

// seedDaemon starts a daemon with an embedded signaling server that holds a
// random blob of size bytes, and returns it with the blob's CID.
func seedDaemon(t *testing.T, bin string, seed uint64, size int64) (*daemon, string, cas.CID) {
	t.Helper()
	dir := t.TempDir()
	home := filepath.Join(dir, "seed")
	if out, err := exec.Command(bin, "--home", home, "init").CombinedOutput(); err != nil {
		t.Fatalf("peer init: %v %s", err, out)
	}
	var c cas.CID
	if size > 0 {
		path := writeRandomFile(t, dir, seed, size)
		out, err := exec.Command(bin, "--home", home, "add", "--json", "-q", path).Output()
		if err != nil {
			t.Fatal(err)
		}
		var added []struct {
			CID cas.CID `json:"cid"`
		}
		if err := json.Unmarshal(out, &added); err != nil || len(added) != 1 {
			t.Fatalf("peer add: %s %v", out, err)
		}
		c = added[0].CID
	}
	sig := freeAddr(t)
	d := startDaemon(t, bin, home, "--signal-listen", sig)
	return d, "ws://" + sig + "/v1", c
}

// TestBrowser is the browser peer's acceptance, in Debian's chromium
// (headless) in a private network namespace, one browser for every part:
// the daemon's status page and /app/; a 64 MiB blob fetched by the page from
// a native daemon, the BLAKE3 the page computes of what it kept equal to
// the CID; the page seeding a native peer and another page; a native peer
// that serves corrupt data caught at the bad group and banned, nothing of
// it kept; a page reloaded mid-fetch resuming from what it kept.
func TestBrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("drives chromium")
	}
	chromium(t)
	bin := peerBinary(t)
	if !inPrivateNet(t, "RDRR_PEER_BIN="+bin) {
		return
	}
	bctx := newBrowser(t)
	t.Run("fetch from daemon", func(t *testing.T) { testBrowserFetch(t, bctx, bin) })
	t.Run("seeds", func(t *testing.T) { testBrowserSeeds(t, bctx, bin) })
	t.Run("corrupt peer", func(t *testing.T) { testBrowserCorrupt(t, bctx, bin) })
	t.Run("resume", func(t *testing.T) { testBrowserResume(t, bctx, bin) })
}

// appURL is the daemon's browser peer, in a store of its own.
func appURL(d *daemon, store string) string {
	return d.api + "/app/?loopback=0&store=" + store
}

func testBrowserFetch(t *testing.T, bctx context.Context, bin string) {
	size := int64(64 << 20)
	d, _, c := seedDaemon(t, bin, 41, size)

	status := newTabNoPeer(t, bctx, d.api+"/")
	text, err := chromedp.Run(status.ctx, chromedp.Text(chromedp.CSS("body")))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text, "12D3KooW") {
		t.Errorf("status page shows no peer ID:\n%s", text)
	}
	var linked bool
	status.eval(`document.querySelector('a[href="/app/"]') !== null`, &linked, 5*time.Second)
	if !linked {
		t.Error("the status page does not link to /app/")
	}

	p := newTab(t, bctx, appURL(d, "fetch"))
	var storage string
	p.eval(`document.getElementById("storage").textContent`, &storage, 5*time.Second)
	if storage != "opfs" {
		t.Errorf("page storage %q; want opfs", storage)
	}
	r := p.fetch(c.String(), 120*time.Second)
	if want := hex.EncodeToString(c.AppendDigest(nil)); r.Hash != want {
		t.Fatalf("page's BLAKE3 of what it kept = %s; want %s (the CID)", r.Hash, want)
	}
	t.Logf("page fetched %d bytes in %d ms: %.2f MB/s", r.Size, r.MS, float64(r.Fetched)/1e3/float64(max(r.MS, 1)))
	// The built-in kernel check, on the WebGPU chromium has
	// (SwiftShader with --enable-unsafe-webgpu).
	var gpu string
	p.eval(`rdrrApp.gpuCheck().then((r) => (document.getElementById("gpu").textContent = r))`, &gpu, 60*time.Second)
	t.Logf("page's kernel check: %s", gpu)
	if strings.HasPrefix(gpu, "FAILED") {
		t.Errorf("kernel check: %s", gpu)
	}
	p.screenshot("fetch-from-daemon")
	s := p.stats()
	if len(s.Blobs) != 1 || !s.Blobs[0].Whole || s.Blobs[0].CID != c.String() {
		t.Errorf("page holds %+v; want %s whole", s.Blobs, c)
	}
	// Chromium shows the peer's certificate: the links that carried the
	// fetch were checked against the signed fingerprints, as native
	// links are (a mismatch closes a link).
	if s.CertCheck != "getRemoteCertificates" {
		t.Errorf("page checks certificates by %q; want getRemoteCertificates in chromium", s.CertCheck)
	}
	// The daemon's status page lists the page as a peer. The status page
	// reloads itself every 2 s (a meta refresh): reading it is tried
	// again until it names the page, as a read (or a reload of our own)
	// that meets a reload in progress fails ("Not attached to an active
	// page").
	for deadline := time.Now().Add(20 * time.Second); ; {
		rctx, cancel := context.WithTimeout(status.ctx, 5*time.Second)
		text, err = chromedp.Run(rctx, chromedp.Text(chromedp.CSS("#peers")))
		cancel()
		if err == nil && strings.Contains(text, s.ID) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("status page peers %q (%v); want the page %s", text, err, s.ID)
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// newTabNoPeer opens url in a new tab and waits for it to load.
func newTabNoPeer(t testing.TB, bctx context.Context, url string) *page {
	t.Helper()
	ctx, cancel := chromedp.NewContext(bctx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx, chromedp.Navigate(url)); err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	return &page{t: t, ctx: ctx}
}

// nativeMember signs a native peer in to the signaling server at url, in
// the default topic, serving src; loopback only.
func nativeMember(t testing.TB, url string, src swarm.Source) *swarm.Member {
	t.Helper()
	id, err := swarm.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m, err := swarm.Start(ctx, swarm.StartOptions{
		Config:    swarm.Config{Identity: id, Source: src, Loopback: true},
		SignalURL: url,
		Topics:    []string{"rdrr"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func openCAS(t testing.TB) *cas.Store {
	t.Helper()
	st, err := cas.Open(t.TempDir(), cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// putRandom makes size pseudo-random bytes in the page (seeded) and stores
// them there; it returns their CID as the page computed it and the bytes.
func (p *page) putRandom(seed uint64, size int) (cas.CID, []byte) {
	p.t.Helper()
	data := randBytes(seed, size)
	// The bytes travel as base64 to the page, which decodes and stores them.
	var s string
	p.eval(fmt.Sprintf(`rdrrPeer.put(Uint8Array.from(atob(%q), (c) => c.charCodeAt(0)))`, base64.StdEncoding.EncodeToString(data)), &s, 60*time.Second)
	c, err := cas.ParseCID(s)
	if err != nil {
		p.t.Fatal(err)
	}
	if want := cas.Sum(data); c != want {
		p.t.Fatalf("page put CID %s; want %s", c, want)
	}
	return c, data
}

// The browser peer serves: the page seeds a blob and a native peer fetches
// it byte-exact; then a second page (its own storage, IndexedDB, and
// identity, in the same browser) fetches it from the first through the
// swarm.
func testBrowserSeeds(t *testing.T, bctx context.Context, bin string) {
	d, sigURL, _ := seedDaemon(t, bin, 0, 0)
	a := newTab(t, bctx, appURL(d, "a"))
	c, data := a.putRandom(43, 8<<20+12345)
	aID := a.stats().ID

	st := openCAS(t)
	m := nativeMember(t, sigURL, st)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pid, err := peer.Decode(aID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Node().Fetch(ctx, st, c, swarm.FetchOptions{Peers: []peer.ID{pid}}); err != nil {
		t.Fatalf("native fetch from the page: %v", err)
	}
	rd, err := st.Open(c)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	_, err = rd.ReadAt(got, 0)
	rd.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("native peer read %v, equal %v", err, bytes.Equal(got, data))
	}
	if s := a.stats(); s.Served < int64(len(data)) {
		t.Errorf("page served %d bytes; want at least %d", s.Served, len(data))
	}

	// A second tab on a's store is refused: one peer per storage.
	dup := newTabNoPeer(t, bctx, appURL(d, "a"))
	var dupErr string
	dup.eval(`rdrrApp.started.then(() => "started", (e) => e.message)`, &dupErr, 30*time.Second)
	if !strings.Contains(dupErr, "open in another tab") {
		t.Errorf("second tab on one store: %q; want it refused", dupErr)
	}

	// Page to page. The native peer is gone, so that only a can serve.
	m.Close()
	// b keeps its blobs in IndexedDB, as a browser without OPFS does.
	b := newTab(t, bctx, appURL(d, "b")+"&storage=indexeddb")
	var storage string
	b.eval(`document.getElementById("storage").textContent`, &storage, 5*time.Second)
	if storage != "indexeddb" {
		t.Errorf("page b storage %q; want indexeddb", storage)
	}
	if bID := b.stats().ID; bID == aID {
		t.Fatalf("two stores share identity %s", bID)
	}
	r := b.fetch(c.String(), 60*time.Second)
	if want := hex.EncodeToString(c.AppendDigest(nil)); r.Hash != want {
		t.Fatalf("page b's BLAKE3 = %s; want %s", r.Hash, want)
	}
	b.screenshot("page-from-page")
}

// randBytes returns n deterministic pseudo-random bytes.
func randBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, ^seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// corruptSource serves st's blobs with one byte flipped in every chunk
// that starts a 1 MiB piece: the last byte of the chunk's slice, in the
// last of its 16 groups (serve reads 256 KiB chunks). It embeds the
// store, so a node serves through its unchecked path (as a peer whose
// disk changed the bytes): that path is corrupted too.
type corruptSource struct{ *cas.Store }

func (s corruptSource) AppendSlice(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	out, err := s.Store.AppendSlice(dst, c, off, n)
	return flipPieceStart(out, err, len(dst), off)
}

func (s corruptSource) AppendSliceUnchecked(dst []byte, c cas.CID, off, n int64) ([]byte, error) {
	out, err := s.Store.AppendSliceUnchecked(dst, c, off, n)
	return flipPieceStart(out, err, len(dst), off)
}

// flipPieceStart flips the last byte of a slice appended to out from
// index start, if the slice starts a 1 MiB piece (corruptSource).
func flipPieceStart(out []byte, err error, start int, off int64) ([]byte, error) {
	if err == nil && off%(1<<20) == 0 && len(out) > start {
		out[len(out)-1] ^= 0x20
	}
	return out, err
}

// A native peer that serves corrupt data is caught at the bad group,
// banned, and nothing it sent is kept; an honest peer then completes the
// fetch.
func testBrowserCorrupt(t *testing.T, bctx context.Context, bin string) {
	d, sigURL, _ := seedDaemon(t, bin, 0, 0)
	data := randBytes(47, 6<<20)
	bad := openCAS(t)
	inf, err := bad.Put(context.Background(), bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	c := inf.CID
	liar := nativeMember(t, sigURL, corruptSource{bad})
	liarID := liar.Node().ID().String()

	p := newTab(t, bctx, appURL(d, "corrupt"))
	p.eval(fmt.Sprintf(`(rdrrApp.fetch(%q).catch(() => {}), true)`, c), nil, 5*time.Second)
	var s pageStats
	for deadline := time.Now().Add(60 * time.Second); ; {
		s = p.stats()
		if len(s.Banned) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the liar was not banned: %+v", s)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(s.Banned) != 1 || s.Banned[0] != liarID {
		t.Fatalf("banned %v; want the liar %s", s.Banned, liarID)
	}
	found := false
	for _, e := range s.Events {
		if e.Kind != swarm.EventBadData {
			continue
		}
		found = true
		if e.Peer != liarID || e.CID != c.String() || e.Off%(1<<20) != 15*cas.GroupSize || e.Len != cas.GroupSize {
			t.Errorf("bad data event %+v; want the liar, %s, the 16th group of a piece", e, c)
		}
	}
	if !found {
		t.Fatalf("no bad_data event: %+v", s.Events)
	}
	// Nothing of the bad slices is kept: at most the group that proved
	// the size (the last; the liar serves it intact), in the last piece.
	for _, b := range s.Blobs {
		if b.CID == c.String() && b.Verified > cas.GroupSize {
			t.Errorf("page kept %d bytes from the liar; want at most the size proof", b.Verified)
		}
	}
	var files []string
	p.eval(`rdrrShell.files.list()`, &files, 5*time.Second)
	for _, f := range files {
		if strings.HasPrefix(f, c.Hex()+".p") && f != c.Hex()+".p5" {
			t.Errorf("OPFS holds %s after only bad slices", f)
		}
	}
	p.screenshot("corrupt-peer")

	good := openCAS(t)
	if _, err := good.Put(context.Background(), bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	nativeMember(t, sigURL, good)
	var state string
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		p.eval(`rdrrApp.lastFetch.state`, &state, 5*time.Second)
		if state != "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fetch did not end after an honest peer came")
		}
	}
	if state != "done" {
		// It gave up before the honest peer came: ask again.
		p.fetch(c.String(), 60*time.Second)
	}
	var hash string
	p.eval(fmt.Sprintf(`rdrrPeer.hash(%q)`, c), &hash, 10*time.Second)
	if want := hex.EncodeToString(c.AppendDigest(nil)); hash != want {
		t.Fatalf("page's BLAKE3 after the honest peer = %s; want %s", hash, want)
	}
}

// A page reloaded in the middle of a fetch resumes from the groups it kept.
func testBrowserResume(t *testing.T, bctx context.Context, bin string) {
	size := int64(24 << 20)
	d, _, c := seedDaemon(t, bin, 53, size)
	p := newTab(t, bctx, appURL(d, "resume"))
	p.eval(fmt.Sprintf(`(rdrrApp.fetch(%q).catch(() => {}), true)`, c), nil, 5*time.Second)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		s := p.stats()
		if len(s.Blobs) == 1 && s.Blobs[0].Verified >= size/2 {
			if s.Blobs[0].Whole {
				t.Fatal("the fetch finished before the reload: make the blob larger")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress to reload at: %+v", s.Blobs)
		}
	}
	if err := chromedp.Do(p.ctx, chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	p.waitStarted()
	s := p.stats()
	if len(s.Blobs) != 1 || s.Blobs[0].Whole || s.Blobs[0].Verified == 0 {
		t.Fatalf("after the reload the page holds %+v; want part of %s", s.Blobs, c)
	}
	kept := s.Blobs[0].Verified
	r := p.fetch(c.String(), 60*time.Second)
	if want := hex.EncodeToString(c.AppendDigest(nil)); r.Hash != want {
		t.Fatalf("page's BLAKE3 after resuming = %s; want %s", r.Hash, want)
	}
	// Only what was missing was fetched (and the group that proves the
	// size again).
	if r.Fetched > size-kept+cas.GroupSize {
		t.Errorf("resumed fetch took %d bytes; %d of %d were kept", r.Fetched, kept, size)
	}
	t.Logf("reloaded with %d of %d bytes kept; the fetch took the other %d", kept, size, r.Fetched)
}
