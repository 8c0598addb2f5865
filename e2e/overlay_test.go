package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// daemonStatus is what these tests read of /api/v1/status.
type daemonStatus struct {
	Peer   string
	Online bool
	Swarm  struct{ LinksDialed, FetchedBytes, ServedBytes int64 }
	P2P    *struct {
		Addrs        []string
		Peers        int
		RoutingTable int
		Provided     int
	}
}

func (d *daemon) status(t testing.TB) daemonStatus {
	t.Helper()
	_, body := d.do(t, "GET", "/api/v1/status", "", nil)
	var st daemonStatus
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("status %s: %v", body, err)
	}
	return st
}

func (d *daemon) token(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.home, "api.token"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// fetch asks the daemon to fetch c through its API and waits for the job
// to end; it returns the job's error ("" when done).
func (d *daemon) fetch(t *testing.T, c string, within time.Duration) string {
	t.Helper()
	code, body := d.do(t, "POST", "/api/v1/fetch", d.token(t), map[string]string{"cid": c})
	if code != http.StatusAccepted {
		t.Fatalf("fetch: %d %s", code, body)
	}
	var started struct{ ID int }
	json.Unmarshal(body, &started)
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		_, body = d.do(t, "GET", "/api/v1/fetch", "", nil)
		var jobs []struct {
			ID           int
			State, Error string
		}
		json.Unmarshal(body, &jobs)
		for _, j := range jobs {
			if j.ID != started.ID {
				continue
			}
			switch j.State {
			case "done":
				return ""
			case "failed":
				return j.Error
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("fetch of %s did not end in %v", c, within)
	return ""
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s in %v", what, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Daemons that met through a signaling server go on without it: after
// the server process is stopped, a daemon finds the seeder's blob on the
// DHT and opens new WebRTC connections signaled over libp2p; a daemon
// started afterwards with only a bootstrap address (of a peer that does
// not hold the blob) fetches it too. Every copy is byte-exact.
func TestDaemonsOutliveSignaling(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the peer binary")
	}
	t.Parallel() // beside TestSwarmChurn (doc.go)
	peer := peerBinary(t)
	dir := t.TempDir()
	path := writeRandomFile(t, dir, 77, 6<<20+4321)
	homes := map[string]string{}
	for _, name := range []string{"seed", "a", "late"} {
		homes[name] = filepath.Join(dir, name)
		if out, err := exec.Command(peer, "--home", homes[name], "init").CombinedOutput(); err != nil {
			t.Fatalf("peer init: %v %s", err, out)
		}
	}
	out, err := exec.Command(peer, "--home", homes["seed"], "add", "--json", "-q", path).Output()
	if err != nil {
		t.Fatal(err)
	}
	var added []struct{ CID string }
	json.Unmarshal(out, &added)
	cid := added[0].CID

	url, stopSignal := signalProcess(t, peer)

	fast := []string{"--announce-interval", "300ms"}
	seed := startDaemon(t, peer, homes["seed"], append(fast, "--signal", url)...)
	a := startDaemon(t, peer, homes["a"], append(fast, "--signal", url)...)
	// They meet: a link each way whose offer and answer carry libp2p
	// addresses; the seeder provides its blob once it has a peer.
	waitFor(t, "overlay connections and the seeder's provider record", 30*time.Second, func() bool {
		s, x := seed.status(t), a.status(t)
		return s.Online && x.Online && s.P2P != nil && x.P2P != nil && s.P2P.Peers >= 1 && x.P2P.Peers >= 1 && s.P2P.Provided >= 1
	})

	if !stopSignal() { // the signaling server goes away
		t.Fatal("the signaling server did not stop")
	}
	waitFor(t, "the daemons to notice", 15*time.Second, func() bool { return !seed.status(t).Online && !a.status(t).Online })
	dialed := a.status(t).Swarm.LinksDialed

	if e := a.fetch(t, cid, 60*time.Second); e != "" {
		t.Fatalf("fetch without the signaling server: %s", e)
	}
	if got := a.status(t).Swarm.LinksDialed - dialed; got < 1 {
		t.Errorf("%d WebRTC links dialed after the server stopped; want >= 1 (signaled over libp2p)", got)
	}

	// What a fetched it now serves, and announces at once.
	waitFor(t, "a's provider record for what it fetched", 10*time.Second, func() bool { return a.status(t).P2P.Provided >= 1 })

	// A newcomer with no signaling server, bootstrapping through a.
	aAddrs := a.status(t).P2P.Addrs
	if len(aAddrs) == 0 {
		t.Fatal("a has no p2p addresses")
	}
	b, err := os.ReadFile(filepath.Join(homes["a"], "p2p.addr"))
	if err != nil || !strings.Contains(string(b), aAddrs[0]) {
		t.Fatalf("p2p.addr %q (%v) does not hold %s", b, err, aAddrs[0])
	}
	late := startDaemon(t, peer, homes["late"], append(fast, "--bootstrap", aAddrs[0])...)
	if e := late.fetch(t, cid, 60*time.Second); e != "" {
		t.Fatalf("newcomer's fetch: %s", e)
	}
	// The overlay's counters are on /metrics: the newcomer looked the
	// blob up on the DHT, and its routing table is not empty.
	_, metrics := late.do(t, "GET", "/metrics", "", nil)
	for _, want := range []string{`rdrr_dht_lookups_total{result="found"}`, "rdrr_dht_lookup_seconds_bucket", "rdrr_gossip_messages_total"} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("/metrics has no %s:\n%s", want, metrics)
		}
	}
	if st := late.status(t); st.P2P == nil || st.P2P.RoutingTable < 1 {
		t.Errorf("newcomer's p2p status %+v; want a routing table", st.P2P)
	}
	for _, d := range []*daemon{seed, a, late} {
		d.stop(t)
	}
	want, _ := os.ReadFile(path)
	for _, name := range []string{"a", "late"} {
		got := filepath.Join(dir, name+".out")
		if out, err := exec.Command(peer, "--home", homes[name], "get", cid, "-o", got).CombinedOutput(); err != nil {
			t.Fatalf("peer get from %s's store: %v %s", name, err, out)
		}
		if b, _ := os.ReadFile(got); !bytes.Equal(b, want) {
			t.Fatalf("%s's copy differs", name)
		}
	}
}
