package e2e

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// `peer get -o` writes a collection's shards into the output as the fetch
// verifies them, and what the store held before the fetch from verified
// reads of it: a new file, a file whose first shard the store held, a
// repeated shard, /dev/null and a pipe all get the file byte-exact, and
// --json says how much came as it was verified.
func TestGetWritesPiecesAsTheyArrive(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the peer binary")
	}
	t.Parallel() // beside TestSwarmChurn (doc.go)
	peer := peerBinary(t)
	dir := t.TempDir()
	// The file is [A | A | B]: 64 MiB shards, the first one repeated, and
	// a short last one that does not end on a group.
	r := rand.New(rand.NewPCG(5, 6))
	a := make([]byte, 64<<20)
	for i := 0; i < len(a); i += 8 {
		v := r.Uint64()
		for j := range 8 {
			a[i+j] = byte(v >> (8 * j))
		}
	}
	b := a[1<<20 : 1<<20+(1<<20)+777]
	want := append(append(append([]byte(nil), a...), a...), b...)
	file, shardA := filepath.Join(dir, "file"), filepath.Join(dir, "a")
	if err := os.WriteFile(file, want, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(shardA, a, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(peer, args...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("peer %v: %v\n%s", args, err, stderr.Bytes())
		}
		return out
	}
	seedHome := filepath.Join(dir, "seed")
	run("--home", seedHome, "init")
	var added []struct{ CID string }
	json.Unmarshal(run("--home", seedHome, "add", "--json", "-q", file), &added)
	if len(added) != 1 {
		t.Fatal("peer add printed no CID")
	}
	cid := added[0].CID

	for _, tc := range []struct {
		name     string
		held     bool   // the leecher holds shard A before the fetch
		out      string // "" a new file
		streamed int64  // what --json must say came as it was verified
	}{
		{name: "new file", streamed: int64(len(want))},
		{name: "first shard held", held: true, streamed: int64(len(b))},
		{name: "device", out: os.DevNull, streamed: int64(len(want))},
		{name: "pipe", out: "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A seeder process for each case, stopped at its end: the
			// leecher of a case before, exited, would stay a provider in
			// its DHT, and a fetch that meets a dead provider spends ~5 s
			// on it (swarm/BENCHMARKS.md: open work), 15 s of this test.
			sigAddr := freeAddr(t)
			seed := startDaemon(t, peer, seedHome, "--signal-listen", sigAddr, "--signal", "ws://"+sigAddr)
			waitFor(t, "seeder online", 30*time.Second, func() bool { return seed.status(t).Online })
			home := filepath.Join(t.TempDir(), "h")
			run("--home", home, "init")
			if tc.held {
				run("--home", home, "add", "-q", shardA)
			}
			out := tc.out
			if out == "" {
				out = filepath.Join(t.TempDir(), "got")
			}
			got := run("--home", home, "--json", "get", cid, "-o", out, "--signal", "ws://"+sigAddr)
			switch tc.out {
			case "-":
				if !bytes.Equal(got, want) {
					t.Fatalf("get -o - wrote %d bytes, not the file's %d", len(got), len(want))
				}
				return
			case "":
				if b, _ := os.ReadFile(out); !bytes.Equal(b, want) {
					t.Fatalf("the output file holds %d bytes, not the file's %d", len(b), len(want))
				}
			}
			var res struct{ Size, Streamed int64 }
			if err := json.Unmarshal(got, &res); err != nil {
				t.Fatalf("get --json printed %q: %v", got, err)
			}
			if res.Size != int64(len(want)) || res.Streamed != tc.streamed {
				t.Fatalf("get --json: size %d, streamed %d; want %d, %d", res.Size, res.Streamed, len(want), tc.streamed)
			}
		})
	}
}
