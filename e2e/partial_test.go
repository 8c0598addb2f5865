package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// One seeder whose upload is capped (as a home uplink is) and several
// leechers that fetch the same blob at once, every one its own process:
// the leechers serve each other the pieces they have verified, so they
// finish sooner than the seeder alone could serve them and the seeder
// uploads far fewer copies than there are leechers. Every copy is
// byte-exact. The bytes each daemon served come from its status API.
func TestLeechersServeWhatTheyHave(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the peer binary")
	}
	peer := peerBinary(t)
	dir := t.TempDir()
	const leechers = 4
	size := int64(16<<20 + 777)
	const rate = 8 << 20 // the seeder's upload cap, bytes a second
	path := writeRandomFile(t, dir, 91, size)
	names := []string{"seed"}
	for i := range leechers {
		names = append(names, fmt.Sprintf("l%d", i))
	}
	homes := map[string]string{}
	for _, name := range names {
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

	sigAddr := freeAddr(t)
	seed := startDaemon(t, peer, homes["seed"], "--signal-listen", sigAddr, "--signal", "ws://"+sigAddr, "--upload-rate", fmt.Sprint(rate))
	ds := map[string]*daemon{"seed": seed}
	for _, name := range names[1:] {
		ds[name] = startDaemon(t, peer, homes[name], "--signal", "ws://"+sigAddr)
	}
	waitFor(t, "every daemon online", 30*time.Second, func() bool {
		for _, d := range ds {
			if !d.status(t).Online {
				return false
			}
		}
		return true
	})

	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]string, leechers)
	for i, name := range names[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = ds[name].fetch(t, cid, 90*time.Second)
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for i, e := range errs {
		if e != "" {
			t.Fatalf("leecher %d: %s", i, e)
		}
	}
	bySeed := seed.status(t).Swarm.ServedBytes
	var byLeechers int64
	for _, name := range names[1:] {
		byLeechers += ds[name].status(t).Swarm.ServedBytes
	}
	alone := time.Duration(float64(leechers*size) / rate * float64(time.Second))
	t.Logf("%d leechers x %d bytes in %v (the seeder alone at %d B/s: %v): the seeder served %d bytes (%.2f copies), the leechers %d (%.2f copies)",
		leechers, size, took.Round(time.Millisecond), rate, alone.Round(time.Millisecond), bySeed, float64(bySeed)/float64(size), byLeechers, float64(byLeechers)/float64(size))
	if total := bySeed + byLeechers; total < leechers*size {
		t.Fatalf("%d bytes served in all for %d copies of %d", total, leechers, size)
	}
	if byLeechers < size {
		t.Errorf("the leechers served %d bytes; want at least one copy (%d)", byLeechers, size)
	}
	if bySeed > (leechers-1)*size {
		t.Errorf("the seeder served %.2f copies; want at most %d", float64(bySeed)/float64(size), leechers-1)
	}
	// /metrics has the bytes per peer; the seeder's add up to what it
	// served. A leecher's last endgame copy may still be on its way when
	// the fetches end, so the two are compared when the served total did
	// not move across the read of /metrics (at most 20 tries).
	var perPeerOut float64
	var served int64
	for try := 0; try < 20; try++ {
		before := seed.status(t).Swarm.ServedBytes
		_, metrics := seed.do(t, "GET", "/metrics", "", nil)
		perPeerOut = 0
		for _, line := range strings.Split(string(metrics), "\n") {
			if strings.HasPrefix(line, "rdrr_swarm_peer_bytes_total{") && strings.Contains(line, `direction="out"`) {
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				perPeerOut += v
			}
		}
		if served = seed.status(t).Swarm.ServedBytes; served == before {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	if int64(perPeerOut) != served {
		t.Errorf("the seeder's rdrr_swarm_peer_bytes_total out sums to %.0f; it served %d", perPeerOut, served)
	}
	for _, d := range ds {
		d.stop(t)
	}
	want, _ := os.ReadFile(path)
	for _, name := range names[1:] {
		got := filepath.Join(dir, name+".out")
		if out, err := exec.Command(peer, "--home", homes[name], "get", cid, "-o", got).CombinedOutput(); err != nil {
			t.Fatalf("peer get from %s's store: %v %s", name, err, out)
		}
		if b, _ := os.ReadFile(got); !bytes.Equal(b, want) {
			t.Fatalf("%s's copy differs", name)
		}
	}
}
