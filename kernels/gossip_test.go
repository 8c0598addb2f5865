package kernels

import (
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Gossip by class: A endorses; B (same class) verifies and stores it; C
// (another class) is on another topic and hears nothing; D (another
// class, but subscribed to A's topic) drops it as ErrClass. Forged and
// replayed records are dropped and counted by reason.
func TestGossipByClass(t *testing.T) {
	key, id := testKey(t, 1)
	now := at(t0.Add(time.Hour))
	net := &LocalNetwork{}
	a := net.Join(id)
	rb, err := OpenRegistry(filepath.Join(t.TempDir(), "b"), now)
	if err != nil {
		t.Fatal(err)
	}
	B := &Receiver{V: &Verifier{Class: testClass, ABI: ABIVersions(), Now: now}, Registry: rb}
	C := &Receiver{V: &Verifier{Class: otherClass, ABI: ABIVersions(), Now: now}}
	D := &Receiver{V: &Verifier{Class: otherClass, ABI: ABIVersions(), Now: now}}
	B.Subscribe(net.Join(idN(t, 1)))
	C.Subscribe(net.Join(idN(t, 2)))
	net.Join(idN(t, 3)).Subscribe(Topic(testClass.Coarse()), D.Handle)

	s := signed(t, sample(id), key)
	if err := Publish(a, s); err != nil {
		t.Fatal(err)
	}
	bad := *s
	bad.Sig = append([]byte(nil), s.Sig...)
	bad.Sig[0] ^= 1
	Publish(a, &bad)
	Publish(a, s) // replayed
	a.Publish(Topic(testClass.Coarse()), []byte("garbage"))

	st := B.Stats()
	if st.Accepted != 1 || len(rb.Endorsements()) != 1 || st.Dropped[ErrSignature.Error()] != 1 ||
		st.Dropped[ErrReplay.Error()] != 1 || st.Dropped[ErrSchema.Error()] != 1 {
		t.Fatalf("B: %+v, stored %d", st, len(rb.Endorsements()))
	}
	if st := C.Stats(); st.Accepted != 0 || len(st.Dropped) != 0 {
		t.Fatalf("C heard another class's topic: %+v", st)
	}
	if st := D.Stats(); st.Accepted != 0 || st.Dropped[ErrClass.Error()] != 2 {
		t.Fatalf("D: %+v", st)
	}
}

// Many publishers at once (run with -race).
func TestGossipConcurrent(t *testing.T) {
	now := at(t0.Add(time.Hour))
	net := &LocalNetwork{}
	r, err := OpenRegistry(t.TempDir(), now)
	if err != nil {
		t.Fatal(err)
	}
	recv := &Receiver{V: &Verifier{Class: testClass, ABI: ABIVersions(), Now: now}, Registry: r}
	recv.Subscribe(net.Join(idN(t, 0)))
	const peers, each = 8, 5
	var wg sync.WaitGroup
	for p := range peers {
		key, id := keyN(t, 100+p)
		g := net.Join(id)
		var recs []*SignedEndorsement
		for i := range each {
			e := sample(id)
			e.Nonce = uint64(i)
			recs = append(recs, signed(t, e, key))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, s := range recs {
				Publish(g, s)
				Publish(g, s)
			}
		}()
	}
	wg.Wait()
	st := recv.Stats()
	if st.Accepted != peers*each || st.Dropped[ErrReplay.Error()] != peers*each || len(r.Endorsements()) != peers*each {
		t.Fatalf("%+v; stored %d", st, len(r.Endorsements()))
	}
	c := (Policy{Quorum: peers}).Candidates(r.Endorsements(), testClass, "attention_decode", now())
	if len(c) != 1 || len(c[0].Endorsers) != peers {
		t.Fatalf("candidates %+v", c)
	}
}
