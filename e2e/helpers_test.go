package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
	"github.com/rdrr/peer/signaling"
	"github.com/rdrr/peer/signaling/signalingtest"
	"github.com/rdrr/peer/swarm"
)

// child is this test binary running as another process in a role.
type child struct {
	t     testing.TB
	role  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // stdout, line by line; closed at EOF
	done  chan struct{}
}

// startChild starts a child in role with env (on top of ours).
func startChild(t testing.TB, role string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envRole+"="+role), env...)
	cmd.Stderr = tWriter{t, role}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{t: t, role: role, cmd: cmd, stdin: stdin, lines: make(chan string, 1024), done: make(chan struct{})}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			select {
			case c.lines <- sc.Text():
			default: // the test stopped listening (progress lines): drop
			}
		}
	}()
	go func() {
		cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() { c.stop(5 * time.Second) })
	return c
}

// expect returns the rest of the first line that starts with prefix+" ".
// An "error" line fails the test.
func (c *child) expect(prefix string, timeout time.Duration) string {
	c.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("%s exited before %q", c.role, prefix)
			}
			if rest, found := strings.CutPrefix(l, "error "); found {
				c.t.Fatalf("%s: %s", c.role, rest)
			}
			if rest, found := strings.CutPrefix(l, prefix+" "); found {
				return rest
			}
		case <-deadline:
			c.t.Fatalf("%s: no %q line in %v", c.role, prefix, timeout)
		}
	}
}

// stop asks the child to end (stdin closed), and kills it after grace.
func (c *child) stop(grace time.Duration) {
	c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(grace):
		c.cmd.Process.Kill()
		<-c.done
	}
}

// kill ends the child with SIGKILL, as a crash would.
func (c *child) kill() {
	c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

type tWriter struct {
	t      testing.TB
	prefix string
}

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(w.prefix + ": " + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startSignal runs a signaling server on 127.0.0.1 for the test.
func startSignal(t testing.TB) string {
	t.Helper()
	return signalingtest.Start(t, signaling.Config{})
}

// writeRandomFile writes size deterministic pseudo-random bytes to a file.
func writeRandomFile(t testing.TB, dir string, seed uint64, size int64) string {
	t.Helper()
	path := filepath.Join(dir, "file")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, ^seed))
	buf := make([]byte, 8<<20)
	for left := size; left > 0; {
		for i := 0; i < len(buf); i += 8 {
			v := r.Uint64()
			for j := 0; j < 8; j++ {
				buf[i+j] = byte(v >> (8 * j))
			}
		}
		n := min(left, int64(len(buf)))
		if _, err := f.Write(buf[:n]); err != nil {
			t.Fatal(err)
		}
		left -= n
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// newHome makes a peer home holding the file at path; it returns the
// home and the file's CID. The store is closed again.
func newHome(t testing.TB, path string) (string, cas.CID) {
	t.Helper()
	home := t.TempDir()
	st, err := cas.Open(home, cas.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if path == "" {
		return home, cas.CID{}
	}
	inf, err := st.AddFile(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return home, inf.CID
}

// localNode is a node in this process, with its own store.
type localNode struct {
	*swarm.Node
	st  *cas.Store
	sig *signaling.Client
}

func newLocalNode(t testing.TB, url, home, topic string) *localNode {
	t.Helper()
	return newLocalNodeWith(t, url, home, topic, nil)
}

// newLocalNodeWith is newLocalNode with tweak applied to the node's
// configuration.
func newLocalNodeWith(t testing.TB, url, home, topic string, tweak func(*swarm.Config)) *localNode {
	t.Helper()
	st, err := cas.Open(home, cas.Options{})
	if err != nil {
		t.Fatal(err)
	}
	id, err := swarm.NewIdentity()
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(tWriter{t, "local"}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cfg := swarm.Config{Identity: id, Source: st, Loopback: true, Logger: log}
	if tweak != nil {
		tweak(&cfg)
	}
	n, err := swarm.NewNode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sc, err := signaling.Dial(ctx, url, signaling.ClientConfig{Key: id.Key})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(sc); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Join(ctx, topic); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		sc.Close()
		st.Close()
	})
	return &localNode{Node: n, st: st, sig: sc}
}

// sameFile compares the file c in st with the file at path.
func sameFile(t testing.TB, st *cas.Store, c cas.CID, path string) bool {
	t.Helper()
	fr, err := st.OpenFile(c)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a, b := make([]byte, 4<<20), make([]byte, 4<<20)
	for off := int64(0); ; off += int64(len(a)) {
		n1, err1 := fr.ReadAt(a, off)
		n2, _ := io.ReadFull(f, b)
		if n1 != n2 || string(a[:n1]) != string(b[:n2]) {
			return false
		}
		if err1 != nil || n1 < len(a) {
			return n1 == n2
		}
	}
}

// initHomes runs `peer init` on a home in dir for each name, and returns
// their paths in order.
func initHomes(t testing.TB, peer, dir string, names ...string) []string {
	t.Helper()
	homes := make([]string, len(names))
	for i, name := range names {
		homes[i] = filepath.Join(dir, name)
		if out, err := exec.Command(peer, "--home", homes[i], "init").CombinedOutput(); err != nil {
			t.Fatalf("peer init: %v %s", err, out)
		}
	}
	return homes
}

// peerAdd runs `peer add` of one file into home and returns its CID.
func peerAdd(t testing.TB, peer, home, path string) cas.CID {
	t.Helper()
	out, err := exec.Command(peer, "--home", home, "add", "--json", "-q", path).Output()
	if err != nil {
		t.Fatalf("peer add: %v", err)
	}
	var added []struct{ CID string }
	json.Unmarshal(out, &added)
	if len(added) != 1 {
		t.Fatalf("peer add printed %s", out)
	}
	c, err := cas.ParseCID(added[0].CID)
	if err != nil {
		t.Fatalf("peer add printed %s: %v", out, err)
	}
	return c
}
