package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// daemon is a `peer daemon` process.
type daemon struct {
	home string
	cmd  *exec.Cmd
	api  string
}

func startDaemon(t testing.TB, peer, home string, args ...string) *daemon {
	t.Helper()
	cmd := exec.Command(peer, append([]string{"--home", home, "daemon", "--api-listen", "127.0.0.1:0", "--log-level", "info"}, args...)...)
	stderr, _ := cmd.StderrPipe()
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{home: home, cmd: cmd}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			t.Log("daemon:", sc.Text())
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	t.Cleanup(func() { d.stop(t) })
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(filepath.Join(home, "api.addr")); err == nil {
			d.api = strings.TrimSpace(string(b))
			return d
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("the daemon wrote no api.addr")
	return nil
}

// stop sends SIGTERM and expects exit status 0.
func (d *daemon) stop(t testing.TB) {
	if d.cmd.ProcessState != nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("daemon exit: %v; want status 0", err)
		}
	case <-time.After(15 * time.Second):
		d.cmd.Process.Kill()
		<-done
		t.Error("the daemon did not exit within 15 s of SIGTERM")
	}
}

func (d *daemon) do(t testing.TB, method, path, token string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, d.api+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := apiClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// The daemon's API: status, peers, blobs, metrics and the status page read
// freely; fetch and pin need the token; a fetch through the API of one
// daemon brings a blob from another; SIGTERM exits 0.
func TestDaemonAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the peer binary")
	}
	t.Parallel() // beside TestSwarmChurn (doc.go)
	peer := peerBinary(t)
	dir := t.TempDir()
	path := writeRandomFile(t, dir, 31, 5<<20)
	seedHome, leechHome := filepath.Join(dir, "seed"), filepath.Join(dir, "leech")
	for _, h := range []string{seedHome, leechHome} {
		if out, err := exec.Command(peer, "--home", h, "init").CombinedOutput(); err != nil {
			t.Fatalf("peer init: %v %s", err, out)
		}
	}
	out, err := exec.Command(peer, "--home", seedHome, "add", "--json", "-q", path).Output()
	if err != nil {
		t.Fatal(err)
	}
	var added []struct {
		CID string `json:"cid"`
	}
	json.Unmarshal(out, &added)
	// The seeder embeds the signaling server; its URL is in its log, but
	// a fixed free port is simpler to pass on.
	sigAddr := freeAddr(t)
	seed := startDaemon(t, peer, seedHome, "--signal-listen", sigAddr)
	leech := startDaemon(t, peer, leechHome, "--signal", "ws://"+sigAddr)

	token, err := os.ReadFile(filepath.Join(leech.home, "api.token"))
	if err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(filepath.Join(leech.home, "api.token")); fi.Mode().Perm() != 0o600 {
		t.Errorf("api.token mode %v; want 0600", fi.Mode().Perm())
	}
	tok := strings.TrimSpace(string(token))
	// State changes need the token.
	if code, _ := leech.do(t, "POST", "/api/v1/fetch", "", map[string]string{"cid": added[0].CID}); code != http.StatusUnauthorized {
		t.Fatalf("fetch without the token: %d; want 401", code)
	}
	if code, _ := leech.do(t, "POST", "/api/v1/pin", "not-the-token", map[string]string{"cid": added[0].CID}); code != http.StatusUnauthorized {
		t.Fatalf("pin with a wrong token: %d; want 401", code)
	}
	// Fetch through the API, then watch the job.
	var code int
	var body []byte
	for i := 0; i < 100; i++ { // the daemons sign in within a few seconds
		if code, body = leech.do(t, "POST", "/api/v1/fetch", tok, map[string]string{"cid": added[0].CID}); code == http.StatusAccepted {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code != http.StatusAccepted {
		t.Fatalf("fetch: %d %s", code, body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body = leech.do(t, "GET", "/api/v1/fetch", "", nil)
		var jobs []struct {
			State, Error string
		}
		json.Unmarshal(body, &jobs)
		if len(jobs) > 0 && jobs[len(jobs)-1].State == "done" {
			break
		}
		if len(jobs) > 0 && jobs[len(jobs)-1].State == "failed" {
			// The first try may race the daemons' sign-in: try once more.
			if code, body = leech.do(t, "POST", "/api/v1/fetch", tok, map[string]string{"cid": added[0].CID}); code != http.StatusAccepted {
				t.Fatalf("fetch again: %d %s", code, body)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("fetch did not finish: %s", body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, body = leech.do(t, "POST", "/api/v1/pin", tok, map[string]string{"cid": added[0].CID}); code != http.StatusOK {
		t.Fatalf("pin: %d %s", code, body)
	}
	// Status, peers, blobs, metrics, page; and the CLI reads the same API.
	var st struct {
		Online bool
		Peers  int
		Blobs  int
		Pinned int
	}
	_, body = leech.do(t, "GET", "/api/v1/status", "", nil)
	json.Unmarshal(body, &st)
	if !st.Online || st.Peers < 1 || st.Blobs < 1 || st.Pinned < 1 {
		t.Fatalf("status %s", body)
	}
	out, err = exec.Command(peer, "--home", leech.home, "status", "--json").Output()
	if err != nil || !bytes.Contains(out, []byte(`"online": true`)) {
		t.Fatalf("peer status: %v %s", err, out)
	}
	out, err = exec.Command(peer, "--home", seed.home, "peers").Output()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		t.Fatalf("peer peers: %v %q", err, out)
	}
	// The seeder holds the blob; the leecher's daemon finds it.
	out, err = exec.Command(peer, "--home", leech.home, "providers", "--json", added[0].CID).Output()
	var provs []struct {
		Peer string
		Size int64
	}
	if err != nil || json.Unmarshal(out, &provs) != nil || len(provs) == 0 {
		t.Fatalf("peer providers: %v %s", err, out)
	}
	var seedSt struct{ Peer string }
	_, body = seed.do(t, "GET", "/api/v1/status", "", nil)
	json.Unmarshal(body, &seedSt)
	found := false
	for _, p := range provs {
		found = found || (p.Peer == seedSt.Peer && p.Size == 5<<20)
	}
	if !found {
		t.Fatalf("providers %s do not include the seeder %s with 5 MiB", out, seedSt.Peer)
	}
	if _, body = seed.do(t, "GET", "/metrics", "", nil); !bytes.Contains(body, []byte("rdrr_swarm_served_bytes_total")) || !bytes.Contains(body, []byte("rdrr_store_blobs 1")) {
		t.Fatalf("metrics:\n%s", body)
	}
	_, page := seed.do(t, "GET", "/", "", nil)
	var leechID struct{ Peer string }
	_, body = leech.do(t, "GET", "/api/v1/status", "", nil)
	json.Unmarshal(body, &leechID)
	// Its fetches done, the leecher holds nothing of its fetch budget.
	if _, m := leech.do(t, "GET", "/metrics", "", nil); !bytes.Contains(m, []byte("\nrdrr_swarm_fetching_bytes 0\n")) || !bytes.Contains(m, []byte("\nrdrr_swarm_fetch_requests 0\n")) {
		t.Fatalf("the leecher's metrics after its fetches:\n%s", m)
	}
	if !bytes.Contains(page, []byte(leechID.Peer)) || !bytes.Contains(page, []byte(`http-equiv="refresh"`)) {
		t.Fatalf("the status page does not list the leecher %s:\n%s", leechID.Peer, page)
	}
	seed.stop(t)
	leech.stop(t)
	if _, err := os.Stat(filepath.Join(leech.home, "api.addr")); err == nil {
		t.Error("api.addr left behind after exit")
	}
	// The daemon holds its store's lock; once it is gone the CLI reads
	// what the API fetched.
	got := filepath.Join(dir, "got")
	if out, err := exec.Command(peer, "--home", leech.home, "get", added[0].CID, "-o", got).CombinedOutput(); err != nil {
		t.Fatalf("peer get from the leecher's store: %v %s", err, out)
	}
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(got)
	if !bytes.Equal(a, b) {
		t.Fatal("the blob fetched through the API differs")
	}
}

// apiClient talks to the daemons' APIs: a daemon that stops answering
// (a deadlock) fails the call instead of hanging the test.
var apiClient = &http.Client{Timeout: time.Minute}

// freeAddr returns a loopback address with a port free right now.
func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// signalProcess runs `peer signal` on a free loopback port until the test
// ends and returns its URL and stop, which interrupts it sooner and
// reports whether it exited within 10 s.
func signalProcess(t testing.TB, peer string) (url string, stop func() bool) {
	addr := freeAddr(t)
	sig := exec.Command(peer, "signal", "--listen", addr)
	sig.Stderr = tWriter{t, "signal"}
	if err := sig.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { sig.Wait(); close(done) }()
	t.Cleanup(func() { sig.Process.Kill(); <-done })
	return "ws://" + addr, func() bool {
		sig.Process.Signal(os.Interrupt)
		select {
		case <-done:
			return true
		case <-time.After(10 * time.Second):
			return false
		}
	}
}

// Generation pages the experts of a model that only another process holds:
// the generating peer has nothing but the model's CID, fetches the
// manifest and pages each expert as a verified range over WebRTC, and its
// tokens are those of a run with the whole model stored.
func TestGenerateOverSwarm(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the peer binary")
	}
	t.Parallel() // beside TestSwarmChurn (doc.go)
	peer := peerBinary(t)
	dir := t.TempDir()
	run := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command(peer, args...).Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				t.Fatalf("peer %s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
			}
			t.Fatal(err)
		}
		return out
	}
	seedHome, localHome, remoteHome := filepath.Join(dir, "seed"), filepath.Join(dir, "local"), filepath.Join(dir, "remote")
	for _, h := range []string{seedHome, localHome, remoteHome} {
		run("--home", h, "init")
	}
	model := filepath.Join(dir, "tiny")
	run("--home", seedHome, "synth", "-q", "--preset", "tiny-moe", "--seed", "5", "-o", model)
	var added []struct{ CID string }
	json.Unmarshal(run("--home", seedHome, "add", "-q", "--json", model), &added)
	run("--home", localHome, "add", "-q", model)
	type result struct {
		Tokens []int
		Levels []struct {
			Level        string
			Hits, Misses int
		}
	}
	var local, remote result
	json.Unmarshal(run("--home", localHome, "generate", added[0].CID, "--prompt", "paged", "--max-tokens", "12", "--ram", "2MiB", "--json"), &local)
	sigAddr := freeAddr(t)
	seed := startDaemon(t, peer, seedHome, "--signal-listen", sigAddr)
	waitFor(t, "sign-in of the seeder to its own signaling server", 30*time.Second, func() bool { return seed.status(t).Online })
	json.Unmarshal(run("--home", remoteHome, "generate", added[0].CID, "--prompt", "paged", "--max-tokens", "12", "--ram", "2MiB", "--json", "--signal", "ws://"+sigAddr), &remote)
	if len(local.Tokens) != 12 || !slicesEqual(local.Tokens, remote.Tokens) {
		t.Fatalf("tokens over the swarm %v; stored %v", remote.Tokens, local.Tokens)
	}
	var swarmHits int
	for _, l := range remote.Levels {
		if l.Level == "swarm" {
			swarmHits = l.Hits
		}
		if l.Level == "disk" && l.Hits > 0 {
			t.Fatalf("the remote peer read %d keys from its own disk; it holds nothing", l.Hits)
		}
	}
	if swarmHits == 0 {
		t.Fatal("no key came from the swarm")
	}
	t.Logf("%d keys paged over the swarm; tokens %v", swarmHits, remote.Tokens)
}

func slicesEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
