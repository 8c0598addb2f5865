package kernels

import (
	"errors"
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
	Publish(a, s) // republished: the same record again is a duplicate
	// Another record under a used nonce is a replay.
	e := sample(id)
	e.Seed++
	Publish(a, signed(t, e, key))
	a.Publish(Topic(testClass.Coarse()), []byte("garbage"))

	st := B.Stats()
	if st.Accepted != 1 || len(rb.Endorsements()) != 1 || st.Dropped[ErrSignature.Error()] != 1 || st.Duplicate != 1 ||
		st.Dropped[ErrReplay.Error()] != 1 || st.Dropped[ErrSchema.Error()] != 1 {
		t.Fatalf("B: %+v, stored %d", st, len(rb.Endorsements()))
	}
	if st := C.Stats(); st.Accepted != 0 || len(st.Dropped) != 0 {
		t.Fatalf("C heard another class's topic: %+v", st)
	}
	if st := D.Stats(); st.Accepted != 0 || st.Dropped[ErrClass.Error()] != 3 {
		t.Fatalf("D: %+v", st)
	}
}

// Many publishers at once, each record sent twice (run with -race).
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
	if st.Accepted != peers*each || st.Duplicate != peers*each || len(st.Dropped) != 0 || len(r.Endorsements()) != peers*each {
		t.Fatalf("%+v; stored %d", st, len(r.Endorsements()))
	}
	c := (Policy{Quorum: peers}).Candidates(r.Endorsements(), testClass, "attention_decode", now())
	if len(c) != 1 || len(c[0].Endorsers) != peers {
		t.Fatalf("candidates %+v", c)
	}
}

// Relayable: what a gossip validator forwards. Records of the topic's
// coarse class are forwarded whatever their driver or ABI (another
// peer's business); forged, expired, malformed and other-class records
// are not.
func TestRelayable(t *testing.T) {
	key, id := testKey(t, 1)
	now := t0.Add(time.Hour)
	coarse := testClass.Coarse()
	good := signed(t, sample(id), key)
	otherDriver := sample(id)
	otherDriver.Class = coarse + "/999.1"
	otherABI := sample(id)
	otherABI.ABI = 99
	forged := signed(t, sample(id), key)
	forged.Sig[3] ^= 1
	for _, c := range []struct {
		name string
		data []byte
		at   time.Time
		want error
	}{
		{"good", good.Encode(), now, nil},
		{"another driver", signed(t, otherDriver, key).Encode(), now, nil},
		{"another ABI", signed(t, otherABI, key).Encode(), now, nil},
		{"forged", forged.Encode(), now, ErrSignature},
		{"expired", good.Encode(), t0.Add(31 * 24 * time.Hour), ErrExpired},
		{"malformed", []byte(`{"endorsement":1}`), now, ErrSchema},
	} {
		err := Relayable(c.data, coarse, c.at)
		if (c.want == nil) != (err == nil) || (c.want != nil && !errors.Is(err, c.want)) {
			t.Errorf("%s: %v; want %v", c.name, err, c.want)
		}
	}
	if err := Relayable(good.Encode(), otherClass.Coarse(), now); !errors.Is(err, ErrClass) {
		t.Errorf("on another class's topic: %v; want ErrClass", err)
	}
}
