package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
)

// SIGTERM in the middle of a fetch: the daemon exits 0 within 15 s
// (daemon.stop), its API address gone from the home (a killed daemon
// leaves it, and the CLI would knock at a dead port); every byte it had
// verified when it was told to stop is kept in its store, and a new
// daemon on the same home fetches only the rest, byte-exact. (That the
// stop also syncs the download, against a power cut, is not seen from
// here: the kernel keeps a killed process's writes too.)
func TestDaemonSIGTERMKeepsProgress(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the peer binary")
	}
	t.Parallel()
	peer := peerBinary(t)
	dir := t.TempDir()
	size := int64(40<<20 + 12345) // one shard
	path := writeRandomFile(t, dir, 4343, size)
	want := hashFile(t, path)
	homes := initHomes(t, peer, dir, "seed", "leech")
	seedHome, leechHome := homes[0], homes[1]
	cid := peerAdd(t, peer, seedHome, path)
	sigAddr := freeAddr(t)
	// 8 MiB/s: the fetch takes about 5 s, long enough to stop it in the
	// middle whatever the machine.
	startDaemon(t, peer, seedHome, "--signal-listen", sigAddr, "--signal", "ws://"+sigAddr, "--upload-rate", "8MiB", "--log-level", "warn")
	quiet := []string{"--signal", "ws://" + sigAddr, "--log-level", "warn"}

	fetch := func(d *daemon) {
		t.Helper()
		tok, err := os.ReadFile(filepath.Join(d.home, "api.token"))
		if err != nil {
			t.Fatal(err)
		}
		var code int
		var body []byte
		for i := 0; i < 100; i++ { // the daemons sign in within a few seconds
			if code, body = d.do(t, "POST", "/api/v1/fetch", strings.TrimSpace(string(tok)), map[string]string{"cid": cid.String()}); code == http.StatusAccepted {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("fetch: %d %s", code, body)
	}
	fetched := func(d *daemon) float64 { return d.metrics(t)["rdrr_swarm_fetched_bytes_total"] }

	leech := startDaemon(t, peer, leechHome, quiet...)
	fetch(leech)
	waitFor(t, "a third of the file fetched", time.Minute, func() bool { return fetched(leech) >= float64(size/3) })
	before := fetched(leech)
	if before >= float64(size)*0.9 {
		t.Fatalf("%v of %d bytes fetched before the stop: too late to show a checkpoint", before, size)
	}
	leech.stop(t) // SIGTERM; exit status 0 within 15 s
	if _, err := os.Stat(filepath.Join(leechHome, "api.addr")); !os.IsNotExist(err) {
		t.Fatalf("api.addr after the daemon stopped: %v; want it removed", err)
	}

	// What the stop kept: the shard's verified groups.
	st, err := cas.Open(leechHome, cas.Options{})
	if err != nil {
		t.Fatal(err)
	}
	partials, err := st.Partials()
	if err != nil {
		t.Fatal(err)
	}
	if len(partials) != 1 {
		t.Fatalf("%d downloads in progress after the stop; want the shard's", len(partials))
	}
	var kept int64
	for c, n := range partials {
		p, err := st.OpenPartial(c, n)
		if err != nil {
			t.Fatal(err)
		}
		kept = n
		for _, r := range p.Missing() {
			kept -= r.Len
		}
		p.Close()
	}
	st.Close()
	if float64(kept) < before {
		t.Fatalf("the stop kept %d verified bytes; %v had been fetched when it was asked to stop", kept, before)
	}
	t.Logf("stopped with %.0f of %d bytes fetched; %d kept", before, size, kept)

	// A new daemon on the home fetches the rest only.
	again := startDaemon(t, peer, leechHome, quiet...)
	fetch(again)
	waitFor(t, "the fetch done", 2*time.Minute, func() bool {
		_, body := again.do(t, "GET", "/api/v1/fetch", "", nil)
		var jobs []struct{ State, Error string }
		json.Unmarshal(body, &jobs)
		if n := len(jobs); n > 0 && jobs[n-1].State == "failed" {
			fetch(again) // the first try may race the sign-in
		}
		return len(jobs) > 0 && jobs[len(jobs)-1].State == "done"
	})
	// The rest of the shard and the collection's list (a few KiB).
	if got, most := fetched(again), float64(size-kept)+1<<20; got > most {
		t.Errorf("the second daemon fetched %v bytes; %d were left", got, size-kept)
	}
	again.stop(t)
	st, err = cas.Open(leechHome, cas.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := hashStored(t, st, cid); got != want {
		t.Fatalf("the copy hashes to %x; want %x", got, want)
	}
}
