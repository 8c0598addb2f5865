package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// kernelStatus is what these tests read of /api/v1/kernels.
type kernelStatus struct {
	Class        string
	TopicPeers   int
	Active       map[string]string
	Endorsements []struct{ Kernel, Peer, Op string }
	Received     struct {
		Accepted, Duplicate int
		Dropped             map[string]int
	}
	Records   []json.RawMessage
	Published int
	Pulls     []struct {
		Variant   string
		Measured  float64 `json:"measuredSpeedup"`
		Activated bool
		Error     string
	}
}

func (d *daemon) kernels(t *testing.T) kernelStatus {
	t.Helper()
	st, ok := d.kernelsNow(t)
	if !ok {
		t.Fatal("the daemon runs no kernel gossip")
	}
	return st
}

// kernelsNow is /api/v1/kernels, or false while the daemon has not
// joined its kernel topic yet (404).
func (d *daemon) kernelsNow(t *testing.T) (kernelStatus, bool) {
	t.Helper()
	code, body := d.do(t, "GET", "/api/v1/kernels", "", nil)
	if code == http.StatusNotFound {
		return kernelStatus{}, false
	}
	if code != http.StatusOK {
		t.Fatalf("/api/v1/kernels: %d %s", code, body)
	}
	var st kernelStatus
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("/api/v1/kernels %s: %v", body, err)
	}
	return st, true
}

// The kernel lab across processes: peer A times a softmax variant faster
// than the one it runs and endorses it; A's daemon publishes the record
// on its device class's gossip topic; B's daemon (same class, trusting
// A's key) receives it, fetches the variant's blobs from A over the swarm,
// gates and times it in its own child process and activates it; C's
// daemon, of another class, is on another topic and never hears of it.
// All three run a deliberately slow softmax first (the one to beat), so
// that "faster" holds on lavapipe too.
func TestKernelEndorsementByGossip(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three daemons and the kernel lab")
	}
	peer := peerBinary(t)
	dir := t.TempDir()
	homes := map[string]string{}
	run := func(home string, args ...string) []byte {
		t.Helper()
		cmd := exec.Command(peer, append([]string{"--home", home, "--json", "--log-level", "error"}, args...)...)
		cmd.Stderr = tWriter{t, filepath.Base(home)}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("peer %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	addVariant := func(home, file string, extra ...string) string {
		t.Helper()
		var r struct{ CID string }
		out := run(home, append([]string{"kernels", "add", file, "--op", "softmax"}, extra...)...)
		if err := json.Unmarshal(out, &r); err != nil || r.CID == "" {
			t.Fatalf("kernels add: %s (%v)", out, err)
		}
		return r.CID
	}
	var slow string
	for _, name := range []string{"a", "b", "c"} {
		homes[name] = filepath.Join(dir, name)
		run(homes[name], "init")
		slow = addVariant(homes[name], "../kernels/lab/testdata/softmax_slow.wgsl")
		run(homes[name], "kernels", "use", "softmax", slow)
	}
	fast := addVariant(homes["a"], "../kernels/lab/variants/softmax_wg.wgsl", "--const", "WG=64")
	var rec struct {
		Endorsement struct{ Kernel, Peer, Class string }
	}
	if err := json.Unmarshal(run(homes["a"], "kernels", "endorse", fast, "--runs", "15"), &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Endorsement.Kernel != fast {
		t.Fatalf("A endorsed %+v; want %s", rec.Endorsement, fast)
	}
	trusted := filepath.Join(dir, "trusted.txt")
	if err := os.WriteFile(trusted, []byte(rec.Endorsement.Peer+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	sigAddr := freeAddr(t)
	fast500 := []string{"--announce-interval", "300ms", "--kernel-announce-interval", "1s"}
	a := startDaemon(t, peer, homes["a"], append(fast500, "--signal-listen", sigAddr)...)
	waitFor(t, "A's p2p address", 30*time.Second, func() bool { s := a.status(t); return s.P2P != nil && len(s.P2P.Addrs) > 0 })
	join := append(fast500, "--signal", "ws://"+sigAddr, "--bootstrap", a.status(t).P2P.Addrs[0],
		"--kernel-pull", "--kernel-trust-keys", trusted, "--kernel-runs", "15")
	b := startDaemon(t, peer, homes["b"], join...)
	c := startDaemon(t, peer, homes["c"], append(join, "--kernel-class", "vulkan/ffff/ffff/other")...)

	waitFor(t, "B to receive, fetch, check and activate A's variant", 4*time.Minute, func() bool {
		st, ok := b.kernelsNow(t)
		return ok && st.Active["softmax"] == fast
	})
	waitFor(t, "C's kernel gossip", time.Minute, func() bool { _, ok := c.kernelsNow(t); return ok })
	kb := b.kernels(t)
	if kb.Class != rec.Endorsement.Class || kb.Received.Accepted != 1 || len(kb.Endorsements) != 1 || kb.Endorsements[0].Kernel != fast {
		t.Errorf("B's kernel state %+v; want A's one endorsement for %s", kb, rec.Endorsement.Class)
	}
	if len(kb.Records) != 1 || !strings.Contains(string(kb.Records[0]), fast) {
		t.Errorf("B serves records %s; want A's signed record", kb.Records)
	}
	if len(kb.Pulls) == 0 || !kb.Pulls[len(kb.Pulls)-1].Activated || kb.Pulls[len(kb.Pulls)-1].Measured <= 1 {
		t.Errorf("B's pulls %+v; want the variant activated, measured faster here", kb.Pulls)
	}
	if ka := a.kernels(t); ka.Published < 1 || ka.TopicPeers < 1 {
		t.Errorf("A published %d records to %d topic peers", ka.Published, ka.TopicPeers)
	}
	kc := c.kernels(t)
	if kc.Active["softmax"] != slow || len(kc.Endorsements) != 0 || kc.Received.Accepted+kc.Received.Duplicate+len(kc.Received.Dropped) != 0 {
		t.Errorf("C (another class) %+v; want nothing heard, softmax still %s", kc, slow)
	}
	_, metrics := b.do(t, "GET", "/metrics", "", nil)
	if !strings.Contains(string(metrics), `rdrr_kernel_pulls_total{result="activated"} 1`) {
		t.Errorf("B's /metrics has no activated pull:\n%s", metrics)
	}
	for _, d := range []*daemon{a, b, c} {
		d.stop(t)
	}
	// What B activated and received outlives the daemon.
	var list struct {
		Active map[string]string
	}
	if err := json.Unmarshal(run(homes["b"], "kernels", "list"), &list); err != nil {
		t.Fatal(err)
	}
	if list.Active["softmax"] != fast {
		t.Errorf("B's registry after the daemon stopped: %+v; want softmax %s", list, fast)
	}
}
