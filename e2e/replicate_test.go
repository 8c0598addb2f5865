package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// replicaStatus is what these tests read of /api/v1/status's replicas.
type replicaStatus struct {
	Blobs    int
	Replicas []struct {
		CID           string
		Replicas, Min int
		Fetched       int64
		Checked       time.Time
	}
}

func (d *daemon) replicas(t *testing.T) replicaStatus {
	t.Helper()
	_, body := d.do(t, "GET", "/api/v1/status", "", nil)
	var st replicaStatus
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("status %s: %v", body, err)
	}
	return st
}

// Self-heal: one daemon seeds a blob and pins it with --replicas 3; the
// daemons started with --replicate fetch it until 3 live copies exist,
// and then nothing moves. A holder is killed (SIGKILL); another daemon
// fetches the blob and the count is back to 3 within 60 s.
func TestReplicasSelfHeal(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the peer binary")
	}
	t.Parallel() // beside TestSwarmChurn (doc.go)
	peer := peerBinary(t)
	dir := t.TempDir()
	path := writeRandomFile(t, dir, 123, 3<<20+99)
	names := []string{"seed", "a", "b", "c", "d"}
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
	common := []string{"--signal", "ws://" + sigAddr, "--announce-interval", "300ms", "--replicate", "--replicate-interval", "1s"}
	if lvl := os.Getenv("RDRR_E2E_LOG"); lvl != "" {
		common = append(common, "--log-level", lvl) // debug: what the replicators did
	}
	ds := map[string]*daemon{"seed": startDaemon(t, peer, homes["seed"], append(common, "--signal-listen", sigAddr)...)}
	for _, name := range names[1:] {
		ds[name] = startDaemon(t, peer, homes[name], common...)
	}
	waitFor(t, "every daemon online with overlay peers", 30*time.Second, func() bool {
		for _, d := range ds {
			if st := d.status(t); !st.Online || st.P2P == nil || st.P2P.Peers < 2 {
				return false
			}
		}
		return true
	})
	if out, err := exec.Command(peer, "--home", homes["seed"], "pin", cid, "--replicas", "3").CombinedOutput(); err != nil {
		t.Fatalf("peer pin --replicas: %v %s", err, out)
	}
	holders := func() []string {
		var hs []string
		for _, name := range names {
			if d := ds[name]; d != nil && d.replicas(t).Blobs > 0 {
				hs = append(hs, name)
			}
		}
		return hs
	}
	counted := func(d *daemon) int {
		for _, r := range d.replicas(t).Replicas {
			if r.CID == cid {
				return r.Min
			}
		}
		return -1
	}
	start := time.Now()
	waitFor(t, "3 copies", 60*time.Second, func() bool { return len(holders()) >= 3 && counted(ds["seed"]) >= 3 })
	t.Logf("3 copies after %v: %v", time.Since(start).Round(time.Millisecond), holders())
	// Enough copies: nothing moves.
	time.Sleep(5 * time.Second)
	hs := holders()
	if len(hs) != 3 {
		t.Fatalf("%d copies (%v) 5 s after there were 3; want 3", len(hs), hs)
	}
	victim := hs[len(hs)-1]
	if victim == "seed" {
		victim = hs[0]
	}
	watcher := ds["seed"]
	if victim == "seed" || hs[0] == "seed" && len(hs) > 1 && hs[1] != victim {
		watcher = ds[hs[1]]
	}
	ds[victim].cmd.Process.Kill()
	ds[victim].cmd.Wait()
	delete(ds, victim)
	killed := time.Now()
	waitFor(t, "3 live copies after the kill", 60*time.Second, func() bool { return len(holders()) >= 3 && counted(watcher) >= 3 })
	t.Logf("killed %s; 3 live copies again after %v: %v", victim, time.Since(killed).Round(time.Millisecond), holders())
	// The target outlives a restart of the daemon it was pinned on.
	ds["seed"].stop(t)
	ds["seed"] = startDaemon(t, peer, homes["seed"], append(common, "--signal-listen", sigAddr)...)
	waitFor(t, "the restarted seeder to count its target again", 30*time.Second, func() bool {
		for _, r := range ds["seed"].replicas(t).Replicas {
			if r.CID == cid && r.Replicas == 3 && r.Min >= 3 {
				return true
			}
		}
		return false
	})
	want, _ := os.ReadFile(path)
	for _, name := range holders() {
		ds[name].stop(t)
		got := filepath.Join(dir, name+".out")
		if out, err := exec.Command(peer, "--home", homes[name], "get", cid, "-o", got).CombinedOutput(); err != nil {
			t.Fatalf("peer get from %s's store: %v %s", name, err, out)
		}
		if b, _ := os.ReadFile(got); !bytes.Equal(b, want) {
			t.Fatal(fmt.Sprintf("%s's copy differs", name))
		}
	}
}
