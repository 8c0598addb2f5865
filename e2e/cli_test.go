package e2e

import (
	"bufio"
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

	"github.com/coder/websocket"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/swarm"
)

// peerBinary returns the `peer` command: $RDRR_PEER_BIN, or the one built
// from ./cmd/peer for this run of the tests (built.build).
func peerBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("RDRR_PEER_BIN"); p != "" {
		return p
	}
	built.once.Do(built.build)
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

// peerBuild is the `peer` command built once for every test of a run:
// each test linked its own, 6-7 s apiece on a 2-core machine (80 s of
// make test). TestMain removes it after the tests.
type peerBuild struct {
	once sync.Once
	dir  string // holds path; "" until built
	path string
	err  error
}

var built peerBuild

// build runs scripts/build-wasm.sh (which does nothing when the
// WebAssembly is up to date), so that the binary embeds the browser peer
// whichever test asks first, then builds ./cmd/peer.
func (b *peerBuild) build() {
	if out, err := exec.Command("../scripts/build-wasm.sh").CombinedOutput(); err != nil {
		b.err = fmt.Errorf("build-wasm.sh: %v\n%s", err, out)
		return
	}
	if b.dir, b.err = os.MkdirTemp("", "rdrr-e2e-peer-"); b.err != nil {
		return
	}
	b.path = filepath.Join(b.dir, "peer")
	if out, err := exec.Command("go", "build", "-o", b.path, "../cmd/peer").CombinedOutput(); err != nil {
		b.err = fmt.Errorf("go build ../cmd/peer: %v\n%s", err, out)
	}
}

