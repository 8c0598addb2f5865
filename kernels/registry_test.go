package kernels

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rdrr/peer/cas"
)

func openRegistry(t *testing.T, dir string, now time.Time) *Registry {
	t.Helper()
	r, err := OpenRegistry(dir, at(now))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRegistryRollback(t *testing.T) {
	dir := t.TempDir()
	r := openRegistry(t, dir, t0)
	v1, v2 := cas.Sum([]byte("v1")).String(), cas.Sum([]byte("v2")).String()
	if r.Active("rmsnorm") != Builtin || r.Previous("rmsnorm") != "" {
		t.Fatal("a fresh registry is not on the builtin")
	}
	if _, err := r.Rollback("rmsnorm"); err == nil {
		t.Fatal("rollback with nothing before succeeded")
	}
	for _, v := range []string{v1, v2} {
		if err := r.Use("rmsnorm", v); err != nil {
			t.Fatal(err)
		}
	}
	// Reopened: the state survived.
	r = openRegistry(t, dir, t0)
	if got := r.Active("rmsnorm"); got != v2 {
		t.Fatalf("active %s; want %s", got, v2)
	}
	if prev, err := r.Rollback("rmsnorm"); err != nil || prev != v1 || r.Active("rmsnorm") != v1 {
		t.Fatalf("rollback: %s %v; active %s", prev, err, r.Active("rmsnorm"))
	}
	// Rolling back twice goes forward again (one step of history).
	if prev, _ := r.Rollback("rmsnorm"); prev != v2 {
		t.Fatalf("second rollback gave %s; want %s", prev, v2)
	}
	r = openRegistry(t, dir, t0)
	if r.Active("rmsnorm") != v2 || r.Previous("rmsnorm") != v1 {
		t.Fatalf("after reopen: active %s previous %s", r.Active("rmsnorm"), r.Previous("rmsnorm"))
	}
	// Back to the builtin, and rollback from it.
	if err := r.Use("rmsnorm", Builtin); err != nil {
		t.Fatal(err)
	}
	if prev, _ := r.Rollback("rmsnorm"); prev != v2 {
		t.Fatalf("rollback from builtin gave %s", prev)
	}
	if r.ActiveAll()["rmsnorm"] != v2 || r.ActiveAll()["softmax"] != Builtin {
		t.Fatalf("ActiveAll %v", r.ActiveAll())
	}
	if _, err := r.Rollback("attention_decode"); err == nil {
		t.Fatal("rollback of an op never changed succeeded")
	}
}

func TestRegistryUseChecks(t *testing.T) {
	r := openRegistry(t, t.TempDir(), t0)
	v := cas.Sum([]byte("v1"))
	for _, tc := range []struct{ op, variant string }{
		{"nope", v.String()},
		{"rmsnorm", "latest"},
		{"rmsnorm", v.Hex()}, // not the canonical spelling
		{"rmsnorm", cas.CollectionCID(v.Digest()).String()},
		{"rmsnorm", ""},
	} {
		if err := r.Use(tc.op, tc.variant); err == nil {
			t.Errorf("Use(%q, %q) succeeded", tc.op, tc.variant)
		}
	}
	if r.Active("rmsnorm") != Builtin {
		t.Fatal("a refused Use changed the registry")
	}
}

// A crash leaves the old or the new file (atomicfile); leftovers of an
// interrupted write are ignored; a damaged active.json is an error, not a
// silent reset to the built-ins.
func TestRegistryFiles(t *testing.T) {
	dir := t.TempDir()
	r := openRegistry(t, dir, t0)
	v1 := cas.Sum([]byte("v1")).String()
	if err := r.Use("softmax", v1); err != nil {
		t.Fatal(err)
	}
	// An interrupted write's temporary file.
	if err := os.WriteFile(filepath.Join(dir, ".active.json.tmp123"), []byte(`{"active":{"softmax":"x`), 0o644); err != nil {
		t.Fatal(err)
	}
	if r = openRegistry(t, dir, t0); r.Active("softmax") != v1 {
		t.Fatalf("active %s after a stray temp file", r.Active("softmax"))
	}
	path := filepath.Join(dir, activeFile)
	good, _ := os.ReadFile(path)
	for name, bad := range map[string][]byte{
		"truncated":     good[:len(good)/2],
		"unknown op":    bytes.Replace(good, []byte(`"softmax"`), []byte(`"evil"`), 1),
		"bad variant":   bytes.Replace(good, []byte(v1), []byte("../../etc"), 1),
		"unknown field": bytes.Replace(good, []byte(`"active"`), []byte(`"x":1,"active"`), 1),
		"huge":          bytes.Repeat([]byte(" "), maxActiveBytes+1),
	} {
		if err := os.WriteFile(path, bad, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenRegistry(dir, at(t0)); !errors.Is(err, ErrRegistry) {
			t.Errorf("%s: %v; want ErrRegistry", name, err)
		}
	}
}

func TestRegistryEndorsements(t *testing.T) {
	dir := t.TempDir()
	r := openRegistry(t, dir, t0)
	key, id := testKey(t, 1)
	s := signed(t, sample(id), key)
	if added, err := r.AddEndorsement(s); !added || err != nil {
		t.Fatalf("add: %v %v", added, err)
	}
	if added, _ := r.AddEndorsement(s); added {
		t.Fatal("the same record was added twice")
	}
	e2 := sample(id)
	e2.Nonce = 8
	r.AddEndorsement(signed(t, e2, key)) // within FlushInterval: not on disk yet
	if n := len(openRegistry(t, dir, t0).Endorsements()); n != 1 {
		t.Fatalf("before Flush, the disk holds %d; want 1", n)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r2 := openRegistry(t, dir, t0)
	if n := len(r2.Endorsements()); n != 2 || r2.Dropped() != 0 {
		t.Fatalf("reopened: %d records, %d dropped; want 2, 0", n, r2.Dropped())
	}
	if got := r2.Records(); len(got) != 2 || !bytes.Equal(got[0], s.Encode()) {
		t.Fatalf("records %q", got)
	}
	// Expired records are not returned, and are dropped on open.
	late := t0.Add(31 * 24 * time.Hour)
	if n := len(openRegistry(t, dir, late).Endorsements()); n != 0 {
		t.Fatalf("%d records after expiry", n)
	}
	if d := openRegistry(t, dir, late).Dropped(); d != 2 {
		t.Fatalf("dropped %d expired on open; want 2", d)
	}
	// A tampered record on disk is dropped, the others kept.
	path := filepath.Join(dir, endorsementsFile)
	b, _ := os.ReadFile(path)
	b = bytes.Replace(b, []byte(`"nonce":8`), []byte(`"nonce":9`), 1)
	os.WriteFile(path, b, 0o644)
	r3 := openRegistry(t, dir, t0)
	if n, d := len(r3.Endorsements()), r3.Dropped(); n != 1 || d != 1 {
		t.Fatalf("tampered: %d kept, %d dropped; want 1, 1", n, d)
	}
	// A damaged cache starts empty rather than stopping the peer.
	os.WriteFile(path, b[:len(b)/2], 0o644)
	if r4 := openRegistry(t, dir, t0); len(r4.Endorsements()) != 0 || r4.Dropped() != 1 {
		t.Fatalf("damaged cache: %d kept, %d dropped", len(r4.Endorsements()), r4.Dropped())
	}
}

// One peer cannot fill the store: it keeps its newest
// MaxEndorsementsPerPeer records.
func TestRegistryPerPeerBound(t *testing.T) {
	r := openRegistry(t, t.TempDir(), t0)
	key, id := testKey(t, 1)
	key2, id2 := testKey(t, 2)
	r.AddEndorsement(signed(t, sample(id2), key2))
	for i := range MaxEndorsementsPerPeer + 10 {
		e := sample(id)
		e.Nonce = uint64(100 + i)
		if _, err := r.AddEndorsement(signed(t, e, key)); err != nil {
			t.Fatal(err)
		}
	}
	es := r.Endorsements()
	if len(es) != MaxEndorsementsPerPeer+1 {
		t.Fatalf("%d stored; want %d", len(es), MaxEndorsementsPerPeer+1)
	}
	if es[0].Peer != id2.String() || es[1].Nonce != 110 {
		t.Fatalf("kept the wrong ones: first %s nonce %d", es[0].Peer, es[1].Nonce)
	}
}
