package main

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// run executes the CLI in-process with home as the peer home.
func run(t *testing.T, home string, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(append([]string{"--home", home}, args...))
	err := cmd.Execute()
	if err != nil {
		t.Logf("peer %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), err
}

// tinyProcedural makes a home and a procedural tiny-moe model and
// returns the home and the model's manifest path.
func tinyProcedural(t *testing.T) (home, manifest string) {
	t.Helper()
	home = filepath.Join(t.TempDir(), "home")
	dir := filepath.Join(t.TempDir(), "tiny")
	mustRun(t, home, "synth", "-q", "--preset", "tiny-moe", "--procedural", "-o", dir)
	return home, filepath.Join(dir, "manifest.json")
}

func mustRun(t *testing.T, home string, args ...string) string {
	t.Helper()
	out, err := run(t, home, args...)
	if err != nil {
		t.Fatalf("peer %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// mustRunJSON runs peer with args (which ask for --json) and decodes
// its output into v.
func mustRunJSON(t *testing.T, home string, v any, args ...string) {
	t.Helper()
	out := mustRun(t, home, args...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("peer %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func TestInitIsIdempotentAndKeepsKey(t *testing.T) {
	home := filepath.Join(t.TempDir(), "home")
	var first struct {
		PeerID  string `json:"peer_id"`
		Created bool   `json:"created"`
	}
	json.Unmarshal([]byte(mustRun(t, home, "init", "--json")), &first)
	if !first.Created || !strings.HasPrefix(first.PeerID, "12D3KooW") {
		t.Fatalf("first init: %+v", first)
	}
	key := filepath.Join(home, "identity.key")
	fi, err := os.Stat(key)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("identity.key: %v mode %v; want 0600", err, fi.Mode().Perm())
	}
	before, _ := os.ReadFile(key)
	var second struct {
		PeerID  string `json:"peer_id"`
		Created bool   `json:"created"`
	}
	json.Unmarshal([]byte(mustRun(t, home, "init", "--json")), &second)
	after, _ := os.ReadFile(key)
	if second.Created || second.PeerID != first.PeerID || !bytes.Equal(before, after) {
		t.Fatalf("second init changed the identity: %+v", second)
	}
	for _, d := range []string{"blobs", "outboards", "partial", "index.db", "config.toml"} {
		if _, err := os.Stat(filepath.Join(home, d)); err != nil {
			t.Errorf("home lacks %s: %v", d, err)
		}
	}
}

func TestAddGetCatScrub(t *testing.T) {
	home := t.TempDir()
	dir := t.TempDir()
	big := make([]byte, 64<<20+12345)
	rand.Read(big)
	bigPath := filepath.Join(dir, "big.bin")
	os.WriteFile(bigPath, big, 0o644)
	smallPath := filepath.Join(dir, "small.txt")
	os.WriteFile(smallPath, []byte("0123456789"), 0o644)

	var added []struct {
		CID        string `json:"cid"`
		Size       int64  `json:"size"`
		Collection bool   `json:"collection"`
		Shards     int    `json:"shards"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, home, "add", "--json", bigPath, smallPath)), &added); err != nil {
		t.Fatal(err)
	}
	if len(added) != 2 || !added[0].Collection || added[0].Shards != 2 || added[0].Size != int64(len(big)) {
		t.Fatalf("add: %+v", added)
	}
	out := filepath.Join(dir, "out.bin")
	mustRun(t, home, "get", added[0].CID, "-o", out)
	if got, _ := os.ReadFile(out); !bytes.Equal(got, big) {
		t.Fatal("get of a collection differs from the added file")
	}
	if got := mustRun(t, home, "cat", added[1].CID, "--offset", "3", "--length", "4"); got != "3456" {
		t.Fatalf("cat range = %q; want 3456", got)
	}
	var ls []struct {
		CID string `json:"cid"`
	}
	json.Unmarshal([]byte(mustRun(t, home, "ls", "--json", "--pinned")), &ls)
	if len(ls) != 2 {
		t.Fatalf("ls --pinned: %d blobs; want 2 (the collection and the small file)", len(ls))
	}
	if _, err := run(t, home, "cat", "bafkr4inotacid"); err == nil {
		t.Fatal("cat of a malformed CID succeeded")
	}

	// Flip a byte of the small blob on disk: cat refuses, scrub reports it
	// and exits with status 3.
	hexName := mustRun(t, home, "stat", "--json", added[1].CID)
	var st struct{ CID string }
	json.Unmarshal([]byte(hexName), &st)
	matches, _ := filepath.Glob(filepath.Join(home, "blobs", "*", "*"))
	for _, m := range matches {
		if b, _ := os.ReadFile(m); string(b) == "0123456789" {
			os.WriteFile(m, []byte("0123456789"[:9]+"X"), 0o644)
		}
	}
	if _, err := run(t, home, "cat", added[1].CID); err == nil || !strings.Contains(err.Error(), added[1].CID) {
		t.Fatalf("cat of a corrupt blob: %v; want an error naming the CID", err)
	}
	_, err := run(t, home, "scrub", "--json")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 3 {
		t.Fatalf("scrub of a corrupt store: %v; want exit status 3", err)
	}
}

// Flags win over RDRR_* variables, which win over config.toml.
func TestConfigLayering(t *testing.T) {
	home := t.TempDir()
	mustRun(t, home, "init")
	os.WriteFile(filepath.Join(home, "config.toml"), []byte("log_level = \"bogus-from-file\"\n"), 0o644)
	if _, err := run(t, home, "ls"); err == nil || !strings.Contains(err.Error(), "bogus-from-file") {
		t.Fatalf("config.toml value not applied: %v", err)
	}
	t.Setenv("RDRR_LOG_LEVEL", "bogus-from-env")
	if _, err := run(t, home, "ls"); err == nil || !strings.Contains(err.Error(), "bogus-from-env") {
		t.Fatalf("RDRR_LOG_LEVEL did not win over config.toml: %v", err)
	}
	if _, err := run(t, home, "ls", "--log-level", "warn"); err != nil {
		t.Fatalf("flag did not win: %v", err)
	}
}