// remove deletes what build made.
func (b *peerBuild) remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// TestCLI runs `peer signal`, `peer serve` and `peer get` as separate
// processes, as a user would.
func TestCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the peer binary")
	}
	t.Parallel() // beside TestSwarmChurn (doc.go)
	peer := peerBinary(t)
	run := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(peer, args...)
		cmd.Stderr = tWriter{t, args[2]}
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("peer %s: %v", strings.Join(args, " "), err)
		}
		return out
	}
	background := func(args ...string) *bufio.Scanner {
		t.Helper()
		cmd := exec.Command(peer, args...)
		cmd.Stderr = tWriter{t, args[0]}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				<-done
			}
		})
		return bufio.NewScanner(stdout)
	}

	sig := background("signal", "--listen", "127.0.0.1:0")
	if !sig.Scan() {
		t.Fatal("peer signal printed no URL")
	}
	url := strings.TrimSpace(sig.Text())
	checkAuthRefused(t, url)

	dir := t.TempDir()
	path := writeRandomFile(t, dir, 9, 100<<20)
	homeA, homeB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	run("--home", homeA, "init")
	run("--home", homeB, "init")
	var added []struct {
		CID string `json:"cid"`
	}
	out := run("--home", homeA, "add", "--json", path)
	if err := json.Unmarshal(out, &added); err != nil || len(added) != 1 {
		// a single object is fine too
		var one struct {
			CID string `json:"cid"`
		}
		if err := json.Unmarshal(out, &one); err != nil || one.CID == "" {
			t.Fatalf("peer add printed %s", out)
		}
		added = append(added[:0], one)
	}
	cid := added[0].CID

	// A synthetic model, stored as one collection.
	modelDir := filepath.Join(dir, "tiny")
	run("--home", homeA, "synth", "--preset", "tiny-moe", "--seed", "11", "-o", modelDir)
	var model []struct {
		CID string `json:"cid"`
	}
	out = run("--home", homeA, "add", "--json", modelDir)
	if err := json.Unmarshal(out, &model); err != nil || len(model) != 1 || !strings.HasPrefix(model[0].CID, "bagaybqab") {
		t.Fatalf("peer add of a model printed %s", out)
	}

	// A procedural model: only its manifest is on disk; A regenerates the
	// shards it serves.
	procDir := filepath.Join(dir, "proc")
	var proc struct {
		CID string `json:"cid"`
	}
	out = run("--home", homeA, "synth", "--json", "--preset", "tiny-moe", "--seed", "12", "--procedural", "-o", procDir)
	if err := json.Unmarshal(out, &proc); err != nil || proc.CID == "" {
		t.Fatalf("peer synth --procedural printed %s", out)
	}
	if ents, _ := os.ReadDir(procDir); len(ents) != 1 {
		t.Fatalf("synth --procedural wrote %d files; want the manifest only", len(ents))
	}

	srv := background("--home", homeA, "serve", "--signal", url, "--procedural", procDir)
	if !srv.Scan() || !strings.Contains(srv.Text(), "serving as") {
		t.Fatalf("peer serve printed %q", srv.Text())
	}
	got := filepath.Join(dir, "got")
	start := time.Now()
	run("--home", homeB, "get", cid, "-o", got, "--signal", url)
	t.Logf("peer get of 100 MiB took %v", time.Since(start))
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(got)
	if !bytes.Equal(a, b) {
		t.Fatal("peer get wrote different bytes")
	}

	// The model over the swarm, then mounted from B's store: the bytes are
	// the manifest then the shards, and the plan is the model's.
	gotModel := filepath.Join(dir, "got-model")
	run("--home", homeB, "get", model[0].CID, "-o", gotModel, "--signal", url)
	mb, _ := os.ReadFile(filepath.Join(modelDir, "manifest.json"))
	sb, _ := os.ReadFile(filepath.Join(modelDir, "shard-00000.bin"))
	if g, _ := os.ReadFile(gotModel); !bytes.Equal(g, append(mb, sb...)) {
		t.Fatal("the fetched model is not the manifest and shard written by synth")
	}
	// The procedural model, fetched: the same bytes a written model of
	// that seed has.
	gotProc := filepath.Join(dir, "got-proc")
	run("--home", homeB, "get", proc.CID, "-o", gotProc, "--signal", url)
	fullDir := filepath.Join(dir, "full")
	run("--home", homeB, "synth", "--preset", "tiny-moe", "--seed", "12", "-o", fullDir)
	mb, _ = os.ReadFile(filepath.Join(fullDir, "manifest.json"))
	sb, _ = os.ReadFile(filepath.Join(fullDir, "shard-00000.bin"))
	if g, _ := os.ReadFile(gotProc); !bytes.Equal(g, append(mb, sb...)) {
		t.Fatal("the procedural model served is not the model synth writes")
	}

	var plan struct {
		ModelID string `json:"modelId"`
		Experts int    `json:"experts"`
		Slots   int    `json:"vramExpertSlots"`
	}
	out = run("--home", homeB, "mount", "--json", "--vram", "2MiB", model[0].CID)
	if err := json.Unmarshal(out, &plan); err != nil || plan.ModelID != "synth/tiny-moe" || plan.Experts != 32 || plan.Slots != 6 {
		t.Fatalf("peer mount printed %s", out)
	}
}

// checkAuthRefused proves, against the `peer signal` process, that a client
// claiming an ID it cannot sign for is refused.
func checkAuthRefused(t *testing.T, url string) {
	t.Helper()
	ctx := ctxFor(t, 10*time.Second)
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	_, b, err := ws.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := signaling.DecodeMessage(b)
	if err != nil || ch.Type != signaling.TypeChallenge {
		t.Fatalf("challenge: %+v, %v", ch, err)
	}
	victim, _ := swarm.NewIdentity()
	mallory, _ := swarm.NewIdentity()
	sig, _ := mallory.Key.Sign(signaling.AuthPayload(ch.Nonce))
	auth, _ := (&signaling.Message{Type: signaling.TypeAuth, V: signaling.Version, ID: victim.ID.String(), Sig: sig}).Encode()
	if err := ws.Write(ctx, websocket.MessageText, auth); err != nil {
		t.Fatal(err)
	}
	_, b, err = ws.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := signaling.DecodeMessage(b); err != nil || m.Type != signaling.TypeError || m.Code != signaling.CodeAuthFailed {
		t.Fatalf("answer to a forged auth: %s", b)
	}
	if _, _, err := ws.Read(ctx); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("connection after a forged auth: %v; want close 1008", err)
	}
}
